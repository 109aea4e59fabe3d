// CPU reduction kernels.
//
// Layout: one element function per (format, kind, premul, divide), a block loop around it, and one entry point per
// (format, kind) that the Reducer stores as a function pointer. The entry points are compiled for several ISAs
// (target_clones); the loader picks one when the library is loaded, so taking their address already yields the
// best clone and a reduce() costs one indirect call.
//
// Vectorisation rests on two choices that hold at -O2 as well as -O3:
//  - the hot loop runs over blocks of a compile-time length, so GCC's "very cheap" cost model (the -O2 default)
//    accepts it without an epilogue, and a short scalar loop finishes the tail;
//  - an ivdep pragma instead of __restrict: dst may be exactly a or b, which is a same-iteration dependence only, so
//    the loop is still free of loop-carried dependences, and no runtime alias check (which exact aliasing would
//    fail, falling back to scalar code) is emitted.
// The 16/8-bit conversions here are branch-free versions of those in float_types.cc (which stay the readable
// reference); the unit tests check that both give the same bits.
#include "kernels/cpu/reduce.h"

#include <cstring>
#include <iterator>
#include <type_traits>

#include "core/dtype.h"
#include "core/error.h"

// Results must not depend on which clone runs (determinism across machines), and the v3/v4 clones have FMA:
// contracting b * scalar + a into an FMA would skip a rounding, so contraction is off for everything below.
// Trapping math is off too: nothing here reads FP exception flags, and with it on GCC will not evaluate the FP
// operations of the subnormal paths unconditionally, so the loops keep a branch and do not vectorise. Neither
// option changes any result.
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off", "no-trapping-math")
#endif

// Overridable so that tests can build each ISA variant alone (a machine only ever runs the best one it supports).
#ifndef CHORUS_KERNEL_CLONES
// Not under sanitizers: an ifunc resolver runs while the dynamic loader relocates the program, before the sanitizer
// runtime is up, and the instrumented resolver crashes there (seen with ThreadSanitizer).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__gnu_linux__) && \
    !defined(__SANITIZE_THREAD__) && !defined(__SANITIZE_ADDRESS__)
// x86-64-v4 rather than bare avx512f: the BW/DQ/VL extensions give masked 8/16-bit lanes, which the narrow float
// codecs lean on (2-2.5x faster for fp16, bf16 and fp8 than avx512f alone). v3 is AVX2 with FMA and F16C.
#define CHORUS_KERNEL_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define CHORUS_KERNEL_CLONES
#endif
#endif
#define CHORUS_ALWAYS_INLINE inline __attribute__((always_inline))
#if defined(__clang__)
#define CHORUS_IVDEP _Pragma("clang loop vectorize(assume_safety)")
#else
#define CHORUS_IVDEP _Pragma("GCC ivdep")
#endif

namespace chorus::kernels {
namespace {

// Elements per block of the vectorised loop: a multiple of every vector length in elements (64 bytes of int8).
constexpr size_t kBlock = 64;

// std::bit_cast is defined before the pragma above, and GCC does not inline a function compiled with trapping math
// into one compiled without when both touch floats: a call would be left in every loop. The builtin is inlined.
template <typename To, typename From>
CHORUS_ALWAYS_INLINE constexpr To bit_cast(From v) {
  return __builtin_bit_cast(To, v);
}

constexpr float pow2f(int e) { return bit_cast<float>(static_cast<uint32_t>(e + 127) << 23); }

// ---- Formats: storage type, compute type, and the conversions between them ----

template <typename T>
struct NativeFloat {
  using Store = T;
  using Calc = T;
  static CHORUS_ALWAYS_INLINE Calc load(Store v) { return v; }
  static CHORUS_ALWAYS_INLINE Store store(Calc v) { return v; }
};

// An IEEE-style binary format of kBits bits with kMant stored mantissa bits and bias kBias, widened to fp32.
// kIeeeSpecials: the all-ones exponent holds inf and NaN (fp16, E5M2); otherwise only S.1111.111 is NaN (E4M3).
template <typename T, int kBits, int kMant, int kBias, bool kIeeeSpecials>
struct NarrowFloat {
  using Store = T;
  using Calc = float;
  static constexpr int kShift = 23 - kMant;  // fp32 mantissa bits dropped
  static constexpr uint32_t kMagMask = (1u << (kBits - 1)) - 1u;
  static constexpr uint32_t kInfCode = kMagMask >> kMant << kMant;  // all-ones exponent, zero mantissa
  static constexpr uint32_t kMaxFinite = kIeeeSpecials ? kInfCode - 1u : kMagMask - 1u;
  static constexpr uint32_t kRebias = static_cast<uint32_t>(127 - kBias) << 23;
  static constexpr uint32_t kMinNormalBits = static_cast<uint32_t>(127 - kBias + 1) << 23;
  // Adding this to a value below the smallest normal puts the subnormal step at the fp32 last place, so the FPU
  // rounds to nearest-even for us; then the low bits are the code.
  static constexpr float kSubMagic = pow2f(24 - kBias - kMant);
  static constexpr float kSubScale = pow2f(1 - kBias - kMant);

