// Error checking and launch geometry shared by the CUDA kernels.
#include "kernels/cuda/common.cuh"

#include <atomic>

#include "core/error.h"

namespace chorus::kernels::cuda {

void check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return;
  throw Error(chorusUnhandledCudaError, Subsys::Kernels,
              cat("cuda: ", what, ": ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")"));
}

int sm_count() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cache[kMaxDevices] = {};  // 0 = not looked up yet
  int dev = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  if (dev >= 0 && dev < kMaxDevices) {
    const int cached = cache[dev].load(std::memory_order_relaxed);
    if (cached > 0) return cached;
  }
  int sms = 0;
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute(SM count)");
  if (sms < 1) sms = 1;
  if (dev >= 0 && dev < kMaxDevices) cache[dev].store(sms, std::memory_order_relaxed);
  return sms;
}

unsigned grid_blocks(size_t items, unsigned threads, int blocks_per_sm) {
  const size_t needed = (items + threads - 1) / threads;
  const size_t full = static_cast<size_t>(sm_count()) * static_cast<size_t>(blocks_per_sm > 0 ? blocks_per_sm : 1);
  const size_t blocks = needed < full ? needed : full;
  return blocks == 0 ? 1u : static_cast<unsigned>(blocks);
}

void check_no_overlap(const void* a, size_t na, const void* b, size_t nb, const char* what) {
  const auto pa = reinterpret_cast<uintptr_t>(a);
  const auto pb = reinterpret_cast<uintptr_t>(b);
  if (na != 0 && nb != 0 && pa < pb + nb && pb < pa + na) {
    throw Error(chorusInvalidArgument, Subsys::Kernels, what);
  }
}

}  // namespace chorus::kernels::cuda
