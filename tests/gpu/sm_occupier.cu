// See sm_occupier.h.
#include "tests/gpu/sm_occupier.h"

#include <chrono>
#include <cstring>
#include <thread>

namespace chorus::gputest {
namespace {

constexpr int kThreads = 1024;

__device__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ uint32_t load_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Thread 0 of each block marks the block resident, then polls the release flag; the other threads wait at the
// barrier, so the block keeps all of its thread slots until released (or until max_ns passed).
__global__ void occupy(uint32_t* flags, uint64_t max_ns) {
  if (threadIdx.x == 0) {
    const uint64_t start = global_ns();
    volatile uint32_t* mine = flags + 1 + blockIdx.x;
    *mine = 1;
    __threadfence_system();
    while (load_acquire_sys(flags) == 0 && global_ns() - start < max_ns)
      __nanosleep(20000);  // about 20 us: little traffic on the bus meanwhile
  }
  __syncthreads();
}

std::string error_text(const char* what, cudaError_t e) { return std::string(what) + ": " + cudaGetErrorString(e); }

}  // namespace

SmOccupier::SmOccupier(int wait_ms, int max_ms) {
  int device = 0, per_sm = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, device);
  if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, occupy, kThreads, 0);
  if (e != cudaSuccess) {
    why_ = error_text("device attributes", e);
    return;
  }
  // Every thread slot must be taken, or a block of other work could still start beside ours.
  int max_threads = 0;
  if (cudaDeviceGetAttribute(&max_threads, cudaDevAttrMaxThreadsPerMultiProcessor, device) != cudaSuccess ||
      per_sm * kThreads != max_threads) {
    why_ = std::to_string(per_sm) + " blocks of " + std::to_string(kThreads) + " threads per SM do not take its " +
           std::to_string(max_threads) + " thread slots: this device cannot be fully held so";
    return;
  }
  blocks_ = sms_ * per_sm;
  if (cudaHostAlloc(reinterpret_cast<void**>(&flags_), sizeof(uint32_t) * (1 + blocks_), cudaHostAllocMapped) !=
      cudaSuccess) {
    why_ = "cudaHostAlloc failed";
    flags_ = nullptr;
    return;
  }
  std::memset(flags_, 0, sizeof(uint32_t) * (1 + blocks_));
  uint32_t* dev_flags = nullptr;
  e = cudaHostGetDevicePointer(reinterpret_cast<void**>(&dev_flags), flags_, 0);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
  if (e != cudaSuccess) {
    why_ = error_text("stream", e);
    return;
  }
  occupy<<<blocks_, kThreads, 0, stream_>>>(dev_flags, static_cast<uint64_t>(max_ms) * 1000000);
  if ((e = cudaGetLastError()) != cudaSuccess) {
    why_ = error_text("launch", e);
    released_ = true;
    return;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms);
  int resident = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    resident = 0;
    for (int b = 0; b < blocks_; ++b) resident += reinterpret_cast<volatile uint32_t*>(flags_)[1 + b] != 0 ? 1 : 0;
    if (resident == blocks_) return;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  why_ = "only " + std::to_string(resident) + " of " + std::to_string(blocks_) + " blocks (" + std::to_string(per_sm) +
         " per SM on " + std::to_string(sms_) + " SMs) became resident within " + std::to_string(wait_ms) + " ms";
}

bool SmOccupier::holding() const {
  return stream_ != nullptr && !released_ && cudaStreamQuery(stream_) == cudaErrorNotReady;
}

void SmOccupier::release() {
  if (flags_ != nullptr) reinterpret_cast<volatile uint32_t*>(flags_)[0] = 1;
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  released_ = true;
}

SmOccupier::~SmOccupier() {
  release();
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
  if (flags_ != nullptr) cudaFreeHost(flags_);
  cudaGetLastError();
}

}  // namespace chorus::gputest
