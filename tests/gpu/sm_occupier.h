// Holds every SM of a device with resident thread blocks that do nothing, so that work issued meanwhile on other
// streams can only run where no SM is needed: a copy engine. The GPU tests and bench_cuda_collectives use it to show
// that the device-direct all-gather (device-to-device cudaMemcpyAsync) runs on copy engines and uses no SM: it
// finishes while every SM is held. This header names no CUDA type beyond the runtime API's.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

namespace chorus::gputest {

class SmOccupier {
 public:
  // Launches, on a stream of its own on the current device, one kernel of as many 1024-thread blocks as the device
  // holds at once (every thread slot of every SM), each waiting on a flag in pinned host memory; then waits on the
  // host (at most `wait_ms`) until every block reports itself resident. ok() says whether that happened; why()
  // says what went wrong otherwise. The kernel ends by itself after `max_ms` should release() never come.
  explicit SmOccupier(int wait_ms = 10000, int max_ms = 60000);
  ~SmOccupier();  // releases the blocks and waits for the kernel to end
  SmOccupier(const SmOccupier&) = delete;
  SmOccupier& operator=(const SmOccupier&) = delete;

  bool ok() const { return why_.empty(); }
  const std::string& why() const { return why_; }
  int blocks() const { return blocks_; }
  int sms() const { return sms_; }
  // Whether the kernel is still running (every SM still held), asked without waiting.
  bool holding() const;
  // Lets every block end; waits for the kernel.
  void release();

 private:
  cudaStream_t stream_ = nullptr;
  uint32_t* flags_ = nullptr;  // pinned, mapped: [0] release, [1 + b] block b resident
  int blocks_ = 0, sms_ = 0;
  bool released_ = false;
  std::string why_;
};

}  // namespace chorus::gputest
