// Shared pieces of the CUDA kernels: error checking, launch geometry, bit casts. CUDA-only: included by the .cu
// files of src/kernels/cuda/ and nothing that a CPU-only build compiles.
#pragma once

#include <cuda_runtime_api.h>
#ifdef __CUDACC__
#include <cuda_runtime.h>
#endif

#include <cstddef>
#include <cstdint>
#include <tuple>
#include <utility>

namespace chorus::kernels::cuda {

// Throws chorus::Error(chorusUnhandledCudaError, Kernels) naming `what` and the CUDA error when err != cudaSuccess.
void check(cudaError_t err, const char* what);

// Multiprocessors of the current device (cached per device id; thread-safe).
int sm_count();

// Blocks of `threads` threads for a grid-stride kernel over `items` work items: enough to fill every SM
// `blocks_per_sm` times over, never more than the work needs, at least one.
unsigned grid_blocks(size_t items, unsigned threads, int blocks_per_sm);

// Throws chorus::Error(chorusInvalidArgument, Kernels) with `what` when the byte ranges overlap.
void check_no_overlap(const void* a, size_t na, const void* b, size_t nb, const char* what);

}  // namespace chorus::kernels::cuda

// ---- Device helpers ----
#ifdef __CUDACC__
namespace chorus::kernels::cuda::dev {

constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ size_t global_thread() { return static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ __forceinline__ size_t grid_threads() { return static_cast<size_t>(gridDim.x) * blockDim.x; }

// 2^e as fp32 for e in [-149, 127] (subnormal below -126), exact.
__device__ __forceinline__ float pow2(int e) {
  return e >= -126 ? __uint_as_float(static_cast<uint32_t>(e + 127) << 23) : __uint_as_float(1u << (e + 149));
}

// a / b for b > 0, in 32 bits when a fits (64-bit division is a long software sequence on the GPU).
__device__ __forceinline__ uint64_t div_u64(uint64_t a, uint32_t b) {
  return (a >> 32) == 0 ? static_cast<uint64_t>(static_cast<uint32_t>(a) / b) : a / b;
}

}  // namespace chorus::kernels::cuda::dev

namespace chorus::kernels::cuda {

// Launches `kernel` with `args` (converted to its parameter types) and throws as check() does if the launch fails.
// cudaLaunchKernel's status is the launch's (or a sticky error of the context, or an earlier asynchronous launch's);
// cudaGetLastError after <<<>>> would also return an earlier, non-sticky error of the thread, the application's
// included, and clearing it first would swallow that.
template <typename... Params, typename... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
                   const char* what, Args&&... args) {
  static_assert(sizeof...(Params) == sizeof...(Args), "launch_kernel: one argument per kernel parameter");
  std::tuple<Params...> values(std::forward<Args>(args)...);
  std::apply(
      [&](auto&... v) {
        void* ptrs[] = {const_cast<void*>(static_cast<const void*>(&v))...};
        check(cudaLaunchKernel(reinterpret_cast<const void*>(kernel), grid, block, ptrs, shared_bytes, stream), what);
      },
      values);
}

// Resident blocks of `threads` threads per SM for `kernel` (at least 1). Callers cache it per kernel in a static:
// the library is built for one architecture, so the answer does not change between devices that can run it.
template <typename Kernel>
int blocks_per_sm(Kernel kernel, unsigned threads) {
  int blocks = 0;
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, static_cast<int>(threads), 0),
        "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  return blocks > 0 ? blocks : 1;
}

}  // namespace chorus::kernels::cuda
#endif
