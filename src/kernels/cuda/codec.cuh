// CUDA compression codecs: the device counterpart of src/kernels/cpu/codec.h (int8, MX fp8 e4m3, int4, sign1,
// sign_vote). The formats are those of docs/compression.md, and for equal inputs (codec, data, residual, step, rank,
// first_elem) every function here writes the same bytes as its CPU twin: the same message, the same residual
// update, the same stochastic rounding (Philox4x32-10 lane g % 4 at counter (g / 4, step) under the SplitMix64 key
// of (seed, rank); Salmon et al. 2011), the same NaN/Inf policy. The GPU tests hold the two to bit equality.
//
// Shapes and units: `count` is a number of fp32 elements; messages are encoded_bytes(c, count) bytes
// (codec::encoded_bytes). All pointers are device pointers of the current device (or memory it can access).
// Alignment: messages must be 4-byte aligned (every record boundary is, so a message cut at records stays valid);
// float and int32 arrays must be 4-byte aligned, and are moved in 16-byte vectors when they are 16-byte aligned.
//
// Rotation (Codec::rotation, int8, fp8_e4m3, int4, sign1): every whole record is rotated by the randomized Hadamard
// transform H D / sqrt(R) before it is encoded and rotated back after it is decoded, as codec.cc does (the same
// signs D, the same butterfly order, the same bits; Suresh et al., ICML 2017). One thread block per record (a thread
// per butterfly pair, up to 1024) in shared memory; the rotated values go through a work buffer of count floats taken
// from the stream's memory pool (cudaMallocAsync, released on the stream), so a rotated call needs a device that
// supports stream-ordered allocation, and costs about two more passes over the data than an unrotated one.
//
// Ordering: every function only enqueues kernels on `stream` (the caller's) and returns; nothing waits for the
// device, so buffers must stay valid until the stream reaches the work.
// Errors (nothing enqueued): chorus::Error(chorusInvalidArgument, Kernels) for an invalid codec (codec::validate),
// null pointers with count > 0, a residual for sign_vote, overlapping in / out / residual, a misaligned pointer;
// chorusUnhandledCudaError when a launch fails. Errors of the kernels themselves surface on the stream.
// Thread-safety: as the CPU functions: pure apart from their outputs; concurrent calls on disjoint outputs are safe.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/codec.h"

namespace chorus::kernels::cuda {

// Encodes in[0, count) into out[0, encoded_bytes(c, count)), as codec::encode. With ctx.residual (count floats,
// device memory) the residual is read and updated in place (error feedback). When nonfinite_blocks is not null,
// the number of non-finite blocks (sign_vote: 32-element words holding a NaN) is added to *nonfinite_blocks (a
// device counter the caller zeroes; the CPU encode returns this number instead).
void encode(const codec::Codec& c, const float* in, size_t count, std::byte* out, const codec::EncodeCtx& ctx,
            unsigned long long* nonfinite_blocks, cudaStream_t stream);

// out[i] = the decoded value of element i of a message of `count` elements, as codec::decode.
void decode(const codec::Codec& c, const std::byte* in, size_t count, float* out, cudaStream_t stream);

// acc[i] += the decoded value (code * scale rounded to fp32, then added; no fused multiply-add), as
// codec::decode_accumulate.
void decode_accumulate(const codec::Codec& c, const std::byte* in, size_t count, float* acc, cudaStream_t stream);

// Majority vote on sign_vote messages, as codec::vote_accumulate / vote_finalize / vote_encode_result:
// votes[i] += +1 or -1; out[i] = sign(votes[i]) (0 on a tie); out = the message with bit i set where votes[i] < 0.
void vote_accumulate(const std::byte* in, size_t count, int32_t* votes, cudaStream_t stream);
void vote_finalize(const int32_t* votes, size_t count, float* out, cudaStream_t stream);
void vote_encode_result(const int32_t* votes, size_t count, std::byte* out, cudaStream_t stream);

}  // namespace chorus::kernels::cuda
