// Kernel behind wait_host_flag (host_flag.cuh).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/host_flag.cuh"

namespace chorus::kernels::cuda {
namespace {

__device__ __forceinline__ uint32_t load_acquire_system(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__global__ void wait_host_flag_kernel(const uint32_t* flag, uint32_t value) {
  while (load_acquire_system(flag) != value) __nanosleep(500);
}

}  // namespace

void wait_host_flag(const uint32_t* flag_dev, uint32_t value, cudaStream_t stream) {
  launch_kernel(wait_host_flag_kernel, dim3(1), dim3(1), 0, stream, "wait_host_flag: cudaLaunchKernel", flag_dev,
                value);
}

void load_wait_host_flag_kernel() {
  cudaFuncAttributes attr{};
  check(cudaFuncGetAttributes(&attr, wait_host_flag_kernel), "cudaFuncGetAttributes (loading wait_host_flag)");
}

}  // namespace chorus::kernels::cuda