  static CHORUS_ALWAYS_INLINE float load(Store v) {
    const uint32_t x = v;
    const uint32_t sign = (x >> (kBits - 1)) << 31;
    const uint32_t mag = x & kMagMask;
    const uint32_t normal = (mag << kShift) + kRebias;
    // Subnormals: mag * 2^(1 - bias - mant) is exact in fp32.
    const uint32_t sub = bit_cast<uint32_t>(static_cast<float>(static_cast<int32_t>(mag)) * kSubScale);
    uint32_t bits = mag < (1u << kMant) ? sub : normal;
    if constexpr (kIeeeSpecials) {
      bits = mag >= kInfCode ? ((mag << kShift) | 0x7f800000u) : bits;  // keeps NaN payloads, as float_types.cc
    } else {
      bits = mag == kMagMask ? 0x7fc00000u : bits;
    }
    return bit_cast<float>(bits | sign);
  }

  static CHORUS_ALWAYS_INLINE Store store(float f) {
    const uint32_t x = bit_cast<uint32_t>(f);
    const uint32_t sign = (x >> 31) << (kBits - 1);
    const uint32_t ax = x & 0x7fffffffu;
    // Normal range: round to nearest-even by adding just under half a unit plus the kept lsb; a carry out of the
    // mantissa lands in the exponent. Unsigned wraparound for small ax is harmless: the subnormal path replaces it.
    uint32_t r = ax - kRebias;
    r = (r + ((1u << (kShift - 1)) - 1u) + ((r >> kShift) & 1u)) >> kShift;
    // Overflow: inf (the code after the largest finite one), or saturation for E4M3. r only grows with ax, so a
    // minimum does it, and also maps inf inputs.
    constexpr uint32_t kLimit = kIeeeSpecials ? kInfCode : kMaxFinite;
    r = r < kLimit ? r : kLimit;
    const uint32_t sub = bit_cast<uint32_t>(bit_cast<float>(ax) + kSubMagic) - bit_cast<uint32_t>(kSubMagic);
    r = ax < kMinNormalBits ? sub : r;
    uint32_t nan;
    if constexpr (kBits == 16) {
      nan = 0x7e00u | ((ax & 0x7fffffu) >> kShift);  // quiet, with the top of the payload
    } else {
      nan = kIeeeSpecials ? 0x7eu : 0x7fu;
    }
    r = ax > 0x7f800000u ? nan : r;
    return static_cast<Store>(r | sign);
  }
};

using Half = NarrowFloat<uint16_t, 16, 10, 15, true>;
using E4M3 = NarrowFloat<uint8_t, 8, 3, 7, false>;
using E5M2 = NarrowFloat<uint8_t, 8, 2, 15, true>;

struct Bf16 {
  using Store = uint16_t;
  using Calc = float;
  static CHORUS_ALWAYS_INLINE float load(Store v) { return bit_cast<float>(static_cast<uint32_t>(v) << 16); }
  static CHORUS_ALWAYS_INLINE Store store(float f) {
    const uint32_t x = bit_cast<uint32_t>(f);
    const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    return static_cast<Store>((x & 0x7fffffffu) > 0x7f800000u ? ((x >> 16) | 0x40u) : rounded);
  }
};

template <typename T>
struct Integer {
  using Store = T;
  using Calc = T;
  static CHORUS_ALWAYS_INLINE Calc load(Store v) { return v; }
  static CHORUS_ALWAYS_INLINE Store store(Calc v) { return v; }
};

// ---- Arithmetic ----

template <typename C>
using BitsOf = std::conditional_t<sizeof(C) == 4, uint32_t, uint64_t>;

// IEEE 754-2019 minimum/maximum: NaN if either operand is NaN, and -0 < +0. Ordering the zeros makes the result
// independent of operand order, which keeps min/max bitwise deterministic whichever way a schedule pairs ranks.
template <typename C>
CHORUS_ALWAYS_INLINE C float_min(C a, C b) {
  C r = a < b ? a : b;
  r = a == b ? bit_cast<C>(bit_cast<BitsOf<C>>(a) | bit_cast<BitsOf<C>>(b)) : r;
  return a != a ? a : r;  // b NaN already gave b above
}
template <typename C>
CHORUS_ALWAYS_INLINE C float_max(C a, C b) {
  C r = a > b ? a : b;
  r = a == b ? bit_cast<C>(bit_cast<BitsOf<C>>(a) & bit_cast<BitsOf<C>>(b)) : r;
  return a != a ? a : r;
}

// Integer sums and products wrap: computed in the unsigned type, where overflow is defined (the small types
// promote to int, whose range holds any 8-bit product), and converted back modulo 2^bits.
template <typename T>
CHORUS_ALWAYS_INLINE T wrap_add(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
}
template <typename T>
CHORUS_ALWAYS_INLINE T wrap_mul(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
}

template <ReduceKind K, typename C>
CHORUS_ALWAYS_INLINE C combine(C a, C b) {
  if constexpr (std::is_floating_point_v<C>) {
    if constexpr (K == ReduceKind::Sum) return a + b;
    if constexpr (K == ReduceKind::Prod) return a * b;
    if constexpr (K == ReduceKind::Max) return float_max(a, b);
    if constexpr (K == ReduceKind::Min) return float_min(a, b);
  } else {
    if constexpr (K == ReduceKind::Sum) return wrap_add(a, b);
    if constexpr (K == ReduceKind::Prod) return wrap_mul(a, b);
    if constexpr (K == ReduceKind::Max) return a < b ? b : a;
    if constexpr (K == ReduceKind::Min) return b < a ? b : a;
  }
}

template <typename C>
CHORUS_ALWAYS_INLINE C premul(C v, C scalar) {
  if constexpr (std::is_floating_point_v<C>) {
    return v * scalar;
  } else {
    return wrap_mul(v, scalar);
  }
}

// Operands of the division: floats divide in their compute type; integers keep the divisor wide, since it need not
// fit the element type (an 8-bit average over 1000 ranks).
template <typename C>
using Divisor = std::conditional_t<std::is_floating_point_v<C>, C, int64_t>;

// Division by d >= 2 (dividing by 1 is skipped by the callers, being the identity), integers truncating toward zero.
// x86 has no vector integer division; for types up to 32 bits the quotient through a wider float is exact (a
// non-integer x/d is at least 1/d away from an integer, more than the rounding error for |x| < 2^23 in fp32 and
// |x| < 2^52 in fp64), and that vectorises. With d >= 2 even an unsigned 32-bit quotient fits int32, whose
// conversion from double every x86 vector ISA has. 64-bit stays scalar.
template <typename C>
CHORUS_ALWAYS_INLINE C divide(C x, Divisor<C> d) {
  if constexpr (std::is_floating_point_v<C>) {
    return x / d;
  } else if constexpr (sizeof(C) == 1) {
    return static_cast<C>(static_cast<int32_t>(static_cast<float>(x) / static_cast<float>(d)));
  } else if constexpr (sizeof(C) == 4) {
    return static_cast<C>(static_cast<int32_t>(static_cast<double>(x) / static_cast<double>(d)));
  } else {
    return static_cast<C>(x / static_cast<C>(d));
  }
}

// ---- Loops ----

template <class F>
struct Params {
  typename F::Calc scalar;
  Divisor<typename F::Calc> divisor;
};

template <class F>
Params<F> params_of(const ReduceSpec& spec) {
  using C = typename F::Calc;
  Params<F> p{};
  if constexpr (std::is_floating_point_v<C>) {
    p.scalar = static_cast<C>(spec.scalar_f);
    p.divisor = static_cast<C>(spec.avg_divisor);
  } else {
    p.scalar = static_cast<C>(spec.scalar_i);  // modulo 2^bits
    p.divisor = spec.avg_divisor;
  }
  return p;
}

template <class F, ReduceKind K, bool kPremul, bool kDiv>
CHORUS_ALWAYS_INLINE typename F::Store reduce_elem(typename F::Store a, typename F::Store b, const Params<F>& p) {
  auto y = F::load(b);
  // An input times the scalar is rounded to the type, as the copy of it a peer receives is (copy_elem): every input
  // enters the sum the same way, whichever rank's step adds it (fp16 results depended on the element's position).
  if constexpr (kPremul) y = F::load(F::store(premul(y, p.scalar)));
  auto r = combine<K>(F::load(a), y);
  // The average is the sum as every reduction step leaves it (rounded to the type: fp8 e4m3 saturated, fp16
  // overflowed to inf), divided: the same bits whichever program, and so whichever step, does the division.
  if constexpr (kDiv) r = divide(F::load(F::store(r)), p.divisor);
  return F::store(r);
}

template <class F, bool kPremul, bool kDiv>
CHORUS_ALWAYS_INLINE typename F::Store copy_elem(typename F::Store v, const Params<F>& p) {
  auto r = F::load(v);
  if constexpr (kPremul) r = premul(r, p.scalar);
  if constexpr (kDiv) r = divide(r, p.divisor);
  return F::store(r);
}

template <class F, ReduceKind K, bool kPremul, bool kDiv>
CHORUS_ALWAYS_INLINE void reduce_loop(typename F::Store* dst, const typename F::Store* a, const typename F::Store* b,
                                      size_t n, const Params<F>& p) {
  const Params<F> q = p;  // a local copy, so stores through dst cannot be assumed to change it
  size_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    typename F::Store* d = dst + i;
    const typename F::Store* x = a + i;
    const typename F::Store* y = b + i;
    CHORUS_IVDEP
    for (size_t j = 0; j < kBlock; ++j) d[j] = reduce_elem<F, K, kPremul, kDiv>(x[j], y[j], q);
  }
  for (; i < n; ++i) dst[i] = reduce_elem<F, K, kPremul, kDiv>(a[i], b[i], q);
}

template <class F, bool kPremul, bool kDiv>
CHORUS_ALWAYS_INLINE void copy_loop(typename F::Store* dst, const typename F::Store* src, size_t n,
                                    const Params<F>& p) {
  const Params<F> q = p;
  size_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    typename F::Store* d = dst + i;
    const typename F::Store* s = src + i;
    CHORUS_IVDEP
    for (size_t j = 0; j < kBlock; ++j) d[j] = copy_elem<F, kPremul, kDiv>(s[j], q);
  }
  for (; i < n; ++i) dst[i] = copy_elem<F, kPremul, kDiv>(src[i], q);
}

