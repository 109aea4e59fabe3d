// CUDA compression codecs (see codec.cuh for the contract, docs/compression.md for the formats).
//
// Work decomposition, chosen so that no thread needs another's data beyond warp shuffles and records stay
// independent (a record's byte offset is its index times the full record size):
//  - int8: one warp per block (record); each lane holds its groups of 4 elements in registers (block <= 1024);
//  - fp8 e4m3: one warp per record of 128 elements; lane = 4 elements, 8 lanes = one MX block;
//  - int4: one warp per two records (128 elements); lane = 4 elements, 8 lanes = one block, 16 lanes = one record;
//  - sign_vote: one warp per 4 words (128 elements), the word OR-reduced over 8 lanes;
//  - sign1: one thread block per record. The scale must equal the CPU's bit for bit, so its sum of squares keeps the
//    CPU's order: 16 partial sums (lane l takes elements l, l + 16, ... in order), added in lane order. Records of at
//    most kTile elements (the default 2048 included) are staged in shared memory for that sequential part;
//    longer ones are read again from global memory (correct, but slower).
//  - decode and decode_accumulate: element-wise, one thread per 4 elements, for every kind.
// Every floating-point operation is an explicit round-to-nearest intrinsic, in the CPU code's order; the build
// passes --fmad=false and keeps denormals, so the bits match src/kernels/cpu/codec.cc.
#include <cuda_runtime.h>

#include <cfloat>
#include <cmath>
#include <cstdint>

#include "core/error.h"
#include "kernels/cuda/codec.cuh"
#include "kernels/cuda/common.cuh"

