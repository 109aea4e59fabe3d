// Helpers of the GPU suite (chorus_gpu_tests): skipping without a device, device buffers, and comparison of results
// that must equal the CPU reference bit for bit. Nothing here touches CUDA before a test body runs (no global
// constructors), so listing the tests (gtest_discover_tests) works on a machine without a GPU.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace chorus::gputest {

// Empty when a CUDA device is usable, else the reason ("no CUDA device (cudaGetDeviceCount: ...)").
inline std::string no_device_reason() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    return std::string("no CUDA device (cudaGetDeviceCount: ") + cudaGetErrorName(err) + ": " +
           cudaGetErrorString(err) + ")";
  }
  if (n == 0) return "no CUDA device (cudaGetDeviceCount: 0 devices)";
  return {};
}

// First statement of every test that needs a device.
#define CHORUS_REQUIRE_CUDA_DEVICE()                                   \
  do {                                                                 \
    const std::string reason_ = ::chorus::gputest::no_device_reason(); \
    if (!reason_.empty()) GTEST_SKIP() << reason_;                     \
  } while (0)

#define CHORUS_CUDA_OK(call)                                                   \
  do {                                                                         \
    const cudaError_t err_ = (call);                                           \
    ASSERT_EQ(err_, cudaSuccess) << #call << ": " << cudaGetErrorString(err_); \
  } while (0)

// A device allocation of `bytes` bytes (plus `slack` so that tests can offset pointers), freed on destruction.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes, size_t slack = 64) : bytes_(bytes + slack) {
    if (cudaMalloc(&ptr_, bytes_ == 0 ? 1 : bytes_) != cudaSuccess) ptr_ = nullptr;
  }
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  std::byte* get(size_t offset = 0) const { return static_cast<std::byte*>(ptr_) + offset; }
  bool ok() const { return ptr_ != nullptr; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_;
};

// One device buffer of `bytes` per rank, for tests with ranks as threads: allocated by the test's thread before any
// rank runs a call (see upload below). Check all_allocated() before use.
inline std::vector<std::unique_ptr<DeviceBuffer>> per_rank_buffers(int n, size_t bytes) {
  std::vector<std::unique_ptr<DeviceBuffer>> v;
  for (int r = 0; r < n; ++r) v.push_back(std::make_unique<DeviceBuffer>(bytes));
  return v;
}
inline bool all_allocated(const std::vector<std::unique_ptr<DeviceBuffer>>& v) {
  for (const auto& b : v)
    if (!b->ok()) return false;
  return true;
}

// Synchronous for every stream: a cudaMemcpy from pageable memory may return before its DMA reached the device, and
// work on a non-blocking stream would not wait for it. Waits for the whole device, so tests with ranks as threads
// upload and download from the test's thread while no rank's call is in flight (a staged call's stream waits for
// its peers' calls, and a rank thread blocked here would never make its own: docs/cuda.md, rules).
inline cudaError_t upload(void* dst, const void* src, size_t bytes) {
  const cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice);
  return e != cudaSuccess ? e : cudaDeviceSynchronize();
}
inline cudaError_t download(void* dst, const void* src, size_t bytes) {
  return cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost);
}

}  // namespace chorus::gputest