// ---- Entry points (the function pointers) ----

template <class F, ReduceKind K>
CHORUS_KERNEL_CLONES void reduce_entry(const ReduceSpec& spec, void* dst, const void* a, const void* b, size_t n,
                                       bool b_is_input, bool final) {
  using S = typename F::Store;
  auto* d = static_cast<S*>(dst);
  const auto* x = static_cast<const S*>(a);
  const auto* y = static_cast<const S*>(b);
  const Params<F> p = params_of<F>(spec);
  const bool pm = spec.premul && b_is_input;
  const bool dv = final && spec.avg_divisor > 1;
  if (pm) {
    if (dv) {
      reduce_loop<F, K, true, true>(d, x, y, n, p);
    } else {
      reduce_loop<F, K, true, false>(d, x, y, n, p);
    }
  } else if (dv) {
    reduce_loop<F, K, false, true>(d, x, y, n, p);
  } else {
    reduce_loop<F, K, false, false>(d, x, y, n, p);
  }
}

template <class F>
CHORUS_KERNEL_CLONES void copy_entry(const ReduceSpec& spec, void* dst, const void* src, size_t n, bool src_is_input,
                                     bool final) {
  using S = typename F::Store;
  auto* d = static_cast<S*>(dst);
  const auto* s = static_cast<const S*>(src);
  const Params<F> p = params_of<F>(spec);
  const bool pm = spec.premul && src_is_input;
  const bool dv = final && spec.avg_divisor > 1;
  if (pm && dv) {
    copy_loop<F, true, true>(d, s, n, p);
  } else if (pm) {
    copy_loop<F, true, false>(d, s, n, p);
  } else if (dv) {
    copy_loop<F, false, true>(d, s, n, p);
  } else if (d != s) {
    std::memcpy(d, s, n * sizeof(S));
  }
}

