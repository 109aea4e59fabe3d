// A stream that waits for the host: the staging path of collectives on device buffers (runtime/cuda_stream.cc) holds
// the caller's stream until the communicator's worker thread has finished the call. CUDA-only: included by .cu files
// and by runtime sources built with CHORUS_WITH_CUDA.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace chorus::kernels::cuda {

// Enqueues on `stream` a kernel of one thread that returns once the 32-bit word at `flag_dev` equals `value`.
// `flag_dev` is the device address of pinned host memory mapped into the device (cudaHostAllocMapped,
// cudaHostGetDevicePointer) that a host thread sets with a release store. The thread polls with system-scope acquire
// loads (PTX ld.acquire.sys), so what the host wrote before the flag is visible to the stream's later work, and
// sleeps about 0.5 us between polls (__nanosleep) to keep the bus quiet.
//
// Why a kernel: a stream memory operation (cuStreamWaitValue32) on host-mapped memory written by the CPU was measured
// never to wake on an H200 (shared/GPU-NOTES.md), while kernels reading host-mapped memory see host stores (the
// mechanism NCCL's network proxy relies on). The cost is one resident thread block while the call is in flight.
// Ranks that are processes on one GPU have their contexts time-sliced: there a waiting kernel holds the GPU for its
// time slice, so such ranks are better served by a path that waits on CUDA events.
//
// Capturable in a CUDA graph (a kernel node). Throws chorus::Error(chorusUnhandledCudaError) if the launch fails.
// Thread-safety: any thread; the flag is the caller's to set.
void wait_host_flag(const uint32_t* flag_dev, uint32_t value, cudaStream_t stream);

// Loads the waiting kernel into the current context ahead of its first launch (see load_kernels in reduce.cuh).
void load_wait_host_flag_kernel();

}  // namespace chorus::kernels::cuda