namespace chorus::kernels::cuda {
namespace {

using codec::Codec;
using codec::CodecKind;
using codec::EncodeCtx;

constexpr unsigned kThreads = 256;
constexpr unsigned kWarps = kThreads / 32;
constexpr unsigned kFull = dev::kFullMask;

constexpr uint32_t kAbsMask = 0x7fffffffu;
constexpr uint32_t kInfBits = 0x7f800000u;
constexpr uint32_t kNaNBits = 0x7fc00000u;
constexpr uint32_t kRoundMagicBits = 0x4b400000u;  // 1.5 * 2^23: adding it rounds |v| < 2^22 to an integer
constexpr uint8_t kE8M0NaN = 0xff;
constexpr uint16_t kHalfNaN = 0x7e00;
constexpr uint16_t kHalfMax = 0x7bff;  // 65504
constexpr uint32_t kMaxInt8Block = 1024;
constexpr size_t kFp8Record = 128;
constexpr size_t kInt4Record = 64;
constexpr uint32_t kTile = 4096;  // sign1 records up to this many elements are staged in shared memory

// ---- Scalar pieces, as codec.cc ----

__device__ __forceinline__ int32_t round_int(float v) {
  return static_cast<int32_t>(__float_as_uint(__fadd_rn(v, __uint_as_float(kRoundMagicBits))) - kRoundMagicBits);
}
__device__ __forceinline__ int32_t floor_int(float v) {
  const int32_t r = round_int(v);
  return r - (__int2float_rn(r) > v ? 1 : 0);
}
__device__ __forceinline__ float uniform01(uint32_t r) {
  return __fmul_rn(__int2float_rn(static_cast<int32_t>(r >> 8)), 0x1p-24f);
}
__device__ __forceinline__ uint32_t abs_bits(float v) { return __float_as_uint(v) & kAbsMask; }

// Philox4x32-10 (Salmon, Moraes, Dror, Shaw, SC 2011).
struct SrKey {
  uint32_t k0, k1;            // key
  uint32_t step_lo, step_hi;  // counter words 2 and 3
};

__device__ __forceinline__ uint4 philox(uint64_t q, const SrKey& key) {
  uint32_t c0 = static_cast<uint32_t>(q), c1 = static_cast<uint32_t>(q >> 32), c2 = key.step_lo, c3 = key.step_hi;
  uint32_t k0 = key.k0, k1 = key.k1;
#pragma unroll
  for (int r = 0; r < 10; ++r) {
    const uint32_t hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
    const uint32_t hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
    const uint32_t n0 = hi1 ^ c1 ^ k0;
    const uint32_t n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return make_uint4(c0, c1, c2, c3);
}

// The variates of global elements g, g + 1, g + 2, g + 3: word (g + t) % 4 of Philox at counter (g + t) / 4.
__device__ __forceinline__ void random4(const SrKey& key, uint64_t g, uint32_t r[4]) {
  const uint4 a = philox(g >> 2, key);
  switch (static_cast<unsigned>(g & 3)) {
    case 0:
      r[0] = a.x;
      r[1] = a.y;
      r[2] = a.z;
      r[3] = a.w;
      return;
    default: break;
  }
  const uint4 b = philox((g >> 2) + 1, key);
  switch (static_cast<unsigned>(g & 3)) {
    case 1:
      r[0] = a.y;
      r[1] = a.z;
      r[2] = a.w;
      r[3] = b.x;
      return;
    case 2:
      r[0] = a.z;
      r[1] = a.w;
      r[2] = b.x;
      r[3] = b.y;
      return;
    default:
      r[0] = a.w;
      r[1] = b.x;
      r[2] = b.y;
      r[3] = b.z;
      return;
  }
}

// E4M3 code of v, |v| <= 448, nearest-even (codec.cc's e4m3_encode).
__device__ __forceinline__ uint32_t e4m3_encode(float v) {
  const uint32_t x = __float_as_uint(v);
  const uint32_t sign = (x >> 24) & 0x80u;
  const uint32_t ax = x & kAbsMask;
  uint32_t r = ax - (120u << 23);
  r = (r + 0x7ffffu + ((r >> 20) & 1u)) >> 20;
  const uint32_t sub = __float_as_uint(__fadd_rn(__uint_as_float(ax), 0x1p14f)) - __float_as_uint(0x1p14f);
  r = ax < (121u << 23) ? sub : r;
  r = r < 0x7eu ? r : 0x7eu;
  return r | sign;
}

// Stochastic rounding to E4M3 (codec.cc's e4m3_encode_sr).
__device__ __forceinline__ uint32_t e4m3_encode_sr(float v, uint32_t rnd) {
  const uint32_t x = __float_as_uint(v);
  const uint32_t sign = (x >> 24) & 0x80u;
  const uint32_t ax = x & kAbsMask;
  uint32_t r = (ax - (120u << 23) + (rnd >> 12)) >> 20;
  const uint32_t sub =
      static_cast<uint32_t>(floor_int(__fadd_rn(__fmul_rn(__uint_as_float(ax), 512.0f), uniform01(rnd))));
  r = ax < (121u << 23) ? sub : r;
  r = r < 0x7eu ? r : 0x7eu;
  return r | sign;
}

__device__ __forceinline__ float e4m3_decode(uint32_t c) {
  const uint32_t mag = c & 0x7fu;
  const uint32_t normal = (mag << 20) + (120u << 23);
  const uint32_t sub = __float_as_uint(__fmul_rn(__int2float_rn(static_cast<int32_t>(mag)), 0x1p-9f));
  uint32_t bits = mag < 8u ? sub : normal;
  bits = mag == 0x7fu ? kNaNBits : bits;
  return __uint_as_float(bits | ((c & 0x80u) << 24));
}

__device__ __forceinline__ float e8m0_decode(uint32_t c) {
  if (c == kE8M0NaN) return __uint_as_float(kNaNBits);
  if (c == 0) return __uint_as_float(0x00400000u);
  return __uint_as_float(c << 23);
}

// float_types.cc's half_to_float.
__device__ __forceinline__ float half_to_float(uint32_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = kInfBits | (mant << 13);
  } else if (exp == 0) {
    return __uint_as_float(sign | __float_as_uint(__fmul_rn(__int2float_rn(static_cast<int32_t>(mant)), 0x1p-24f)));
  } else {
    bits = ((exp + 127 - 15) << 23) | (mant << 13);
  }
  return __uint_as_float(sign | bits);
}

// The smallest fp16 >= t (finite t >= 0), saturating at 65504 (codec.cc's half_round_up).
__device__ __forceinline__ uint32_t half_round_up(float t) {
  if (t >= 65504.0f) return kHalfMax;
  if (t < 0x1p-14f) return static_cast<uint32_t>(ceilf(__fmul_rn(t, 0x1p24f)));
  const uint32_t b = __float_as_uint(t);
  uint32_t h = (b >> 13) - (112u << 10);
  h += (b & 0x1fffu) != 0 ? 1u : 0u;
  return h;
}

__device__ __forceinline__ int32_t nibble_value(uint32_t v) { return static_cast<int32_t>((v & 0x0fu) ^ 0x08u) - 8; }

// ---- Loads and stores of 4 consecutive elements ----

// y[t] = x[i + t] (+ e[i + t]) for t < valid, 0 beyond; one 16-byte access per array when vec and valid == 4.
template <bool kEF>
__device__ __forceinline__ void load_y4(const float* x, const float* e, size_t i, uint32_t valid, bool vec,
                                        float y[4]) {
  if (vec && valid == 4) {
    const float4 a = *reinterpret_cast<const float4*>(x + i);
    y[0] = a.x;
    y[1] = a.y;
    y[2] = a.z;
    y[3] = a.w;
    if constexpr (kEF) {
      const float4 b = *reinterpret_cast<const float4*>(e + i);
      y[0] = __fadd_rn(y[0], b.x);
      y[1] = __fadd_rn(y[1], b.y);
      y[2] = __fadd_rn(y[2], b.z);
      y[3] = __fadd_rn(y[3], b.w);
    }
    return;
  }
#pragma unroll
  for (uint32_t t = 0; t < 4; ++t) {
    float v = 0.0f;
    if (t < valid) {
      v = x[i + t];
      if constexpr (kEF) v = __fadd_rn(v, e[i + t]);
    }
    y[t] = v;
  }
}

__device__ __forceinline__ void store4(float* p, size_t i, uint32_t valid, bool vec, const float v[4]) {
  if (vec && valid == 4) {
    *reinterpret_cast<float4*>(p + i) = make_float4(v[0], v[1], v[2], v[3]);
    return;
  }
#pragma unroll
  for (uint32_t t = 0; t < 4; ++t) {
    if (t < valid) p[i + t] = v[t];
  }
}

__device__ __forceinline__ uint32_t max4(const float y[4]) {
  const uint32_t a = max(abs_bits(y[0]), abs_bits(y[1]));
  const uint32_t b = max(abs_bits(y[2]), abs_bits(y[3]));
  return max(a, b);
}

// Maximum / OR over aligned groups of 8 lanes (every lane of the warp takes part).
__device__ __forceinline__ uint32_t group8_max(uint32_t v) {
  v = max(v, __shfl_xor_sync(kFull, v, 4));
  v = max(v, __shfl_xor_sync(kFull, v, 2));
  return max(v, __shfl_xor_sync(kFull, v, 1));
}
__device__ __forceinline__ uint32_t group8_or(uint32_t v) {
  v |= __shfl_xor_sync(kFull, v, 4);
  v |= __shfl_xor_sync(kFull, v, 2);
  return v | __shfl_xor_sync(kFull, v, 1);
}

__device__ __forceinline__ void count_bad(unsigned long long* bad) {
  if (bad) atomicAdd(bad, 1ull);
}

__device__ __forceinline__ uint32_t min_valid(size_t n, size_t j) {
  return j < n ? static_cast<uint32_t>(n - j < 4 ? n - j : 4) : 0u;
}

// ---- Encode kernels ----

struct EncodeArgs {
  const float* in;
  float* res;  // null without error feedback
  size_t count;
  uint8_t* out;
  uint32_t block;  // int8 and sign1
  SrKey key;
  uint64_t g0;  // ctx.first_elem
  bool vec;     // in (and res) are 16-byte aligned
  unsigned long long* bad;
};

template <bool kEF, bool kSR>
__global__ void __launch_bounds__(kThreads) int8_encode_kernel(EncodeArgs a) {
  const size_t lane = threadIdx.x & 31;
  const size_t B = a.block;
  const size_t nrec = (a.count + B - 1) / B;
  for (size_t r = dev::global_thread() / 32; r < nrec; r += dev::grid_threads() / 32) {
    const size_t start = r * B;
    const size_t n = a.count - start < B ? a.count - start : B;
    const size_t groups = (n + 3) / 4;
    uint8_t* rec = a.out + r * (4 + B);
    float y[kMaxInt8Block / 128][4];
    uint32_t mb = 0;
#pragma unroll
    for (size_t k = 0; k < kMaxInt8Block / 128; ++k) {
      const size_t g = lane + 32 * k;
      const uint32_t valid = g < groups ? min_valid(n, 4 * g) : 0u;
      load_y4<kEF>(a.in, a.res, start + 4 * g, valid, a.vec, y[k]);
      mb = max(mb, max4(y[k]));
    }
    mb = __reduce_max_sync(kFull, mb);
    if (mb >= kInfBits) {
      if (lane == 0) {
        *reinterpret_cast<uint32_t*>(rec) = kNaNBits;
        count_bad(a.bad);
      }
      for (size_t g = lane; g < groups; g += 32) *reinterpret_cast<uint32_t*>(rec + 4 + 4 * g) = 0;
      continue;
    }
    const float amax = __uint_as_float(mb);
    const float scale = __fdiv_rn(amax, 127.0f);
    const float inv = mb == 0 ? 0.0f : fminf(__fdiv_rn(127.0f, amax), FLT_MAX);
    if (lane == 0) *reinterpret_cast<float*>(rec) = scale;
#pragma unroll
    for (size_t k = 0; k < kMaxInt8Block / 128; ++k) {
      const size_t g = lane + 32 * k;
      if (g >= groups) continue;
      const uint32_t valid = min_valid(n, 4 * g);
      uint32_t rnd[4] = {0, 0, 0, 0};
      if constexpr (kSR) random4(a.key, a.g0 + start + 4 * g, rnd);
      uint32_t word = 0;
      float e[4];
#pragma unroll
      for (uint32_t t = 0; t < 4; ++t) {
        if (t >= valid) continue;
        const float v = __fmul_rn(y[k][t], inv);
        int32_t q = kSR ? floor_int(__fadd_rn(v, uniform01(rnd[t]))) : round_int(v);
        q = q > 127 ? 127 : q;
        q = q < -127 ? -127 : q;
        word |= (static_cast<uint32_t>(q) & 0xffu) << (8 * t);
        e[t] = __fsub_rn(y[k][t], __fmul_rn(__int2float_rn(q), scale));
      }
      *reinterpret_cast<uint32_t*>(rec + 4 + 4 * g) = word;
      if constexpr (kEF) store4(a.res, start + 4 * g, valid, a.vec, e);
    }
  }
}

template <bool kEF, bool kSR>
__global__ void __launch_bounds__(kThreads) fp8_encode_kernel(EncodeArgs a) {
  const size_t lane = threadIdx.x & 31;
  const size_t nrec = (a.count + kFp8Record - 1) / kFp8Record;
  for (size_t r = dev::global_thread() / 32; r < nrec; r += dev::grid_threads() / 32) {
    const size_t start = r * kFp8Record;
    const size_t n = a.count - start < kFp8Record ? a.count - start : kFp8Record;
    uint8_t* rec = a.out + r * (4 + kFp8Record);
    const size_t j = 4 * lane;
    const uint32_t valid = min_valid(n, j);
    float y[4];
    load_y4<kEF>(a.in, a.res, start + j, valid, a.vec, y);
    const uint32_t mb = group8_max(max4(y));  // the lane's MX block (lanes 8b .. 8b + 7)
    const bool special = mb >= kInfBits || mb == 0;
    uint32_t code;
    float inv = 0.0f, scale = 0.0f;
    if (special) {
      code = mb == 0 ? 0u : kE8M0NaN;
    } else {
      // floor(log2(amax)) - 8, plus one when amax's mantissa exceeds 1.75, clamped below at -127.
      const int biased = static_cast<int>(mb >> 23);
      const int exp_amax = biased == 0 ? -127 : biased - 127;
      int s = exp_amax - 8 + ((mb & 0x7fffffu) > 0x600000u ? 1 : 0);
      s = s < -127 ? -127 : s;
      code = static_cast<uint32_t>(s + 127);
      inv = dev::pow2(-s);
      scale = e8m0_decode(code);
    }
    const uint32_t c0 = __shfl_sync(kFull, code, 0), c1 = __shfl_sync(kFull, code, 8);
    const uint32_t c2 = __shfl_sync(kFull, code, 16), c3 = __shfl_sync(kFull, code, 24);
    if (lane == 0) *reinterpret_cast<uint32_t*>(rec) = c0 | c1 << 8 | c2 << 16 | c3 << 24;
    if (lane % 8 == 0 && j < n && mb >= kInfBits) count_bad(a.bad);
    if (valid == 0) continue;
    uint32_t word = 0;
    float e[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // the all-zero block's residual
    if (!special) {
      uint32_t rnd[4] = {0, 0, 0, 0};
      if constexpr (kSR) random4(a.key, a.g0 + start + j, rnd);
#pragma unroll
      for (uint32_t t = 0; t < 4; ++t) {
        if (t >= valid) continue;
        const float v = __fmul_rn(y[t], inv);
        const uint32_t q = kSR ? e4m3_encode_sr(v, rnd[t]) : e4m3_encode(v);
        word |= q << (8 * t);
        e[t] = __fsub_rn(y[t], __fmul_rn(e4m3_decode(q), scale));
      }
    }
    *reinterpret_cast<uint32_t*>(rec + 4 + j) = word;
    if constexpr (kEF) {
      if (mb < kInfBits) store4(a.res, start + j, valid, a.vec, e);  // a non-finite block keeps its residual
    }
  }
}

template <bool kEF, bool kSR>
__global__ void __launch_bounds__(kThreads) int4_encode_kernel(EncodeArgs a) {
  const size_t lane = threadIdx.x & 31;
  const size_t rl = lane % 16;  // lane within the record
  const size_t nrec = (a.count + kInt4Record - 1) / kInt4Record;
  const size_t units = (nrec + 1) / 2;
  for (size_t u = dev::global_thread() / 32; u < units; u += dev::grid_threads() / 32) {
    const size_t r = 2 * u + lane / 16;
    const size_t start = r * kInt4Record;
    const size_t n = r >= nrec ? 0 : (a.count - start < kInt4Record ? a.count - start : kInt4Record);
    uint8_t* rec = a.out + r * (4 + kInt4Record / 2);
    const size_t j = 4 * rl;
    const uint32_t valid = min_valid(n, j);
    float y[4];
    load_y4<kEF>(a.in, a.res, start + j, valid, a.vec, y);
    const uint32_t mb = group8_max(max4(y));
    uint32_t h;
    float scale = 0.0f, inv = 0.0f;
    if (mb >= kInfBits) {
      h = kHalfNaN;
    } else {
      h = half_round_up(__fdiv_rn(__uint_as_float(mb), 7.0f));
      scale = half_to_float(h);
      inv = h == 0 ? 0.0f : __fdiv_rn(1.0f, scale);
    }
    int32_t q[4] = {0, 0, 0, 0};
    float e[4];
    if (mb < kInfBits) {
      uint32_t rnd[4] = {0, 0, 0, 0};
      if constexpr (kSR) {
        if (valid > 0) random4(a.key, a.g0 + start + j, rnd);
      }
#pragma unroll
      for (uint32_t t = 0; t < 4; ++t) {
        if (t >= valid) continue;
        const float v = __fmul_rn(y[t], inv);
        int32_t k = kSR ? floor_int(__fadd_rn(v, uniform01(rnd[t]))) : round_int(v);
        k = k > 7 ? 7 : k;
        k = k < -7 ? -7 : k;
        q[t] = k;
        e[t] = __fsub_rn(y[t], __fmul_rn(__int2float_rn(k), scale));
      }
    }
    const uint32_t mine = (static_cast<uint32_t>(q[0]) & 0xfu) | (static_cast<uint32_t>(q[1]) & 0xfu) << 4 |
                          (static_cast<uint32_t>(q[2]) & 0xfu) << 8 | (static_cast<uint32_t>(q[3]) & 0xfu) << 12;
    const uint32_t next = __shfl_down_sync(kFull, mine, 1);
    const uint32_t h1 = __shfl_down_sync(kFull, h, 8);
    if (rl == 0 && r < nrec) *reinterpret_cast<uint32_t*>(rec) = h | h1 << 16;  // absent block 1: h1 = 0
    if (rl % 8 == 0 && j < n && mb >= kInfBits) count_bad(a.bad);
    if (valid == 0) continue;
    if (rl % 2 == 0) *reinterpret_cast<uint32_t*>(rec + 4 + 2 * rl) = mine | next << 16;
    if constexpr (kEF) {
      if (mb < kInfBits) store4(a.res, start + j, valid, a.vec, e);
    }
  }
}

__global__ void __launch_bounds__(kThreads) vote_encode_kernel(EncodeArgs a) {
  const size_t lane = threadIdx.x & 31;
  const size_t units = (a.count + 127) / 128;
  for (size_t u = dev::global_thread() / 32; u < units; u += dev::grid_threads() / 32) {
    const size_t j = 128 * u + 4 * lane;
    const uint32_t valid = min_valid(a.count, j);
    float y[4];
    load_y4<false>(a.in, nullptr, j, valid, a.vec, y);
    uint32_t nib = 0, nan = 0;
#pragma unroll
    for (uint32_t t = 0; t < 4; ++t) {
      if (t >= valid) continue;
      nib |= static_cast<uint32_t>(y[t] < 0.0f) << t;
      nan |= abs_bits(y[t]) > kInfBits ? 1u : 0u;
    }
    const uint32_t word = group8_or(nib << (4 * (lane % 8)));
    nan = group8_or(nan);
    if (lane % 8 == 0 && valid > 0) {
      *reinterpret_cast<uint32_t*>(a.out + 4 * (4 * u + lane / 8)) = word;
      if (nan) count_bad(a.bad);
    }
  }
}

template <bool kEF>
__device__ __forceinline__ float y_at(const EncodeArgs& a, size_t i) {
  if constexpr (kEF) {
    return __fadd_rn(a.in[i], a.res[i]);
  } else {
    return a.in[i];
  }
}

template <bool kEF>
__global__ void __launch_bounds__(kThreads) sign1_encode_kernel(EncodeArgs a) {
  __shared__ float tile[kTile];
  __shared__ uint32_t warp_max[kWarps];
  __shared__ float block_scale;
  const unsigned tid = threadIdx.x;
  const unsigned lane = tid & 31;
  const unsigned warp = tid / 32;
  const size_t B = a.block;
  const size_t nrec = (a.count + B - 1) / B;
  for (size_t r = blockIdx.x; r < nrec; r += gridDim.x) {
    const size_t start = r * B;
    const size_t n = a.count - start < B ? a.count - start : B;
    const size_t words = (n + 31) / 32;
    uint8_t* rec = a.out + r * (4 + B / 8);
    const bool staged = n <= kTile;
    uint32_t mb = 0;
    for (size_t g = tid; 4 * g < n; g += kThreads) {
      const uint32_t valid = min_valid(n, 4 * g);
      float y[4];
      load_y4<kEF>(a.in, a.res, start + 4 * g, valid, a.vec, y);
      mb = max(mb, max4(y));
      if (staged) {
#pragma unroll
        for (uint32_t t = 0; t < 4; ++t) {
          if (t < valid) tile[4 * g + t] = y[t];
        }
      }
    }
    mb = __reduce_max_sync(kFull, mb);
    if (lane == 0) warp_max[warp] = mb;
    __syncthreads();
    mb = 0;
#pragma unroll
    for (unsigned w = 0; w < kWarps; ++w) mb = max(mb, warp_max[w]);
    if (mb >= kInfBits || mb == 0) {
      if (tid == 0) {
        *reinterpret_cast<uint32_t*>(rec) = mb == 0 ? 0u : kNaNBits;
        if (mb != 0) count_bad(a.bad);
      }
      for (size_t w = tid; w < words; w += kThreads) *reinterpret_cast<uint32_t*>(rec + 4 + 4 * w) = 0;
      if constexpr (kEF) {
        if (mb == 0) {
          for (size_t i = tid; i < n; i += kThreads) a.res[start + i] = 0.0f;
        }
      }
      __syncthreads();  // warp_max and tile are reused by the next record
      continue;
    }
    // Sum of squares of y / 2^ea in codec.cc's order: lane l sums elements l, l + 16, ...; then lanes 0..15 in order.
    const int biased = static_cast<int>(mb >> 23);
    const int ea = (biased == 0 ? 1 : biased) - 127;
    if (warp == 0) {
      const float p = dev::pow2(-ea);
      float acc = 0.0f;
      if (lane < 16) {
        for (size_t j = lane; j < n; j += 16) {
          const float t = __fmul_rn(staged ? tile[j] : y_at<kEF>(a, start + j), p);
          acc = __fadd_rn(acc, __fmul_rn(t, t));
        }
      }
      float sum = 0.0f;
#pragma unroll
      for (int l = 0; l < 16; ++l) sum = __fadd_rn(sum, __shfl_sync(kFull, acc, l));
      if (lane == 0) {
        const float scale =
            __fmul_rn(__fsqrt_rn(__fdiv_rn(sum, __uint2float_rn(static_cast<uint32_t>(n)))), dev::pow2(ea));
        block_scale = scale;
        *reinterpret_cast<float*>(rec) = scale;
      }
    }
    __syncthreads();
    const uint32_t sb = __float_as_uint(block_scale);
    for (size_t w = warp; w < words; w += kWarps) {
      const size_t i = 32 * w + lane;
      const bool valid = i < n;
      const float y = valid ? (staged ? tile[i] : y_at<kEF>(a, start + i)) : 0.0f;
      const uint32_t word = __ballot_sync(kFull, valid && y < 0.0f);
      if (lane == 0) *reinterpret_cast<uint32_t*>(rec + 4 + 4 * w) = word;
      if constexpr (kEF) {
        if (valid) a.res[start + i] = __fsub_rn(y, __uint_as_float(sb ^ (((word >> lane) & 1u) << 31)));
      }
    }
    __syncthreads();
  }
}

// ---- Decode: one thread per 4 elements ----

template <CodecKind K>
__device__ __forceinline__ void decode4(const uint8_t* in, size_t i, uint32_t B, float v[4]) {
  if constexpr (K == CodecKind::Int8) {
    const size_t r = dev::div_u64(i, B);
    const size_t j = i - r * B;
    const uint8_t* rec = in + r * (4 + static_cast<size_t>(B));
    const float scale = *reinterpret_cast<const float*>(rec);
    const uint32_t w = *reinterpret_cast<const uint32_t*>(rec + 4 + j);
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      v[t] = __fmul_rn(__int2float_rn(static_cast<int8_t>(static_cast<uint8_t>(w >> (8 * t)))), scale);
    }
  } else if constexpr (K == CodecKind::Fp8E4M3) {
    const size_t r = i / kFp8Record;
    const size_t j = i % kFp8Record;
    const uint8_t* rec = in + r * (4 + kFp8Record);
    const float scale = e8m0_decode(rec[j / 32]);
    const uint32_t w = *reinterpret_cast<const uint32_t*>(rec + 4 + j);
#pragma unroll
    for (int t = 0; t < 4; ++t) v[t] = __fmul_rn(e4m3_decode((w >> (8 * t)) & 0xffu), scale);
  } else if constexpr (K == CodecKind::Int4) {
    const size_t r = i / kInt4Record;
    const size_t j = i % kInt4Record;
    const uint8_t* rec = in + r * (4 + kInt4Record / 2);
    const float scale = half_to_float(*reinterpret_cast<const uint16_t*>(rec + 2 * (j / 32)));
    const uint32_t c = *reinterpret_cast<const uint16_t*>(rec + 4 + j / 2);
#pragma unroll
    for (int t = 0; t < 4; ++t) v[t] = __fmul_rn(__int2float_rn(nibble_value(c >> (4 * t))), scale);
  } else {
    uint32_t sb, w;
    size_t bit;
    if constexpr (K == CodecKind::Sign1) {
      const size_t r = dev::div_u64(i, B);
      const size_t j = i - r * B;
      const uint8_t* rec = in + r * (4 + static_cast<size_t>(B) / 8);
      sb = *reinterpret_cast<const uint32_t*>(rec);
      w = *reinterpret_cast<const uint32_t*>(rec + 4 + 4 * (j / 32));
      bit = j % 32;
    } else {
      sb = __float_as_uint(1.0f);
      w = *reinterpret_cast<const uint32_t*>(in + 4 * (i / 32));
      bit = i % 32;
    }
#pragma unroll
    for (int t = 0; t < 4; ++t) v[t] = __uint_as_float(sb ^ (((w >> (bit + t)) & 1u) << 31));
  }
}

template <CodecKind K, bool kAcc>
__global__ void __launch_bounds__(kThreads)
    decode_kernel(const uint8_t* in, size_t count, float* out, uint32_t B, bool vec) {
  const size_t groups = (count + 3) / 4;
  for (size_t g = dev::global_thread(); g < groups; g += dev::grid_threads()) {
    const size_t i = 4 * g;
    const uint32_t valid = min_valid(count, i);
    float v[4];
    decode4<K>(in, i, B, v);
    if constexpr (kAcc) {
      float o[4];
      load_y4<false>(out, nullptr, i, valid, vec, o);
#pragma unroll
      for (int t = 0; t < 4; ++t) v[t] = __fadd_rn(o[t], v[t]);
    }
    store4(out, i, valid, vec, v);
  }
}

// ---- Majority vote ----

__global__ void __launch_bounds__(kThreads) vote_accumulate_kernel(const uint8_t* in, size_t count, int32_t* votes) {
  for (size_t i = dev::global_thread(); i < count; i += dev::grid_threads()) {
    const uint32_t w = *reinterpret_cast<const uint32_t*>(in + 4 * (i / 32));
    votes[i] += 1 - 2 * static_cast<int32_t>((w >> (i % 32)) & 1u);
  }
}

__global__ void __launch_bounds__(kThreads) vote_finalize_kernel(const int32_t* votes, size_t count, float* out) {
  for (size_t i = dev::global_thread(); i < count; i += dev::grid_threads()) {
    out[i] = __int2float_rn((votes[i] > 0) - (votes[i] < 0));
  }
}

__global__ void __launch_bounds__(kThreads) vote_result_kernel(const int32_t* votes, size_t count, uint8_t* out) {
  const size_t words = (count + 31) / 32;
  const size_t lane = threadIdx.x & 31;
  for (size_t w = dev::global_thread() / 32; w < words; w += dev::grid_threads() / 32) {
    const size_t i = 32 * w + lane;
    const uint32_t word = __ballot_sync(kFull, i < count && votes[i] < 0);
    if (lane == 0) *reinterpret_cast<uint32_t*>(out + 4 * w) = word;
  }
}

// ---- Randomized Hadamard rotation (Codec::rotation), as codec.cc: z = H D y / sqrt(R) per whole record ----

// SplitMix64's output function (Steele, Lea, Flood, OOPSLA 2014), as codec.cc mixes (seed, rank) into the key and
// draws the rotation's signs.
__host__ __device__ constexpr uint64_t mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

constexpr uint32_t kRotationLimitBits = 0x79000000u;  // 2^115: a record holding this or more is not rotated (NaN)
constexpr uint32_t kRotationThreads = 1024;

// D's entry for position j of a record: bit j % 64 of word j / 64 of the SplitMix64 stream of the seed.
__device__ __forceinline__ float rotation_sign(uint64_t seed, uint32_t j) {
  const uint64_t bits = mix64(seed ^ mix64(0x5248545f7369676eull + j / 64));
  return (bits >> (j % 64)) & 1 ? -1.0f : 1.0f;
}

// Unnormalised fast Walsh-Hadamard transform of v[0, n) in shared memory, n a power of two: the stages h = 1, 2, 4,
// ... each a butterfly (a + b, a - b) per pair, the same operations as codec.cc's fwht (whose first three stages run
// in registers), so the same bits. Called by every thread of the block, after v was written and synchronized.
__device__ void fwht_shared(float* v, uint32_t n) {
  for (uint32_t h = 1; h < n; h <<= 1) {
    for (uint32_t p = threadIdx.x; p < n / 2; p += blockDim.x) {
      const uint32_t j = (p / h) * 2 * h + p % h;
      const float a = v[j], b = v[j + h];
      v[j] = __fadd_rn(a, b);
      v[j + h] = __fsub_rn(a, b);
    }
    __syncthreads();
  }
}

// One thread block per record of `rec` elements: y = in (+ res); z = H D y / sqrt(rec), or NaN when the record's
// largest magnitude (a NaN or Inf included) reaches 2^115 (then the unnormalised transform, summing up to 4096
// magnitudes, could overflow); bad[r] says which records were not rotated, exactly those whose codes the plain
// encode finds non-finite (the CPU's test for keeping a record's residual).
template <bool kEF>
__global__ void __launch_bounds__(kRotationThreads)
    rotate_forward_kernel(const float* in, const float* res, float* z, uint8_t* bad, uint32_t rec, size_t records,
                          uint64_t seed, float norm) {
  extern __shared__ float v[];
  __shared__ uint32_t amax;
  for (size_t r = blockIdx.x; r < records; r += gridDim.x) {
    const size_t base = r * rec;
    if (threadIdx.x == 0) amax = 0;
    __syncthreads();
    uint32_t mine = 0;
    for (uint32_t j = threadIdx.x; j < rec; j += blockDim.x) {
      const float y = kEF ? __fadd_rn(in[base + j], res[base + j]) : in[base + j];
      mine = max(mine, abs_bits(y));
      v[j] = __fmul_rn(y, rotation_sign(seed, j));
    }
    atomicMax(&amax, mine);
    __syncthreads();
    const bool not_rotated = amax >= kRotationLimitBits;
    if (not_rotated) {
      for (uint32_t j = threadIdx.x; j < rec; j += blockDim.x) z[base + j] = __uint_as_float(kNaNBits);
    } else {
      fwht_shared(v, rec);
      for (uint32_t j = threadIdx.x; j < rec; j += blockDim.x) z[base + j] = __fmul_rn(v[j], norm);
    }
    if (threadIdx.x == 0) bad[r] = not_rotated ? 1 : 0;
    __syncthreads();  // v and amax are reused by the next record
  }
}

enum class InverseTo { Store, Accumulate, Residual };

// One thread block per record: x = D H z / sqrt(rec) (z is left as it was), then
//  - Store: out = x;  - Accumulate: out += x;
//  - Residual (error feedback): res = (in + res) - x, where bad[r] is 0 (a record that was not rotated keeps its
//    residual, as the CPU keeps a non-finite record's).
template <InverseTo kTo>
__global__ void __launch_bounds__(kRotationThreads)
    rotate_inverse_kernel(const float* z, uint32_t rec, size_t records, uint64_t seed, float norm, float* out,
                          const float* in, float* res, const uint8_t* bad) {
  extern __shared__ float v[];
  for (size_t r = blockIdx.x; r < records; r += gridDim.x) {
    const size_t base = r * rec;
    if (kTo == InverseTo::Residual && bad[r] != 0) continue;  // the same for every thread of the block
    for (uint32_t j = threadIdx.x; j < rec; j += blockDim.x) v[j] = z[base + j];
    __syncthreads();
    fwht_shared(v, rec);
    for (uint32_t j = threadIdx.x; j < rec; j += blockDim.x) {
      const float x = __fmul_rn(v[j], __fmul_rn(norm, rotation_sign(seed, j)));
      if constexpr (kTo == InverseTo::Store) out[base + j] = x;
      if constexpr (kTo == InverseTo::Accumulate) out[base + j] = __fadd_rn(out[base + j], x);
      if constexpr (kTo == InverseTo::Residual) res[base + j] = __fsub_rn(__fadd_rn(in[base + j], res[base + j]), x);
    }
    __syncthreads();  // v is reused by the next record
  }
}

// ---- Host side ----

[[noreturn]] void fail(const Codec* c, const std::string& msg) {
  throw Error(chorusInvalidArgument, Subsys::Kernels,
              c ? cat("cuda codec ", codec::codec_name(c->kind), ": ", msg) : cat("cuda codec: ", msg));
}

void require(const Codec* c, const void* p, size_t align, const char* what, const char* name) {
  if (p == nullptr) fail(c, cat(what, ": ", name, " is null"));
  if (reinterpret_cast<uintptr_t>(p) % align != 0) fail(c, cat(what, ": ", name, " is not ", align, "-byte aligned"));
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

SrKey make_key(const Codec& c, const EncodeCtx& ctx) {
  const uint64_t k = mix64(c.seed ^ mix64(ctx.rank));
  return {static_cast<uint32_t>(k), static_cast<uint32_t>(k >> 32), static_cast<uint32_t>(ctx.step),
          static_cast<uint32_t>(ctx.step >> 32)};
}

// Launches `kernel` over `items` threads' worth of work (grid-stride), blocks capped at full occupancy.
template <typename Kernel, typename... Args>
void launch(Kernel kernel, int blocks_per_sm_cached, size_t items, cudaStream_t stream, const char* what,
            Args... args) {
  launch_kernel(kernel, dim3(grid_blocks(items, kThreads, blocks_per_sm_cached)), dim3(kThreads), 0, stream, what,
                args...);
}

#define CHORUS_LAUNCH(kernel, items, what, ...)              \
  do {                                                       \
    static const int bps_ = blocks_per_sm(kernel, kThreads); \
    launch(kernel, bps_, items, stream, what, __VA_ARGS__);  \
  } while (0)

template <bool kEF, bool kSR>
void encode_kind(const Codec& c, const EncodeArgs& a, cudaStream_t stream) {
  switch (c.kind) {
    case CodecKind::Int8:
      CHORUS_LAUNCH((int8_encode_kernel<kEF, kSR>), (a.count + a.block - 1) / a.block * 32, "int8 encode", a);
      return;
    case CodecKind::Fp8E4M3:
      CHORUS_LAUNCH((fp8_encode_kernel<kEF, kSR>), (a.count + 127) / 128 * 32, "fp8 encode", a);
      return;
    case CodecKind::Int4:
      CHORUS_LAUNCH((int4_encode_kernel<kEF, kSR>), (a.count + 127) / 128 * 32, "int4 encode", a);
      return;
    case CodecKind::Sign1:
      if constexpr (!kSR) {
        CHORUS_LAUNCH((sign1_encode_kernel<kEF>), (a.count + a.block - 1) / a.block * kThreads, "sign1 encode", a);
        return;
      }
      break;
    case CodecKind::SignVote:
      if constexpr (!kEF && !kSR) {
        CHORUS_LAUNCH(vote_encode_kernel, (a.count + 127) / 128 * 32, "sign_vote encode", a);
        return;
      }
      break;
  }
  fail(&c, "encode: unsupported combination of kind, residual and stochastic rounding");
}

// The codec without rotation: decode (or decode_accumulate) in[0, count) to out.
template <bool kAcc>
void decode_plain(const Codec& c, uint32_t block, const std::byte* in, size_t count, float* out, cudaStream_t stream) {
  if (count == 0) return;
  const char* what = kAcc ? "decode_accumulate" : "decode";
  const auto* bytes = reinterpret_cast<const uint8_t*>(in);
  const bool vec = aligned16(out);
  const size_t groups = (count + 3) / 4;
  switch (c.kind) {
    case CodecKind::Int8:
      CHORUS_LAUNCH((decode_kernel<CodecKind::Int8, kAcc>), groups, what, bytes, count, out, block, vec);
      return;
    case CodecKind::Fp8E4M3:
      CHORUS_LAUNCH((decode_kernel<CodecKind::Fp8E4M3, kAcc>), groups, what, bytes, count, out, block, vec);
      return;
    case CodecKind::Int4:
      CHORUS_LAUNCH((decode_kernel<CodecKind::Int4, kAcc>), groups, what, bytes, count, out, block, vec);
      return;
    case CodecKind::Sign1:
      CHORUS_LAUNCH((decode_kernel<CodecKind::Sign1, kAcc>), groups, what, bytes, count, out, block, vec);
      return;
    case CodecKind::SignVote:
      CHORUS_LAUNCH((decode_kernel<CodecKind::SignVote, kAcc>), groups, what, bytes, count, out, block, vec);
      return;
  }
}

// Work space for the rotation of `records` records of `rec` elements: the rotated values and a flag per record, on
// the stream (stream-ordered allocation, so capturable), released with release() once the work is enqueued.
class RotationScratch {
 public:
  RotationScratch(size_t records, uint32_t rec, cudaStream_t stream) : stream_(stream) {
    check(cudaMallocAsync(&mem_, records * rec * sizeof(float) + records, stream), "cudaMallocAsync (rotation)");
    z = static_cast<float*>(mem_);
    bad = reinterpret_cast<uint8_t*>(z + records * rec);
  }
  ~RotationScratch() {
    if (mem_ != nullptr) cudaFreeAsync(mem_, stream_);
  }
  RotationScratch(const RotationScratch&) = delete;
  RotationScratch& operator=(const RotationScratch&) = delete;
  float* z = nullptr;
  uint8_t* bad = nullptr;

 private:
  void* mem_ = nullptr;
  cudaStream_t stream_;
};

// One thread block per record, of one thread per butterfly pair (rec / 2, 32 to 1024 threads), as many blocks as an SM
// holds threads (2048) over the SMs, grid-stride over records.
template <typename Kernel, typename... Args>
void launch_rotation(Kernel kernel, size_t records, uint32_t rec, cudaStream_t stream, const char* what, Args... args) {
  const uint32_t threads = rec / 2 < 32 ? 32 : (rec / 2 > kRotationThreads ? kRotationThreads : rec / 2);
  const size_t cap = static_cast<size_t>(2048 / threads) * static_cast<size_t>(sm_count());
  const auto blocks = static_cast<unsigned>(records < cap ? records : cap);
  launch_kernel(kernel, dim3(blocks), dim3(threads), rec * sizeof(float), stream, what, args...);
}

float rotation_norm(uint32_t rec) { return 1.0f / std::sqrt(static_cast<float>(rec)); }

template <bool kAcc>
void decode_any(const Codec& c, const std::byte* in, size_t count, float* out, cudaStream_t stream) {
  const uint32_t block = codec::block_elems(c);
  if (count == 0) return;
  const char* what = kAcc ? "decode_accumulate" : "decode";
  require(&c, in, 4, what, "in");
  require(&c, out, 4, what, kAcc ? "acc" : "out");
  if (!c.rotation) {
    decode_plain<kAcc>(c, block, in, count, out, stream);
    return;
  }
  // Whole records: decoded into the scratch, rotated back into out; the short last record goes unrotated.
  const auto rec = static_cast<uint32_t>(codec::record_elems(c));
  const size_t records = count / rec, full = records * rec;
  if (records > 0) {
    RotationScratch scratch(records, rec, stream);
    decode_plain<false>(c, block, in, full, scratch.z, stream);
    constexpr InverseTo kTo = kAcc ? InverseTo::Accumulate : InverseTo::Store;
    launch_rotation(rotate_inverse_kernel<kTo>, records, rec, stream, what, static_cast<const float*>(scratch.z), rec,
                    records, c.seed, rotation_norm(rec), out, static_cast<const float*>(nullptr),
                    static_cast<float*>(nullptr), static_cast<const uint8_t*>(nullptr));
  }
  decode_plain<kAcc>(c, block, in + codec::encoded_bytes(c, full), count - full, out + full, stream);
}

// The codec without rotation: encode in[0, count) (with residual `res` when not null) into out.
void encode_plain(const Codec& c, uint32_t block, const float* in, size_t count, std::byte* out, float* res,
                  const EncodeCtx& ctx, uint64_t g0, unsigned long long* nonfinite_blocks, cudaStream_t stream) {
  if (count == 0) return;
  EncodeArgs a{};
  a.in = in;
  a.res = res;
  a.count = count;
  a.out = reinterpret_cast<uint8_t*>(out);
  a.block = block;
  a.key = make_key(c, ctx);
  a.g0 = g0;
  a.vec = aligned16(in) && (res == nullptr || aligned16(res));
  a.bad = nonfinite_blocks;
  const bool ef = res != nullptr;
  const bool sr = c.stochastic_rounding;
  if (ef) {
    sr ? encode_kind<true, true>(c, a, stream) : encode_kind<true, false>(c, a, stream);
  } else {
    sr ? encode_kind<false, true>(c, a, stream) : encode_kind<false, false>(c, a, stream);
  }
}

// As codec.cc's encode_rotated: per whole record y = in (+ res), z = rotate(y), codes = Q(z) (the plain codec over
// every record at once, element indices as the CPU's); with a residual, res = y - rotate^-1(decode(codes)) for the
// records that were rotated. The short last record is encoded unrotated, with its residual.
void encode_rotated(const Codec& c, uint32_t block, const float* in, size_t count, std::byte* out, const EncodeCtx& ctx,
                    unsigned long long* nonfinite_blocks, cudaStream_t stream) {
  const auto rec = static_cast<uint32_t>(codec::record_elems(c));
  const size_t records = count / rec, full = records * rec;
  float* res = ctx.residual;
  if (records > 0) {
    RotationScratch scratch(records, rec, stream);
    const float norm = rotation_norm(rec);
    if (res != nullptr) {
      launch_rotation(rotate_forward_kernel<true>, records, rec, stream, "rotation", in, static_cast<const float*>(res),
                      scratch.z, scratch.bad, rec, records, c.seed, norm);
    } else {
      launch_rotation(rotate_forward_kernel<false>, records, rec, stream, "rotation", in,
                      static_cast<const float*>(nullptr), scratch.z, scratch.bad, rec, records, c.seed, norm);
    }
    encode_plain(c, block, scratch.z, full, out, nullptr, ctx, ctx.first_elem, nonfinite_blocks, stream);
    if (res != nullptr) {
      decode_plain<false>(c, block, out, full, scratch.z, stream);
      launch_rotation(rotate_inverse_kernel<InverseTo::Residual>, records, rec, stream, "rotation (residual)",
                      static_cast<const float*>(scratch.z), rec, records, c.seed, norm, static_cast<float*>(nullptr),
                      in, res, static_cast<const uint8_t*>(scratch.bad));
    }
  }
  encode_plain(c, block, in + full, count - full, out + codec::encoded_bytes(c, full), res ? res + full : nullptr, ctx,
               ctx.first_elem + full, nonfinite_blocks, stream);
}

}  // namespace

void encode(const Codec& c, const float* in, size_t count, std::byte* out, const EncodeCtx& ctx,
            unsigned long long* nonfinite_blocks, cudaStream_t stream) {
  const uint32_t block = codec::block_elems(c);  // validates c
  if (count == 0) return;
  require(&c, in, 4, "encode", "in");
  require(&c, out, 4, "encode", "out");
  if (ctx.residual) {
    if (c.kind == CodecKind::SignVote)
      fail(&c, "encode: ctx.residual must be null (majority vote has no error feedback)");
    require(&c, ctx.residual, 4, "encode", "ctx.residual");
  }
  if (nonfinite_blocks) require(&c, nonfinite_blocks, 8, "encode", "nonfinite_blocks");
  const size_t in_bytes = count * sizeof(float);
  const size_t out_bytes = codec::encoded_bytes(c, count);
  check_no_overlap(in, in_bytes, out, out_bytes, "cuda codec: encode: in and out overlap");
  if (ctx.residual) {
    check_no_overlap(ctx.residual, in_bytes, in, in_bytes, "cuda codec: encode: ctx.residual overlaps in");
    check_no_overlap(ctx.residual, in_bytes, out, out_bytes, "cuda codec: encode: ctx.residual overlaps out");
  }
  if (c.rotation) {
    encode_rotated(c, block, in, count, out, ctx, nonfinite_blocks, stream);
  } else {
    encode_plain(c, block, in, count, out, ctx.residual, ctx, ctx.first_elem, nonfinite_blocks, stream);
  }
}

void decode(const Codec& c, const std::byte* in, size_t count, float* out, cudaStream_t stream) {
  decode_any<false>(c, in, count, out, stream);
}

void decode_accumulate(const Codec& c, const std::byte* in, size_t count, float* acc, cudaStream_t stream) {
  decode_any<true>(c, in, count, acc, stream);
}

void vote_accumulate(const std::byte* in, size_t count, int32_t* votes, cudaStream_t stream) {
  if (count == 0) return;
  require(nullptr, in, 4, "vote_accumulate", "in");
  require(nullptr, votes, 4, "vote_accumulate", "votes");
  CHORUS_LAUNCH(vote_accumulate_kernel, count, "vote_accumulate", reinterpret_cast<const uint8_t*>(in), count, votes);
}

void vote_finalize(const int32_t* votes, size_t count, float* out, cudaStream_t stream) {
  if (count == 0) return;
  require(nullptr, votes, 4, "vote_finalize", "votes");
  require(nullptr, out, 4, "vote_finalize", "out");
  CHORUS_LAUNCH(vote_finalize_kernel, count, "vote_finalize", votes, count, out);
}

void vote_encode_result(const int32_t* votes, size_t count, std::byte* out, cudaStream_t stream) {
  if (count == 0) return;
  require(nullptr, votes, 4, "vote_encode_result", "votes");
  require(nullptr, out, 4, "vote_encode_result", "out");
  CHORUS_LAUNCH(vote_result_kernel, (count + 31) / 32 * 32, "vote_encode_result", votes, count,
                reinterpret_cast<uint8_t*>(out));
}

}  // namespace chorus::kernels::cuda
