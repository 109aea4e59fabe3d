// CPU compression codecs (see codec.h for the contract and docs/compression.md for the formats).
//
// Shape of the code: one entry point per codec kind, compiled for several ISAs (target_clones, as in reduce.cc), that
// dispatches on (error feedback, stochastic rounding) to a loop over records; each record is handled by an inlined
// block function made of plain loops over the block's elements, which GCC vectorises at -O2/-O3. Per block, the
// input y = x (+ residual) is read twice (its maximum magnitude, then the codes): the block is in L1 by then, and
// recomputing x + e is cheaper than a stack copy and gives the same bits both times.
//
// Rounding to an integer uses the 1.5 * 2^23 trick (adding and subtracting it rounds to nearest-even for |v| < 2^22
// under the default rounding mode), which every vector ISA has, instead of rintf, which GCC leaves scalar without
// SSE4.1.
#include "kernels/cpu/codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cpu/float_types.h"

// As in reduce.cc: results must not depend on the ISA clone (no contraction into FMA), and without trapping math
// GCC evaluates both arms of the selects below unconditionally, which is what lets the loops vectorise.
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off", "no-trapping-math")
#endif

#ifndef CHORUS_CODEC_CLONES
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__gnu_linux__) && \
    !defined(__SANITIZE_THREAD__) && !defined(__SANITIZE_ADDRESS__)
#define CHORUS_CODEC_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define CHORUS_CODEC_CLONES
#endif
#endif
#define CHORUS_ALWAYS_INLINE inline __attribute__((always_inline))

