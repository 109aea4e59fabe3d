// CUDA reduction kernels: the device counterpart of src/kernels/cpu/reduce.h, with the same semantics and the same
// bits for the same inputs (the GPU tests compare the two on random data, exactly):
//  - fp16, bf16, fp8 e4m3 and e5m2 are widened to fp32, combined, and rounded to nearest-even once per result
//    (e4m3 saturates to +-448, e5m2 overflows to inf, NaN stays NaN with the CPU's NaN encodings);
//  - min/max are IEEE 754-2019 minimum/maximum (NaN propagates, -0 < +0);
//  - integer sum/prod wrap modulo 2^bits; integer avg truncates toward zero;
//  - premul multiplies the operand read from the user's input before combining; avg divides at the final step;
//  - no operation is contracted into a fused multiply-add (the CPU kernels do not contract either).
// Memory is read and written in 16-byte vectors when dst, a and b share their alignment modulo 16 (a scalar head
// and tail cover the rest), and element by element otherwise; grid-stride loops sized from the SM count.
//
// Ordering: every function only enqueues work on `stream` (the caller's; 0 is the legacy default stream) and returns
// without waiting for it; the pointers must stay valid until the stream reaches the work. All pointers are device
// pointers (or managed / mapped memory the device can access) of the current device.
// Errors (nothing enqueued): chorusInvalidArgument for an invalid dtype or kind, a negative avg divisor, null
// pointers with n > 0, a partial overlap of dst with a source, or a pointer not aligned to its element size;
// chorusUnhandledCudaError when the launch fails. Errors of the kernel itself surface on the stream.
// Thread-safety: all functions are safe to call concurrently (the only shared state is a per-device SM-count cache).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "kernels/cpu/reduce.h"

namespace chorus::kernels::cuda {

// dst[i] = a[i] op b'[i] for i < n elements of spec.dtype, where b' = premul(b) if b_is_input (and spec.premul),
// and the result is divided by spec.avg_divisor if final (and avg_divisor > 1). dst may equal a or b exactly.
void reduce(const ReduceSpec& spec, void* dst, const void* a, const void* b, size_t n, bool b_is_input, bool final,
            cudaStream_t stream);

// dst[i] = src'[i] for i < n elements: premul if src_is_input, divided if final. Without a transform this is a
// cudaMemcpyAsync (device to device) when dst != src and nothing when dst == src.
void copy(const ReduceSpec& spec, void* dst, const void* src, size_t n, bool src_is_input, bool final,
          cudaStream_t stream);

// Loads every kernel reduce() and copy() can launch into the current context. Under lazy loading (the CUDA 12.2+
// default) a kernel is otherwise loaded at its first launch, and loading may wait for the whole context: a first
// launch while another stream of the context is held (a waiting kernel, a blocked host function) could wait forever
// (CUDA Programming Guide, "Lazy Loading", potential hazards). Thread-safety: any thread; idempotent.
// Throws chorus::Error(chorusUnhandledCudaError) when CUDA refuses.
void load_kernels();

}  // namespace chorus::kernels::cuda