struct Kernels {
  Reducer::ReduceFn reduce;
  Reducer::CopyFn copy;
};

// Returned by value from a table: GCC 12 mistakes the address of an internal-linkage target_clones function, stored
// through a reference or pointer, for the address of a local (-Wdangling-pointer).
template <class F>
Kernels pick_kernels(ReduceKind kind) {
  static constexpr Kernels kTable[] = {
      {&reduce_entry<F, ReduceKind::Sum>, &copy_entry<F>},
      {&reduce_entry<F, ReduceKind::Prod>, &copy_entry<F>},
      {&reduce_entry<F, ReduceKind::Max>, &copy_entry<F>},
      {&reduce_entry<F, ReduceKind::Min>, &copy_entry<F>},
  };
  const auto k = static_cast<size_t>(kind);
  if (k >= std::size(kTable)) {
    throw Error(chorusInvalidArgument, Subsys::Kernels, cat("reducer: invalid reduction kind ", static_cast<int>(k)));
  }
  return kTable[k];
}

Kernels pick_kernels(chorusDataType_t dtype, ReduceKind kind) {
  switch (dtype) {
    case chorusInt8: return pick_kernels<Integer<int8_t>>(kind);
    case chorusUint8: return pick_kernels<Integer<uint8_t>>(kind);
    case chorusInt32: return pick_kernels<Integer<int32_t>>(kind);
    case chorusUint32: return pick_kernels<Integer<uint32_t>>(kind);
    case chorusInt64: return pick_kernels<Integer<int64_t>>(kind);
    case chorusUint64: return pick_kernels<Integer<uint64_t>>(kind);
    case chorusFloat16: return pick_kernels<Half>(kind);
    case chorusFloat32: return pick_kernels<NativeFloat<float>>(kind);
    case chorusFloat64: return pick_kernels<NativeFloat<double>>(kind);
    case chorusBfloat16: return pick_kernels<Bf16>(kind);
    case chorusFloat8e4m3: return pick_kernels<E4M3>(kind);
    case chorusFloat8e5m2: return pick_kernels<E5M2>(kind);
    case chorusNumTypes:
    case chorusMinDataType:
    case chorusMaxDataType: break;
  }
  throw Error(chorusInvalidArgument, Subsys::Kernels, cat("reducer: invalid datatype ", static_cast<int>(dtype)));
}