namespace chorus::kernels::codec {
namespace {

template <typename To, typename From>
CHORUS_ALWAYS_INLINE constexpr To bit_cast(From v) {
  return __builtin_bit_cast(To, v);
}

constexpr uint32_t kAbsMask = 0x7fffffffu;
constexpr uint32_t kInfBits = 0x7f800000u;
constexpr uint32_t kNaNBits = 0x7fc00000u;
constexpr float kRoundMagic = 0x1.8p23f;  // adding it rounds |v| < 2^22 to an integer, nearest-even

constexpr uint32_t kInt8MaxBlock = 1024;
// The longest record the Hadamard rotation takes (sign1 blocks up to 4096; every int8 block).
constexpr uint32_t kRotationMaxRecord = 4096;
constexpr uint32_t kSign1MaxBlock = uint32_t{1} << 30;
constexpr uint32_t kMxBlock = 32;   // OCP MX: k = 32 elements per shared scale
constexpr size_t kFp8Record = 128;  // 4 MX blocks: 4 E8M0 bytes make the record's scales 4-byte aligned
constexpr size_t kInt4Block = 32;
constexpr size_t kInt4Record = 64;  // 2 fp16 scales
constexpr size_t kWordBits = 32;    // sign bits are packed in little-endian uint32 words, bit j = element j
constexpr uint8_t kE8M0NaN = 0xff;
constexpr uint16_t kHalfNaN = 0x7e00;
constexpr uint16_t kHalfMax = 0x7bff;  // 65504

CHORUS_ALWAYS_INLINE constexpr float pow2f(int e) {  // 2^e for e in [-126, 127]
  return bit_cast<float>(static_cast<uint32_t>(e + 127) << 23);
}

CHORUS_ALWAYS_INLINE size_t round_up4(size_t n) { return (n + 3) & ~size_t{3}; }
CHORUS_ALWAYS_INLINE size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

CHORUS_ALWAYS_INLINE void store_f32(std::byte* p, float v) { std::memcpy(p, &v, 4); }
CHORUS_ALWAYS_INLINE float load_f32(const std::byte* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}
CHORUS_ALWAYS_INLINE void store_u32(std::byte* p, uint32_t v) { std::memcpy(p, &v, 4); }
CHORUS_ALWAYS_INLINE uint32_t load_u32(const std::byte* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Nearest-even integer of v, |v| < 2^22, as int32.
CHORUS_ALWAYS_INLINE int32_t round_int(float v) {
  return static_cast<int32_t>(bit_cast<uint32_t>(v + kRoundMagic) - bit_cast<uint32_t>(kRoundMagic));
}
// floor(v), |v| < 2^22.
CHORUS_ALWAYS_INLINE int32_t floor_int(float v) {
  const int32_t r = round_int(v);
  return r - (static_cast<float>(r) > v ? 1 : 0);
}
// A uniform variate in [0, 1) from 24 of the random word's bits.
CHORUS_ALWAYS_INLINE float uniform01(uint32_t r) { return static_cast<float>(static_cast<int32_t>(r >> 8)) * 0x1p-24f; }

// ---- Counter-based random numbers: Philox4x32-10 (Salmon, Moraes, Dror, Shaw, SC 2011) ----

constexpr uint32_t kPhiloxM0 = 0xD2511F53u;
constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;
constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;
constexpr int kPhiloxRounds = 10;

// SplitMix64's output function (Steele, Lea, Flood, OOPSLA 2014): mixes (seed, rank) into one Philox key.
constexpr uint64_t mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

struct SrKey {
  uint32_t k0, k1;            // Philox key
  uint32_t step_lo, step_hi;  // counter words 2 and 3
};

SrKey make_key(const Codec& c, const EncodeCtx& ctx) {
  const uint64_t k = mix64(c.seed ^ mix64(ctx.rank));
  return {static_cast<uint32_t>(k), static_cast<uint32_t>(k >> 32), static_cast<uint32_t>(ctx.step),
          static_cast<uint32_t>(ctx.step >> 32)};
}

// Random words of at most this many elements are drawn at once (the largest int8 block; a multiple of the fp8 and
// int4 records).
constexpr size_t kMaxBatch = kInt8MaxBlock;
static_assert(kMaxBatch % kFp8Record == 0 && kMaxBatch % kInt4Record == 0);

// rnd[i] = word (g0 + i) % 4 of Philox4x32-10 at counter ((g0 + i) / 4 low, high, step low, high), i < n <= kMaxBatch.
// The rounds run over arrays of counters (structure of arrays), so the 32x32->64 multiplies vectorise.
CHORUS_ALWAYS_INLINE void fill_random(const SrKey& key, uint64_t g0, size_t n, uint32_t* rnd) {
  constexpr size_t kMaxGroups = kMaxBatch / 4 + 2;
  uint32_t c0[kMaxGroups], c1[kMaxGroups], c2[kMaxGroups], c3[kMaxGroups];
  const uint64_t q0 = g0 >> 2;
  const size_t off = static_cast<size_t>(g0 & 3);
  const size_t groups = (off + n + 3) / 4;
  for (size_t k = 0; k < groups; ++k) {
    const uint64_t q = q0 + k;
    c0[k] = static_cast<uint32_t>(q);
    c1[k] = static_cast<uint32_t>(q >> 32);
    c2[k] = key.step_lo;
    c3[k] = key.step_hi;
  }
  uint32_t k0 = key.k0, k1 = key.k1;
  for (int r = 0; r < kPhiloxRounds; ++r) {
    for (size_t k = 0; k < groups; ++k) {
      const uint64_t p0 = static_cast<uint64_t>(kPhiloxM0) * c0[k];
      const uint64_t p1 = static_cast<uint64_t>(kPhiloxM1) * c2[k];
      const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1[k] ^ k0;
      const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3[k] ^ k1;
      c0[k] = n0;
      c1[k] = static_cast<uint32_t>(p1);
      c2[k] = n2;
      c3[k] = static_cast<uint32_t>(p0);
    }
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
  uint32_t tmp[4 * kMaxGroups];
  for (size_t k = 0; k < groups; ++k) {
    tmp[4 * k] = c0[k];
    tmp[4 * k + 1] = c1[k];
    tmp[4 * k + 2] = c2[k];
    tmp[4 * k + 3] = c3[k];
  }
  std::memcpy(rnd, tmp + off, n * sizeof(uint32_t));
}

// ---- Shared block pieces ----

// y_j = x_j (+ e_j): the value that is quantised.
template <bool kEF>
CHORUS_ALWAYS_INLINE float load_y(const float* x, const float* e, size_t j) {
  if constexpr (kEF) {
    return x[j] + e[j];
  } else {
    return x[j];
  }
}

// The largest |y_j| as fp32 bits. Integer maximum: NaN bits order above inf above every finite value, so a
// non-finite block is recognised from the result alone, and the reduction vectorises without fast-math.
template <bool kEF>
CHORUS_ALWAYS_INLINE uint32_t amax_bits(const float* x, const float* e, size_t n) {
  uint32_t m = 0;
  for (size_t j = 0; j < n; ++j) {
    const uint32_t a = bit_cast<uint32_t>(load_y<kEF>(x, e, j)) & kAbsMask;
    m = a > m ? a : m;
  }
  return m;
}

// ---- int8: [fp32 scale][n int8 codes, zero-padded to 4 bytes] per block ----

template <bool kEF, bool kSR>
CHORUS_ALWAYS_INLINE bool int8_block(const float* x, float* e, const uint32_t* rnd, size_t n, std::byte* rec) {
  auto* codes = reinterpret_cast<int8_t*>(rec + 4);
  std::memset(codes + (n & ~size_t{3}), 0, round_up4(n) - (n & ~size_t{3}));
  const uint32_t mb = amax_bits<kEF>(x, e, n);
  if (mb >= kInfBits) {
    store_f32(rec, bit_cast<float>(kNaNBits));
    std::memset(codes, 0, n);
    return true;
  }
  const float amax = bit_cast<float>(mb);
  const float scale = amax / 127.0f;
  // A tiny (subnormal) maximum would make 127 / amax infinite; capping it keeps every product finite and below 127.
  const float inv = mb == 0 ? 0.0f : std::min(127.0f / amax, std::numeric_limits<float>::max());
  store_f32(rec, scale);
  for (size_t j = 0; j < n; ++j) {
    const float y = load_y<kEF>(x, e, j);
    const float v = y * inv;
    int32_t q;
    if constexpr (kSR) {
      q = floor_int(v + uniform01(rnd[j]));
    } else {
      q = round_int(v);
    }
    q = q > 127 ? 127 : q;
    q = q < -127 ? -127 : q;
    codes[j] = static_cast<int8_t>(q);
    if constexpr (kEF) e[j] = y - static_cast<float>(q) * scale;
  }
  return false;
}

template <bool kAcc>
CHORUS_ALWAYS_INLINE void int8_decode_block(const std::byte* rec, size_t n, float* out) {
  const float scale = load_f32(rec);
  const auto* codes = reinterpret_cast<const int8_t*>(rec + 4);
  for (size_t j = 0; j < n; ++j) {
    const float v = static_cast<float>(codes[j]) * scale;
    if constexpr (kAcc) {
      out[j] += v;
    } else {
      out[j] = v;
    }
  }
}

// ---- fp8 e4m3 with E8M0 scales (OCP MX v1.0): [4 scale bytes][n e4m3 codes, zero-padded to 4 bytes] per record ----

// E4M3 code of v, |v| <= 448 and finite, nearest-even. Normal range: rebias the fp32 exponent and round the mantissa
// to 3 bits by integer addition (a carry moves into the exponent). Subnormal range (|v| < 2^-6): adding 2^14 puts
// the E4M3 subnormal step 2^-9 at the fp32 last place, so the FPU rounds, and the low bits are the code.
CHORUS_ALWAYS_INLINE uint8_t e4m3_encode(float v) {
  const uint32_t x = bit_cast<uint32_t>(v);
  const uint32_t sign = (x >> 24) & 0x80u;
  const uint32_t ax = x & kAbsMask;
  uint32_t r = ax - (120u << 23);
  r = (r + 0x7ffffu + ((r >> 20) & 1u)) >> 20;
  const uint32_t sub = bit_cast<uint32_t>(bit_cast<float>(ax) + 0x1p14f) - bit_cast<uint32_t>(0x1p14f);
  r = ax < (121u << 23) ? sub : r;
  r = r < 0x7eu ? r : 0x7eu;
  return static_cast<uint8_t>(r | sign);
}

// Stochastic rounding to E4M3, |v| <= 448: the 20 dropped mantissa bits plus 20 random bits carry into the kept
// ones with probability (dropped / 2^20), which is exactly unbiased; subnormals: floor(|v| * 2^9 + u).
CHORUS_ALWAYS_INLINE uint8_t e4m3_encode_sr(float v, uint32_t rnd) {
  const uint32_t x = bit_cast<uint32_t>(v);
  const uint32_t sign = (x >> 24) & 0x80u;
  const uint32_t ax = x & kAbsMask;
  uint32_t r = (ax - (120u << 23) + (rnd >> 12)) >> 20;
  const uint32_t sub = static_cast<uint32_t>(floor_int(bit_cast<float>(ax) * 512.0f + uniform01(rnd)));
  r = ax < (121u << 23) ? sub : r;
  r = r < 0x7eu ? r : 0x7eu;
  return static_cast<uint8_t>(r | sign);
}

// Value of an E4M3 code (any byte; S.1111.111 is NaN).
CHORUS_ALWAYS_INLINE float e4m3_decode(uint8_t c) {
  const uint32_t mag = c & 0x7fu;
  const uint32_t normal = (mag << 20) + (120u << 23);
  const uint32_t sub = bit_cast<uint32_t>(static_cast<float>(static_cast<int32_t>(mag)) * 0x1p-9f);
  uint32_t bits = mag < 8u ? sub : normal;
  bits = mag == 0x7fu ? kNaNBits : bits;
  return bit_cast<float>(bits | (static_cast<uint32_t>(c & 0x80u) << 24));
}

// Value of an E8M0 scale: 2^(code - 127), 0xff is NaN.
CHORUS_ALWAYS_INLINE float e8m0_decode(uint8_t c) {
  if (c == kE8M0NaN) return bit_cast<float>(kNaNBits);
  if (c == 0) return bit_cast<float>(0x00400000u);  // 2^-127, subnormal in fp32
  return bit_cast<float>(static_cast<uint32_t>(c) << 23);
}

template <bool kEF, bool kSR>
CHORUS_ALWAYS_INLINE bool fp8_block(const float* x, float* e, const uint32_t* rnd, size_t n, uint8_t* scale_code,
                                    uint8_t* codes) {
  const uint32_t mb = amax_bits<kEF>(x, e, n);
  if (mb >= kInfBits || mb == 0) {
    // Non-finite: NaN scale. All zero: scale 2^-127 and zero codes decode to exact zeros.
    *scale_code = mb == 0 ? 0 : kE8M0NaN;
    std::memset(codes, 0, n);
    if constexpr (kEF) {
      if (mb == 0) std::fill(e, e + n, 0.0f);  // y == 0, so the residual y - Q(y) is 0
    }
    return mb != 0;
  }
  // Shared exponent: the spec's floor(log2(amax)) - emax(E4M3 = 8), plus one when amax's mantissa exceeds 1.75 (the
  // mantissa of 448), so that amax / 2^s <= 448: the largest element never saturates, whatever the rounding.
  const int biased = static_cast<int>(mb >> 23);
  const int exp_amax = biased == 0 ? -127 : biased - 127;
  int s = exp_amax - 8 + ((mb & 0x7fffffu) > 0x600000u ? 1 : 0);
  s = s < -127 ? -127 : s;  // amax < 2^-119: the scale's floor; the codes then use fewer bits
  *scale_code = static_cast<uint8_t>(s + 127);
  const float inv = pow2f(-s);  // -s <= 127 and -s >= -120 (amax <= FLT_MAX): a normal power of two
  const float scale = e8m0_decode(*scale_code);
  for (size_t j = 0; j < n; ++j) {
    const float y = load_y<kEF>(x, e, j);
    const float v = y * inv;
    uint8_t q;
    if constexpr (kSR) {
      q = e4m3_encode_sr(v, rnd[j]);
    } else {
      q = e4m3_encode(v);
    }
    codes[j] = q;
    if constexpr (kEF) e[j] = y - e4m3_decode(q) * scale;
  }
  return false;
}

template <bool kAcc>
CHORUS_ALWAYS_INLINE void fp8_decode_block(float scale, const uint8_t* codes, size_t n, float* out) {
  for (size_t j = 0; j < n; ++j) {
    const float v = e4m3_decode(codes[j]) * scale;
    if constexpr (kAcc) {
      out[j] += v;
    } else {
      out[j] = v;
    }
  }
}

// ---- int4: [2 fp16 scales][n/2 bytes of two's complement nibbles, even element low, zero-padded to 4] per record ----

// The smallest fp16 (as bits) >= t, for finite t >= 0; saturates at 65504 (the block is then clipped).
CHORUS_ALWAYS_INLINE uint16_t half_round_up(float t) {
  if (t >= 65504.0f) return kHalfMax;
  if (t < 0x1p-14f) return static_cast<uint16_t>(std::ceil(t * 0x1p24f));  // subnormal step 2^-24; exact product
  const uint32_t b = bit_cast<uint32_t>(t);
  uint32_t h = (b >> 13) - (112u << 10);
  h += (b & 0x1fffu) != 0 ? 1u : 0u;  // a carry out of the mantissa moves into the exponent
  return static_cast<uint16_t>(h);
}

template <bool kEF, bool kSR>
CHORUS_ALWAYS_INLINE bool int4_block(const float* x, float* e, const uint32_t* rnd, size_t n, std::byte* scale_p,
                                     uint8_t* codes) {
  const uint32_t mb = amax_bits<kEF>(x, e, n);
  const size_t nbytes = (n + 1) / 2;
  if (mb >= kInfBits) {
    std::memcpy(scale_p, &kHalfNaN, 2);
    std::memset(codes, 0, nbytes);
    return true;
  }
  // Rounding the scale up keeps |y| / scale <= 7: the codes never clip, unless the scale saturated at 65504.
  const uint16_t h = half_round_up(bit_cast<float>(mb) / 7.0f);
  std::memcpy(scale_p, &h, 2);
  const float scale = half_to_float(h);
  const float inv = h == 0 ? 0.0f : 1.0f / scale;  // scale >= 2^-24, so inv is finite
  int8_t q[kInt4Block + 1];
  for (size_t j = 0; j < n; ++j) {
    const float y = load_y<kEF>(x, e, j);
    const float v = y * inv;
    int32_t k;
    if constexpr (kSR) {
      k = floor_int(v + uniform01(rnd[j]));
    } else {
      k = round_int(v);
    }
    k = k > 7 ? 7 : k;
    k = k < -7 ? -7 : k;
    q[j] = static_cast<int8_t>(k);
    if constexpr (kEF) e[j] = y - static_cast<float>(k) * scale;
  }
  q[n] = 0;
  for (size_t b = 0; b < nbytes; ++b) {
    codes[b] = static_cast<uint8_t>((static_cast<uint8_t>(q[2 * b]) & 0x0fu) |
                                    ((static_cast<uint8_t>(q[2 * b + 1]) & 0x0fu) << 4));
  }
  return false;
}

// Sign-extends a two's complement nibble.
CHORUS_ALWAYS_INLINE int32_t nibble_value(uint32_t v) { return static_cast<int32_t>((v & 0x0fu) ^ 0x08u) - 8; }

template <bool kAcc>
CHORUS_ALWAYS_INLINE void int4_decode_block(float scale, const uint8_t* codes, size_t n, float* out) {
  const size_t pairs = n / 2;
  for (size_t b = 0; b < pairs; ++b) {
    const float lo = static_cast<float>(nibble_value(codes[b])) * scale;
    const float hi = static_cast<float>(nibble_value(codes[b] >> 4u)) * scale;
    if constexpr (kAcc) {
      out[2 * b] += lo;
      out[2 * b + 1] += hi;
    } else {
      out[2 * b] = lo;
      out[2 * b + 1] = hi;
    }
  }
  if (n & 1) {
    const float lo = static_cast<float>(nibble_value(codes[pairs])) * scale;
    if constexpr (kAcc) {
      out[n - 1] += lo;
    } else {
      out[n - 1] = lo;
    }
  }
}

// ---- Sign bits, shared by sign1 and sign_vote ----

// Bit j of the word is set where y_j < 0 (so +0, -0 and NaN give 0, i.e. +1), for n <= 32 elements.
template <bool kEF>
CHORUS_ALWAYS_INLINE uint32_t sign_word(const float* x, const float* e, size_t n) {
  uint32_t w = 0;
  for (size_t j = 0; j < n; ++j) w |= static_cast<uint32_t>(load_y<kEF>(x, e, j) < 0.0f) << j;
  return w;
}

// out[j] (+)= value with its sign bit flipped where bit j is set.
template <bool kAcc>
CHORUS_ALWAYS_INLINE void sign_decode_word(uint32_t w, float value, size_t n, float* out) {
  const uint32_t vb = bit_cast<uint32_t>(value);
  for (size_t j = 0; j < n; ++j) {
    const float v = bit_cast<float>(vb ^ (((w >> j) & 1u) << 31));
    if constexpr (kAcc) {
      out[j] += v;
    } else {
      out[j] = v;
    }
  }
}

// ---- sign1: [fp32 scale][ceil(n/32) words] per block; scale = ||y||_2 / sqrt(n) (1-bit Adam) ----

template <bool kEF>
CHORUS_ALWAYS_INLINE bool sign1_block(const float* x, float* e, size_t n, std::byte* rec) {
  const size_t words = ceil_div(n, kWordBits);
  std::byte* wp = rec + 4;
  const uint32_t mb = amax_bits<kEF>(x, e, n);
  if (mb >= kInfBits || mb == 0) {
    store_f32(rec, mb == 0 ? 0.0f : bit_cast<float>(kNaNBits));
    std::memset(wp, 0, words * 4);
    if constexpr (kEF) {
      if (mb == 0) std::fill(e, e + n, 0.0f);
    }
    return mb != 0;
  }
  // The sum of squares of y / 2^ea (ea = amax's exponent) lies in [1, 4n): no overflow or underflow whatever the
  // magnitudes. Sixteen partial sums: a float reduction vectorises only when its lanes are explicit.
  const int biased = static_cast<int>(mb >> 23);
  const int ea = (biased == 0 ? 1 : biased) - 127;
  const float p = std::ldexp(1.0f, -ea);
  constexpr size_t kLanes = 16;
  float acc[kLanes] = {};
  size_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (size_t l = 0; l < kLanes; ++l) {
      const float t = load_y<kEF>(x, e, j + l) * p;
      acc[l] += t * t;
    }
  }
  for (size_t l = 0; j < n; ++j, ++l) {
    const float t = load_y<kEF>(x, e, j) * p;
    acc[l] += t * t;
  }
  float sum = 0.0f;
  for (size_t l = 0; l < kLanes; ++l) sum += acc[l];
  const float scale = std::ldexp(std::sqrt(sum / static_cast<float>(n)), ea);
  store_f32(rec, scale);
  for (size_t w = 0; w < words; ++w) {
    const size_t base = w * kWordBits;
    const size_t m = std::min(kWordBits, n - base);
    const uint32_t word = sign_word<kEF>(x + base, kEF ? e + base : nullptr, m);
    store_u32(wp + 4 * w, word);
    if constexpr (kEF) {
      const uint32_t sb = bit_cast<uint32_t>(scale);
      for (size_t i = 0; i < m; ++i) {
        const float y = x[base + i] + e[base + i];
        e[base + i] = y - bit_cast<float>(sb ^ (((word >> i) & 1u) << 31));
      }
    }
  }
  return false;
}

// ---- Record loops ----

// Bytes of a record of n elements (n <= the record length).
size_t record_bytes(CodecKind kind, size_t n) {
  switch (kind) {
    case CodecKind::Int8:
    case CodecKind::Fp8E4M3: return 4 + round_up4(n);
    case CodecKind::Int4: return 4 + round_up4(ceil_div(n, 2));
    case CodecKind::Sign1: return 4 + 4 * ceil_div(n, kWordBits);
    case CodecKind::SignVote: return 4;
  }
  return 0;
}

template <bool kEF, bool kSR>
CHORUS_ALWAYS_INLINE size_t encode_int8_loop(const float* in, size_t count, std::byte* out, float* res, uint32_t block,
                                             const SrKey& key, uint64_t g0) {
  uint32_t rnd[kMaxBatch];
  size_t bad = 0;
  for (size_t i = 0; i < count; i += block) {
    const size_t n = std::min<size_t>(block, count - i);
    if constexpr (kSR) fill_random(key, g0 + i, n, rnd);
    bad += int8_block<kEF, kSR>(in + i, kEF ? res + i : nullptr, rnd, n, out) ? 1 : 0;
    out += 4 + round_up4(n);
  }
  return bad;
}

template <bool kEF, bool kSR>
CHORUS_ALWAYS_INLINE size_t encode_fp8_loop(const float* in, size_t count, std::byte* out, float* res, const SrKey& key,
                                            uint64_t g0) {
  uint32_t rnd[kMaxBatch];  // drawn for kMaxBatch elements (8 records) at a time: Philox's loops need the length
  size_t bad = 0;
  for (size_t i = 0; i < count; i += kFp8Record) {
    const size_t n = std::min(kFp8Record, count - i);
    if constexpr (kSR) {
      if (i % kMaxBatch == 0) fill_random(key, g0 + i, std::min(kMaxBatch, count - i), rnd);
    }
    auto* scales = reinterpret_cast<uint8_t*>(out);
    auto* codes = reinterpret_cast<uint8_t*>(out + 4);
    store_u32(out, 0);  // scale bytes of absent blocks in a short record stay 0
    std::memset(codes + (n & ~size_t{3}), 0, round_up4(n) - (n & ~size_t{3}));
    for (size_t b = 0; b * kMxBlock < n; ++b) {
      const size_t o = b * kMxBlock;
      const size_t m = std::min<size_t>(kMxBlock, n - o);
      const uint32_t* r = rnd + i % kMaxBatch + o;
      bad += fp8_block<kEF, kSR>(in + i + o, kEF ? res + i + o : nullptr, r, m, scales + b, codes + o) ? 1 : 0;
    }
    out += 4 + round_up4(n);
  }
  return bad;
}

template <bool kEF, bool kSR>
CHORUS_ALWAYS_INLINE size_t encode_int4_loop(const float* in, size_t count, std::byte* out, float* res,
                                             const SrKey& key, uint64_t g0) {
  uint32_t rnd[kMaxBatch];  // 16 records at a time
  size_t bad = 0;
  for (size_t i = 0; i < count; i += kInt4Record) {
    const size_t n = std::min(kInt4Record, count - i);
    if constexpr (kSR) {
      if (i % kMaxBatch == 0) fill_random(key, g0 + i, std::min(kMaxBatch, count - i), rnd);
    }
    auto* codes = reinterpret_cast<uint8_t*>(out + 4);
    const size_t nbytes = ceil_div(n, 2);
    store_u32(out, 0);
    std::memset(codes + (nbytes & ~size_t{3}), 0, round_up4(nbytes) - (nbytes & ~size_t{3}));
    for (size_t b = 0; b * kInt4Block < n; ++b) {
      const size_t o = b * kInt4Block;
      const size_t m = std::min(kInt4Block, n - o);
      const uint32_t* r = rnd + i % kMaxBatch + o;
      bad += int4_block<kEF, kSR>(in + i + o, kEF ? res + i + o : nullptr, r, m, out + 2 * b, codes + o / 2) ? 1 : 0;
    }
    out += 4 + round_up4(nbytes);
  }
  return bad;
}

template <bool kEF>
CHORUS_ALWAYS_INLINE size_t encode_sign1_loop(const float* in, size_t count, std::byte* out, float* res,
                                              uint32_t block) {
  size_t bad = 0;
  for (size_t i = 0; i < count; i += block) {
    const size_t n = std::min<size_t>(block, count - i);
    bad += sign1_block<kEF>(in + i, kEF ? res + i : nullptr, n, out) ? 1 : 0;
    out += 4 + 4 * ceil_div(n, kWordBits);
  }
  return bad;
}

// ---- Entry points, one per kind, compiled per ISA ----

CHORUS_CODEC_CLONES size_t encode_int8(const float* in, size_t count, std::byte* out, float* res, uint32_t block,
                                       bool sr, const SrKey& key, uint64_t g0) {
  if (res) {
    return sr ? encode_int8_loop<true, true>(in, count, out, res, block, key, g0)
              : encode_int8_loop<true, false>(in, count, out, res, block, key, g0);
  }
  return sr ? encode_int8_loop<false, true>(in, count, out, res, block, key, g0)
            : encode_int8_loop<false, false>(in, count, out, res, block, key, g0);
}

CHORUS_CODEC_CLONES size_t encode_fp8(const float* in, size_t count, std::byte* out, float* res, bool sr,
                                      const SrKey& key, uint64_t g0) {
  if (res) {
    return sr ? encode_fp8_loop<true, true>(in, count, out, res, key, g0)
              : encode_fp8_loop<true, false>(in, count, out, res, key, g0);
  }
  return sr ? encode_fp8_loop<false, true>(in, count, out, res, key, g0)
            : encode_fp8_loop<false, false>(in, count, out, res, key, g0);
}

CHORUS_CODEC_CLONES size_t encode_int4(const float* in, size_t count, std::byte* out, float* res, bool sr,
                                       const SrKey& key, uint64_t g0) {
  if (res) {
    return sr ? encode_int4_loop<true, true>(in, count, out, res, key, g0)
              : encode_int4_loop<true, false>(in, count, out, res, key, g0);
  }
  return sr ? encode_int4_loop<false, true>(in, count, out, res, key, g0)
            : encode_int4_loop<false, false>(in, count, out, res, key, g0);
}

CHORUS_CODEC_CLONES size_t encode_sign1(const float* in, size_t count, std::byte* out, float* res, uint32_t block) {
  return res ? encode_sign1_loop<true>(in, count, out, res, block)
             : encode_sign1_loop<false>(in, count, out, res, block);
}

CHORUS_CODEC_CLONES size_t encode_vote(const float* in, size_t count, std::byte* out) {
  size_t bad = 0;
  for (size_t i = 0; i < count; i += kWordBits) {
    const size_t n = std::min(kWordBits, count - i);
    uint32_t nan = 0;
    for (size_t j = 0; j < n; ++j) nan |= (bit_cast<uint32_t>(in[i + j]) & kAbsMask) > kInfBits ? 1u : 0u;
    bad += nan;
    store_u32(out, sign_word<false>(in + i, nullptr, n));
    out += 4;
  }
  return bad;
}

template <bool kAcc>
CHORUS_ALWAYS_INLINE void decode_int8_loop(const std::byte* in, size_t count, float* out, uint32_t block) {
  for (size_t i = 0; i < count; i += block) {
    const size_t n = std::min<size_t>(block, count - i);
    int8_decode_block<kAcc>(in, n, out + i);
    in += 4 + round_up4(n);
  }
}

template <bool kAcc>
CHORUS_ALWAYS_INLINE void decode_fp8_loop(const std::byte* in, size_t count, float* out) {
  for (size_t i = 0; i < count; i += kFp8Record) {
    const size_t n = std::min(kFp8Record, count - i);
    const auto* scales = reinterpret_cast<const uint8_t*>(in);
    const auto* codes = reinterpret_cast<const uint8_t*>(in + 4);
    for (size_t b = 0; b * kMxBlock < n; ++b) {
      const size_t o = b * kMxBlock;
      fp8_decode_block<kAcc>(e8m0_decode(scales[b]), codes + o, std::min<size_t>(kMxBlock, n - o), out + i + o);
    }
    in += 4 + round_up4(n);
  }
}

template <bool kAcc>
CHORUS_ALWAYS_INLINE void decode_int4_loop(const std::byte* in, size_t count, float* out) {
  for (size_t i = 0; i < count; i += kInt4Record) {
    const size_t n = std::min(kInt4Record, count - i);
    const auto* codes = reinterpret_cast<const uint8_t*>(in + 4);
    for (size_t b = 0; b * kInt4Block < n; ++b) {
      uint16_t h;
      std::memcpy(&h, in + 2 * b, 2);
      const size_t o = b * kInt4Block;
      int4_decode_block<kAcc>(half_to_float(h), codes + o / 2, std::min(kInt4Block, n - o), out + i + o);
    }
    in += 4 + round_up4(ceil_div(n, 2));
  }
}

template <bool kAcc>
CHORUS_ALWAYS_INLINE void decode_sign1_loop(const std::byte* in, size_t count, float* out, uint32_t block) {
  for (size_t i = 0; i < count; i += block) {
    const size_t n = std::min<size_t>(block, count - i);
    const float scale = load_f32(in);
    for (size_t w = 0; w * kWordBits < n; ++w) {
      const size_t base = w * kWordBits;
      sign_decode_word<kAcc>(load_u32(in + 4 + 4 * w), scale, std::min(kWordBits, n - base), out + i + base);
    }
    in += 4 + 4 * ceil_div(n, kWordBits);
  }
}

template <bool kAcc>
CHORUS_ALWAYS_INLINE void decode_vote_loop(const std::byte* in, size_t count, float* out) {
  for (size_t i = 0; i < count; i += kWordBits) {
    sign_decode_word<kAcc>(load_u32(in), 1.0f, std::min(kWordBits, count - i), out + i);
    in += 4;
  }
}

CHORUS_CODEC_CLONES void decode_int8(const std::byte* in, size_t count, float* out, uint32_t block, bool acc) {
  acc ? decode_int8_loop<true>(in, count, out, block) : decode_int8_loop<false>(in, count, out, block);
}
CHORUS_CODEC_CLONES void decode_fp8(const std::byte* in, size_t count, float* out, bool acc) {
  acc ? decode_fp8_loop<true>(in, count, out) : decode_fp8_loop<false>(in, count, out);
}
CHORUS_CODEC_CLONES void decode_int4(const std::byte* in, size_t count, float* out, bool acc) {
  acc ? decode_int4_loop<true>(in, count, out) : decode_int4_loop<false>(in, count, out);
}
CHORUS_CODEC_CLONES void decode_sign1(const std::byte* in, size_t count, float* out, uint32_t block, bool acc) {
  acc ? decode_sign1_loop<true>(in, count, out, block) : decode_sign1_loop<false>(in, count, out, block);
}
CHORUS_CODEC_CLONES void decode_vote(const std::byte* in, size_t count, float* out, bool acc) {
  acc ? decode_vote_loop<true>(in, count, out) : decode_vote_loop<false>(in, count, out);
}

CHORUS_CODEC_CLONES void vote_accumulate_impl(const std::byte* in, size_t count, int32_t* votes) {
  for (size_t i = 0; i < count; i += kWordBits) {
    const uint32_t w = load_u32(in);
    const size_t n = std::min(kWordBits, count - i);
    for (size_t j = 0; j < n; ++j) votes[i + j] += 1 - 2 * static_cast<int32_t>((w >> j) & 1u);
    in += 4;
  }
}

[[noreturn]] void fail(std::string msg) { throw Error(chorusInvalidArgument, Subsys::Kernels, std::move(msg)); }

// ---- Randomized Hadamard rotation (Codec::rotation) ----

// 2^115 as fp32 bits: a record whose largest magnitude reaches it is not rotated. The unnormalised transform adds up
// to R <= 4096 = 2^12 magnitudes before the 1 / sqrt(R) scaling, so every intermediate stays below 2^127 < FLT_MAX.
constexpr uint32_t kRotationLimitBits = 0x79000000u;

// The diagonal D as +-1.0f for each position of a record of `n` <= kRotationMaxRecord elements (n a multiple of
// 64), drawn from the seed alone (bit i % 64 of word i / 64 of a SplitMix64 stream), so every rank and both ends
// agree; position i's sign does not depend on n.
struct RotationSigns {
  alignas(64) float sign[kRotationMaxRecord];
};

void rotation_signs(uint64_t seed, RotationSigns& s, size_t n) {
  for (size_t w = 0; w < (n + 63) / 64; ++w) {
    const uint64_t bits = mix64(seed ^ mix64(0x5248545f7369676eull + w));
    for (size_t b = 0; b < 64; ++b) s.sign[w * 64 + b] = (bits >> b) & 1 ? -1.0f : 1.0f;
  }
}

// In-place unnormalised fast Walsh-Hadamard transform of v[0, n), n a power of two >= 8: the three stages inside
// each group of 8 elements in registers, then the stages of stride 8 and up over contiguous runs (which vectorise).
CHORUS_ALWAYS_INLINE void fwht(float* v, size_t n) {
  for (size_t g = 0; g < n; g += 8) {
    float* p = v + g;
    const float a0 = p[0] + p[1], a1 = p[0] - p[1], a2 = p[2] + p[3], a3 = p[2] - p[3];
    const float a4 = p[4] + p[5], a5 = p[4] - p[5], a6 = p[6] + p[7], a7 = p[6] - p[7];
    const float b0 = a0 + a2, b1 = a1 + a3, b2 = a0 - a2, b3 = a1 - a3;
    const float b4 = a4 + a6, b5 = a5 + a7, b6 = a4 - a6, b7 = a5 - a7;
    p[0] = b0 + b4, p[1] = b1 + b5, p[2] = b2 + b6, p[3] = b3 + b7;
    p[4] = b0 - b4, p[5] = b1 - b5, p[6] = b2 - b6, p[7] = b3 - b7;
  }
  for (size_t h = 8; h < n; h <<= 1)
    for (size_t i = 0; i < n; i += 2 * h)
      for (size_t j = i; j < i + h; ++j) {
        const float a = v[j], b = v[j + h];
        v[j] = a + b;
        v[j + h] = a - b;
      }
}

// z = H D y / sqrt(n), from y (may be z).
CHORUS_CODEC_CLONES void rotate_forward(const RotationSigns& s, const float* y, float* z, size_t n) {
  for (size_t j = 0; j < n; ++j) z[j] = y[j] * s.sign[j];
  fwht(z, n);
  const float norm = 1.0f / std::sqrt(static_cast<float>(n));
  for (size_t j = 0; j < n; ++j) z[j] *= norm;
}

// y = D H z / sqrt(n), in place.
CHORUS_CODEC_CLONES void rotate_inverse(const RotationSigns& s, float* v, size_t n) {
  fwht(v, n);
  const float norm = 1.0f / std::sqrt(static_cast<float>(n));
  for (size_t j = 0; j < n; ++j) v[j] *= norm * s.sign[j];
}

bool kind_valid(CodecKind k) { return static_cast<uint8_t>(k) <= static_cast<uint8_t>(CodecKind::SignVote); }

std::string prefix(const Codec& c) {
  std::string s("codec ");
  s.append(codec_name(c.kind));
  s.append(": ");
  return s;
}

// The byte ranges [a, a + na) and [b, b + nb) overlap.
bool overlap(const void* a, size_t na, const void* b, size_t nb) {
  const auto pa = reinterpret_cast<uintptr_t>(a);
  const auto pb = reinterpret_cast<uintptr_t>(b);
  return na != 0 && nb != 0 && pa < pb + nb && pb < pa + na;
}

}  // namespace

const char* codec_name(CodecKind kind) {
  switch (kind) {
    case CodecKind::Int8: return "int8";
    case CodecKind::Fp8E4M3: return "fp8_e4m3";
    case CodecKind::Int4: return "int4";
    case CodecKind::Sign1: return "sign1";
    case CodecKind::SignVote: return "sign_vote";
  }
  return "invalid";
}

CodecKind codec_kind(chorusCodec_t c) {
  static constexpr CodecKind kinds[] = {CodecKind::Int8, CodecKind::Fp8E4M3, CodecKind::Int4, CodecKind::Sign1,
                                        CodecKind::SignVote};
  return kinds[c - chorusCodecInt8];
}

CodecKind codec_kind_from_name(std::string_view name) {
  for (uint8_t k = 0; k <= static_cast<uint8_t>(CodecKind::SignVote); ++k) {
    if (name == codec_name(static_cast<CodecKind>(k))) return static_cast<CodecKind>(k);
  }
  std::string msg("codec: unknown name '");
  msg.append(name);
  msg.append("' (known: int8, fp8_e4m3, int4, sign1, sign_vote)");
  fail(std::move(msg));
}

void validate(const Codec& c) {
  if (!kind_valid(c.kind)) fail(cat("codec: invalid kind ", static_cast<int>(c.kind)));
  const uint32_t b = c.block;
  switch (c.kind) {
    case CodecKind::Int8:
      if (b != 0 && (b % 32 != 0 || b < 32 || b > kInt8MaxBlock)) {
        fail(prefix(c) + cat("block ", b, " is not a multiple of 32 in [32, 1024] (0 = default 256)"));
      }
      break;
    case CodecKind::Fp8E4M3:
    case CodecKind::Int4:
      if (b != 0 && b != 32) fail(prefix(c) + cat("block ", b, " is not 32 (the format fixes it; 0 = 32)"));
      break;
    case CodecKind::Sign1:
      if (b != 0 && (b % 32 != 0 || b > kSign1MaxBlock)) {
        fail(prefix(c) + cat("block ", b, " is not a multiple of 32 in [32, 2^30] (0 = default 2048)"));
      }
      break;
    case CodecKind::SignVote:
      if (b != 0) fail(prefix(c) + cat("block ", b, " must be 0 (sign_vote has no scales)"));
      break;
  }
  if (c.stochastic_rounding && (c.kind == CodecKind::Sign1 || c.kind == CodecKind::SignVote)) {
    fail(prefix(c) + "stochastic_rounding applies to int8, fp8_e4m3 and int4 only");
  }
  if (c.rotation && c.kind == CodecKind::SignVote) {
    fail(prefix(c) + "rotation applies to int8, fp8_e4m3, int4 and sign1 only (a vote keeps no magnitude)");
  }
  if (c.rotation && c.kind == CodecKind::Int8 && (b & (b - 1)) != 0) {
    fail(prefix(c) + cat("block ", b, " is not a power of two: the Hadamard rotation needs 32, 64, ..., 1024"));
  }
  if (c.rotation && c.kind == CodecKind::Sign1 && ((b & (b - 1)) != 0 || b > kRotationMaxRecord)) {
    fail(prefix(c) + cat("block ", b, " is not a power of two up to ", kRotationMaxRecord,
                         ": the Hadamard rotation needs 32, 64, ..., ", kRotationMaxRecord, " (0 = 2048)"));
  }
}

void validate(const Codec& c, chorusDataType_t dtype, chorusRedOp_t op) {
  validate(c);
  if (dtype != chorusFloat32 && dtype != chorusFloat16 && dtype != chorusBfloat16) {
    const char* dn = dtype_valid(dtype) ? dtype_name(dtype) : "invalid";
    fail(prefix(c) + cat("datatype ", dn, " (", static_cast<int>(dtype),
                         ") is not supported: compressed collectives take float32, float16 or bfloat16 input"));
  }
  if (op != chorusSum && op != chorusAvg) {
    const char* on = (op >= 0 && op < chorusNumOps) ? op_name(op) : "invalid";
    fail(prefix(c) + cat("op ", on, " (", static_cast<int>(op),
                         ") is not supported: codecs compress the addends of a sum (sum and avg only)"));
  }
}

uint32_t block_elems(const Codec& c) {
  validate(c);
  switch (c.kind) {
    case CodecKind::Int8: return c.block ? c.block : 256;
    case CodecKind::Fp8E4M3:
    case CodecKind::Int4: return 32;
    case CodecKind::Sign1: return c.block ? c.block : 2048;
    case CodecKind::SignVote: return static_cast<uint32_t>(kWordBits);
  }
  return 0;
}

size_t record_elems(const Codec& c) {
  const uint32_t b = block_elems(c);
  switch (c.kind) {
    case CodecKind::Fp8E4M3: return kFp8Record;
    case CodecKind::Int4: return kInt4Record;
    default: return b;
  }
}

size_t encoded_bytes(const Codec& c, size_t count) {
  const size_t r = record_elems(c);
  const size_t full = count / r;
  const size_t tail = count % r;
  return full * record_bytes(c.kind, r) + (tail ? record_bytes(c.kind, tail) : 0);
}

namespace {

// The codec without rotation on in[0, count); `block` = block_elems(c).
size_t encode_plain(const Codec& c, uint32_t block, const float* in, size_t count, std::byte* out, float* res,
                    const SrKey& key, uint64_t g0) {
  const bool sr = c.stochastic_rounding;
  switch (c.kind) {
    case CodecKind::Int8: return encode_int8(in, count, out, res, block, sr, key, g0);
    case CodecKind::Fp8E4M3: return encode_fp8(in, count, out, res, sr, key, g0);
    case CodecKind::Int4: return encode_int4(in, count, out, res, sr, key, g0);
    case CodecKind::Sign1: return encode_sign1(in, count, out, res, block);
    case CodecKind::SignVote: return encode_vote(in, count, out);
  }
  return 0;
}

void decode_plain(const Codec& c, uint32_t block, const std::byte* in, size_t count, float* out, bool acc) {
  switch (c.kind) {
    case CodecKind::Int8: decode_int8(in, count, out, block, acc); return;
    case CodecKind::Fp8E4M3: decode_fp8(in, count, out, acc); return;
    case CodecKind::Int4: decode_int4(in, count, out, acc); return;
    case CodecKind::Sign1: decode_sign1(in, count, out, block, acc); return;
    case CodecKind::SignVote: decode_vote(in, count, out, acc); return;
  }
}

// Record by record: y = x (+ e), z = rotate(y), codes = Q(z); with a residual, e = y - rotate^-1(D(codes)) unless
// the record is non-finite (its residual is kept). The short last record goes unrotated.
size_t encode_rotated(const Codec& c, uint32_t block, const float* in, size_t count, std::byte* out, float* res,
                      const SrKey& key, uint64_t g0) {
  const size_t rec = record_elems(c), rec_bytes = record_bytes(c.kind, rec);
  const size_t full = count / rec * rec;
  RotationSigns signs;
  rotation_signs(c.seed, signs, rec);
  alignas(64) float y[kRotationMaxRecord], z[kRotationMaxRecord];
  size_t bad = 0;
  for (size_t i = 0; i < full; i += rec) {
    const float* yp = in + i;
    if (res) {
      for (size_t j = 0; j < rec; ++j) y[j] = in[i + j] + res[i + j];
      yp = y;
    }
    // A rotated value can reach the record's L2 norm, up to sqrt(R) times its largest magnitude: a record holding a
    // magnitude of 2^115 or more cannot be rotated within fp32 and is stored like a non-finite one (NaN), so it is
    // never silently wrong.
    if (amax_bits<false>(yp, nullptr, rec) >= kRotationLimitBits) {
      std::fill_n(z, rec, std::numeric_limits<float>::quiet_NaN());
    } else {
      rotate_forward(signs, yp, z, rec);
    }
    const size_t b = encode_plain(c, block, z, rec, out, nullptr, key, g0 + i);
    if (res && b == 0) {
      decode_plain(c, block, out, rec, z, false);
      rotate_inverse(signs, z, rec);
      for (size_t j = 0; j < rec; ++j) res[i + j] = y[j] - z[j];
    }
    bad += b;
    out += rec_bytes;
  }
  if (full < count)
    bad += encode_plain(c, block, in + full, count - full, out, res ? res + full : nullptr, key, g0 + full);
  return bad;
}

void decode_rotated(const Codec& c, uint32_t block, const std::byte* in, size_t count, float* out, bool acc) {
  const size_t rec = record_elems(c), rec_bytes = record_bytes(c.kind, rec);
  const size_t full = count / rec * rec;
  RotationSigns signs;
  rotation_signs(c.seed, signs, rec);
  alignas(64) float z[kRotationMaxRecord];
  for (size_t i = 0; i < full; i += rec) {
    decode_plain(c, block, in, rec, z, false);
    rotate_inverse(signs, z, rec);
    if (acc) {
      for (size_t j = 0; j < rec; ++j) out[i + j] += z[j];
    } else {
      std::memcpy(out + i, z, rec * sizeof(float));
    }
    in += rec_bytes;
  }
  if (full < count) decode_plain(c, block, in, count - full, out + full, acc);
}

}  // namespace

uint64_t rotation_seed_for_step(uint64_t seed, uint64_t step) { return mix64(seed ^ mix64(step ^ 0x524f54415445ull)); }

size_t encode(const Codec& c, const float* in, size_t count, std::byte* out, const EncodeCtx& ctx) {
  const uint32_t block = block_elems(c);  // validates c
  if (count == 0) return 0;
  if (!in) fail(prefix(c) + "encode: in is null");
  if (!out) fail(prefix(c) + "encode: out is null");
  if (ctx.residual && c.kind == CodecKind::SignVote) {
    fail(prefix(c) + "encode: ctx.residual must be null (majority vote has no error feedback)");
  }
  const size_t in_bytes = count * sizeof(float);
  const size_t out_bytes = encoded_bytes(c, count);
  if (overlap(in, in_bytes, out, out_bytes)) fail(prefix(c) + "encode: in and out overlap");
  if (ctx.residual &&
      (overlap(ctx.residual, in_bytes, in, in_bytes) || overlap(ctx.residual, in_bytes, out, out_bytes))) {
    fail(prefix(c) + "encode: ctx.residual overlaps in or out");
  }
  const SrKey key = make_key(c, ctx);
  if (c.rotation) return encode_rotated(c, block, in, count, out, ctx.residual, key, ctx.first_elem);
  return encode_plain(c, block, in, count, out, ctx.residual, key, ctx.first_elem);
}

namespace {
void decode_impl(const Codec& c, const std::byte* in, size_t count, float* out, bool acc, const char* what) {
  const uint32_t block = block_elems(c);  // validates c
  if (count == 0) return;
  if (!in) fail(prefix(c) + what + ": in is null");
  if (!out) fail(prefix(c) + what + (acc ? ": acc is null" : ": out is null"));
  if (c.rotation) {
    decode_rotated(c, block, in, count, out, acc);
  } else {
    decode_plain(c, block, in, count, out, acc);
  }
}
}  // namespace

void decode(const Codec& c, const std::byte* in, size_t count, float* out) {
  decode_impl(c, in, count, out, false, "decode");
}

void decode_accumulate(const Codec& c, const std::byte* in, size_t count, float* acc) {
  decode_impl(c, in, count, acc, true, "decode_accumulate");
}

void vote_accumulate(const std::byte* in, size_t count, int32_t* votes) {
  if (count == 0) return;
  if (!in) fail("codec sign_vote: vote_accumulate: in is null");
  if (!votes) fail("codec sign_vote: vote_accumulate: votes is null");
  vote_accumulate_impl(in, count, votes);
}

void vote_finalize(const int32_t* votes, size_t count, float* out) {
  if (count == 0) return;
  if (!votes) fail("codec sign_vote: vote_finalize: votes is null");
  if (!out) fail("codec sign_vote: vote_finalize: out is null");
  for (size_t i = 0; i < count; ++i) out[i] = static_cast<float>((votes[i] > 0) - (votes[i] < 0));
}

void vote_encode_result(const int32_t* votes, size_t count, std::byte* out) {
  if (count == 0) return;
  if (!votes) fail("codec sign_vote: vote_encode_result: votes is null");
  if (!out) fail("codec sign_vote: vote_encode_result: out is null");
  for (size_t i = 0; i < count; i += kWordBits) {
    const size_t n = std::min(kWordBits, count - i);
    uint32_t w = 0;
    for (size_t j = 0; j < n; ++j) w |= static_cast<uint32_t>(votes[i + j] < 0) << j;
    store_u32(out, w);
    out += 4;
  }
}

void philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
  uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
  uint32_t k0 = key[0], k1 = key[1];
  for (int r = 0; r < kPhiloxRounds; ++r) {
    const uint64_t p0 = static_cast<uint64_t>(kPhiloxM0) * c0;
    const uint64_t p1 = static_cast<uint64_t>(kPhiloxM1) * c2;
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    c1 = static_cast<uint32_t>(p1);
    c3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c2 = n2;
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

}  // namespace chorus::kernels::codec