template <class F>
CHORUS_KERNEL_CLONES void widen_entry(const void* src, float* dst, size_t n) {
  const auto* s = static_cast<const typename F::Store*>(src);
  CHORUS_IVDEP
  for (size_t i = 0; i < n; ++i) dst[i] = F::load(s[i]);
}

template <class F>
CHORUS_KERNEL_CLONES void narrow_entry(const float* src, void* dst, size_t n) {
  auto* d = static_cast<typename F::Store*>(dst);
  CHORUS_IVDEP
  for (size_t i = 0; i < n; ++i) d[i] = F::store(src[i]);
}

[[noreturn]] void not_a_float_type(chorusDataType_t dtype) {
  throw Error(chorusInvalidArgument, Subsys::Kernels,
              cat("conversion to or from float32: datatype ", static_cast<int>(dtype), " is not a floating type"));
}

}  // namespace

Reducer::Reducer(const ReduceSpec& spec) : spec_(spec), elem_(dtype_size(spec.dtype)) {
  if (spec.avg_divisor < 0) {
    throw Error(chorusInvalidArgument, Subsys::Kernels, cat("reducer: negative average divisor ", spec.avg_divisor));
  }
  const Kernels k = pick_kernels(spec.dtype, spec.kind);
  reduce_fn_ = k.reduce;
  copy_fn_ = k.copy;
}

void Reducer::reduce(void* dst, const void* a, const void* b, size_t n, bool b_is_input, bool final) const {
  if (n == 0) return;
  reduce_fn_(spec_, dst, a, b, n, b_is_input, final);
}

void Reducer::copy(void* dst, const void* src, size_t n, bool src_is_input, bool final) const {
  if (n == 0) return;
  const bool transform = (spec_.premul && src_is_input) || (final && spec_.avg_divisor > 1);
  if (!transform) {
    if (dst != src) std::memcpy(dst, src, n * elem_);
    return;
  }
  copy_fn_(spec_, dst, src, n, src_is_input, final);
}

void widen_to_float(chorusDataType_t dtype, const void* src, float* dst, size_t n) {
  if (n == 0) return;
  switch (dtype) {
    case chorusFloat16: return widen_entry<Half>(src, dst, n);
    case chorusBfloat16: return widen_entry<Bf16>(src, dst, n);
    case chorusFloat8e4m3: return widen_entry<E4M3>(src, dst, n);
    case chorusFloat8e5m2: return widen_entry<E5M2>(src, dst, n);
    case chorusFloat32: std::memcpy(dst, src, n * sizeof(float)); return;
    default: not_a_float_type(dtype);
  }
}

void narrow_from_float(chorusDataType_t dtype, const float* src, void* dst, size_t n) {
  if (n == 0) return;
  switch (dtype) {
    case chorusFloat16: return narrow_entry<Half>(src, dst, n);
    case chorusBfloat16: return narrow_entry<Bf16>(src, dst, n);
    case chorusFloat8e4m3: return narrow_entry<E4M3>(src, dst, n);
    case chorusFloat8e5m2: return narrow_entry<E5M2>(src, dst, n);
    case chorusFloat32: std::memcpy(dst, src, n * sizeof(float)); return;
    default: not_a_float_type(dtype);
  }
}

}  // namespace chorus::kernels
