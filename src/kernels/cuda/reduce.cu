// CUDA reduction kernels (see reduce.cuh for the contract).
//
// Shape: as src/kernels/cpu/reduce.cc, one element function per (format, kind, premul, divide); here it sits in a
// grid-stride kernel that moves 16-byte vectors (four in flight per thread), with scalar loops for the unaligned
// head and the tail. The format conversions are the branch-free ones of reduce.cc, written with explicit
// round-to-nearest intrinsics (__fadd_rn, __fmul_rn, ...), which nvcc never contracts into FMAs; the build also
// passes --fmad=false. Denormals are not flushed (no --use_fast_math), so the subnormal tricks round as on the CPU.
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/reduce.cuh"

namespace chorus::kernels::cuda {
namespace {

constexpr unsigned kThreads = 256;
constexpr int kUnroll = 4;  // vectors in flight per thread: enough bytes in flight to saturate HBM

// ---- Formats (the same as reduce.cc's) ----

template <typename T>
struct NativeFloat {
  using Store = T;
  using Calc = T;
  static __device__ __forceinline__ Calc load(Store v) { return v; }
  static __device__ __forceinline__ Store store(Calc v) { return v; }
};

template <typename T, int kBits, int kMant, int kBias, bool kIeeeSpecials>
struct NarrowFloat {
  using Store = T;
  using Calc = float;
  static constexpr int kShift = 23 - kMant;
  static constexpr uint32_t kMagMask = (1u << (kBits - 1)) - 1u;
  static constexpr uint32_t kInfCode = kMagMask >> kMant << kMant;
  static constexpr uint32_t kMaxFinite = kIeeeSpecials ? kInfCode - 1u : kMagMask - 1u;
  static constexpr uint32_t kRebias = static_cast<uint32_t>(127 - kBias) << 23;
  static constexpr uint32_t kMinNormalBits = static_cast<uint32_t>(127 - kBias + 1) << 23;
  static constexpr uint32_t kSubMagicBits = static_cast<uint32_t>(24 - kBias - kMant + 127) << 23;
  static constexpr uint32_t kSubScaleBits = static_cast<uint32_t>(1 - kBias - kMant + 127) << 23;

  static __device__ __forceinline__ float load(Store v) {
    const uint32_t x = v;
    const uint32_t sign = (x >> (kBits - 1)) << 31;
    const uint32_t mag = x & kMagMask;
    const uint32_t normal = (mag << kShift) + kRebias;
    const uint32_t sub =
        __float_as_uint(__fmul_rn(__int2float_rn(static_cast<int32_t>(mag)), __uint_as_float(kSubScaleBits)));
    uint32_t bits = mag < (1u << kMant) ? sub : normal;
    if constexpr (kIeeeSpecials) {
      bits = mag >= kInfCode ? ((mag << kShift) | 0x7f800000u) : bits;
    } else {
      bits = mag == kMagMask ? 0x7fc00000u : bits;
    }
    return __uint_as_float(bits | sign);
  }

  static __device__ __forceinline__ Store store(float f) {
    const uint32_t x = __float_as_uint(f);
    const uint32_t sign = (x >> 31) << (kBits - 1);
    const uint32_t ax = x & 0x7fffffffu;
    uint32_t r = ax - kRebias;
    r = (r + ((1u << (kShift - 1)) - 1u) + ((r >> kShift) & 1u)) >> kShift;
    constexpr uint32_t kLimit = kIeeeSpecials ? kInfCode : kMaxFinite;
    r = r < kLimit ? r : kLimit;
    const uint32_t sub =
        __float_as_uint(__fadd_rn(__uint_as_float(ax), __uint_as_float(kSubMagicBits))) - kSubMagicBits;
    r = ax < kMinNormalBits ? sub : r;
    uint32_t nan;
    if constexpr (kBits == 16) {
      nan = 0x7e00u | ((ax & 0x7fffffu) >> kShift);
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
  static __device__ __forceinline__ float load(Store v) { return __uint_as_float(static_cast<uint32_t>(v) << 16); }
  static __device__ __forceinline__ Store store(float f) {
    const uint32_t x = __float_as_uint(f);
    const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    return static_cast<Store>((x & 0x7fffffffu) > 0x7f800000u ? ((x >> 16) | 0x40u) : rounded);
  }
};

template <typename T>
struct Integer {
  using Store = T;
  using Calc = T;
  static __device__ __forceinline__ Calc load(Store v) { return v; }
  static __device__ __forceinline__ Store store(Calc v) { return v; }
};

// ---- Arithmetic, rounded to nearest and never fused ----

__device__ __forceinline__ float add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double add(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ float mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float div(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ double div(double a, double b) { return __ddiv_rn(a, b); }

__device__ __forceinline__ uint32_t bits_of(float v) { return __float_as_uint(v); }
__device__ __forceinline__ uint64_t bits_of(double v) { return static_cast<uint64_t>(__double_as_longlong(v)); }
__device__ __forceinline__ float from_bits(uint32_t b, float) { return __uint_as_float(b); }
__device__ __forceinline__ double from_bits(uint64_t b, double) {
  return __longlong_as_double(static_cast<long long>(b));
}

// IEEE 754-2019 minimum / maximum, as reduce.cc: NaN if either is NaN (a's NaN first), -0 < +0.
template <typename C>
__device__ __forceinline__ C float_min(C a, C b) {
  C r = a < b ? a : b;
  r = a == b ? from_bits(bits_of(a) | bits_of(b), C{}) : r;
  return a != a ? a : r;
}
template <typename C>
__device__ __forceinline__ C float_max(C a, C b) {
  C r = a > b ? a : b;
  r = a == b ? from_bits(bits_of(a) & bits_of(b), C{}) : r;
  return a != a ? a : r;
}

template <typename T>
__device__ __forceinline__ T wrap_add(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
}
template <typename T>
__device__ __forceinline__ T wrap_mul(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
}

template <ReduceKind K, typename C>
__device__ __forceinline__ C combine(C a, C b) {
  if constexpr (std::is_floating_point_v<C>) {
    if constexpr (K == ReduceKind::Sum) return add(a, b);
    if constexpr (K == ReduceKind::Prod) return mul(a, b);
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
__device__ __forceinline__ C premul(C v, C scalar) {
  if constexpr (std::is_floating_point_v<C>) {
    return mul(v, scalar);
  } else {
    return wrap_mul(v, scalar);
  }
}

template <typename C>
using Divisor = std::conditional_t<std::is_floating_point_v<C>, C, int64_t>;

// d >= 2. Integers truncate toward zero, which is what reduce.cc's exact float quotients give as well.
template <typename C>
__device__ __forceinline__ C divide(C x, Divisor<C> d) {
  if constexpr (std::is_floating_point_v<C>) {
    return div(x, d);
  } else if constexpr (sizeof(C) <= 4 && std::is_signed_v<C>) {
    return static_cast<C>(static_cast<int32_t>(x) / static_cast<int32_t>(d));
  } else if constexpr (sizeof(C) <= 4) {
    return static_cast<C>(static_cast<uint32_t>(x) / static_cast<uint32_t>(d));
  } else {
    return static_cast<C>(x / static_cast<C>(d));
  }
}

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
    p.scalar = static_cast<C>(spec.scalar_i);
    p.divisor = spec.avg_divisor;
  }
  return p;
}

template <class F, ReduceKind K, bool kPremul, bool kDiv>
__device__ __forceinline__ typename F::Store reduce_elem(typename F::Store a, typename F::Store b, const Params<F>& p) {
  auto y = F::load(b);
  if constexpr (kPremul) y = F::load(F::store(premul(y, p.scalar)));  // rounded as a peer's copy is (as reduce.cc)
  auto r = combine<K>(F::load(a), y);
  if constexpr (kDiv) r = divide(F::load(F::store(r)), p.divisor);  // the rounded sum, divided (as reduce.cc)
  return F::store(r);
}

template <class F, bool kPremul, bool kDiv>
__device__ __forceinline__ typename F::Store copy_elem(typename F::Store v, const Params<F>& p) {
  auto r = F::load(v);
  if constexpr (kPremul) r = premul(r, p.scalar);
  if constexpr (kDiv) r = divide(r, p.divisor);
  return F::store(r);
}

// ---- Kernels ----

template <typename S>
union Vec {
  uint4 u;
  S s[16 / sizeof(S)];
};

// Elements [0, head) and [head + nvec * V, n) one by one; [head, head + nvec * V) as 16-byte vectors (dst + head,
// a + head and b + head are 16-byte aligned when nvec > 0).
template <class F, ReduceKind K, bool kPremul, bool kDiv>
__global__ void __launch_bounds__(kThreads)
    reduce_kernel(typename F::Store* dst, const typename F::Store* a, const typename F::Store* b, size_t n, size_t head,
                  size_t nvec, Params<F> p) {
  using S = typename F::Store;
  constexpr size_t V = 16 / sizeof(S);
  const size_t tid = dev::global_thread();
  const size_t stride = dev::grid_threads();
  for (size_t i = tid; i < head; i += stride) dst[i] = reduce_elem<F, K, kPremul, kDiv>(a[i], b[i], p);
  auto* vd = reinterpret_cast<uint4*>(dst + head);
  const auto* va = reinterpret_cast<const uint4*>(a + head);
  const auto* vb = reinterpret_cast<const uint4*>(b + head);
  size_t v = tid;
  for (; v + (kUnroll - 1) * stride < nvec; v += kUnroll * stride) {
    Vec<S> x[kUnroll], y[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      x[u].u = va[v + u * stride];
      y[u].u = vb[v + u * stride];
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      Vec<S> r;
#pragma unroll
      for (size_t k = 0; k < V; ++k) r.s[k] = reduce_elem<F, K, kPremul, kDiv>(x[u].s[k], y[u].s[k], p);
      vd[v + u * stride] = r.u;
    }
  }
  for (; v < nvec; v += stride) {
    Vec<S> x, y, r;
    x.u = va[v];
    y.u = vb[v];
#pragma unroll
    for (size_t k = 0; k < V; ++k) r.s[k] = reduce_elem<F, K, kPremul, kDiv>(x.s[k], y.s[k], p);
    vd[v] = r.u;
  }
  for (size_t i = head + nvec * V + tid; i < n; i += stride) dst[i] = reduce_elem<F, K, kPremul, kDiv>(a[i], b[i], p);
}

template <class F, bool kPremul, bool kDiv>
__global__ void __launch_bounds__(kThreads)
    copy_kernel(typename F::Store* dst, const typename F::Store* src, size_t n, size_t head, size_t nvec, Params<F> p) {
  using S = typename F::Store;
  constexpr size_t V = 16 / sizeof(S);
  const size_t tid = dev::global_thread();
  const size_t stride = dev::grid_threads();
  for (size_t i = tid; i < head; i += stride) dst[i] = copy_elem<F, kPremul, kDiv>(src[i], p);
  auto* vd = reinterpret_cast<uint4*>(dst + head);
  const auto* vs = reinterpret_cast<const uint4*>(src + head);
  size_t v = tid;
  for (; v + (kUnroll - 1) * stride < nvec; v += kUnroll * stride) {
    Vec<S> x[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) x[u].u = vs[v + u * stride];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      Vec<S> r;
#pragma unroll
      for (size_t k = 0; k < V; ++k) r.s[k] = copy_elem<F, kPremul, kDiv>(x[u].s[k], p);
      vd[v + u * stride] = r.u;
    }
  }
  for (; v < nvec; v += stride) {
    Vec<S> x, r;
    x.u = vs[v];
#pragma unroll
    for (size_t k = 0; k < V; ++k) r.s[k] = copy_elem<F, kPremul, kDiv>(x.s[k], p);
    vd[v] = r.u;
  }
  for (size_t i = head + nvec * V + tid; i < n; i += stride) dst[i] = copy_elem<F, kPremul, kDiv>(src[i], p);
}

// ---- Launch ----

// The split into a scalar head, vectors and a scalar tail: vectors only when every pointer has the same offset
// modulo 16 (then one head length aligns them all).
struct Split {
  size_t head;
  size_t nvec;
};

Split split(size_t n, size_t elem, std::initializer_list<const void*> ptrs) {
  const uintptr_t mis = reinterpret_cast<uintptr_t>(*ptrs.begin()) % 16;
  for (const void* p : ptrs) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != mis) return {n, 0};
  }
  size_t head = ((16 - mis) % 16) / elem;
  if (head > n) head = n;
  return {head, (n - head) / (16 / elem)};
}

template <class F, ReduceKind K, bool kPremul, bool kDiv>
void launch_reduce(void* dst, const void* a, const void* b, size_t n, const Params<F>& p, cudaStream_t stream) {
  using S = typename F::Store;
  auto kernel = &reduce_kernel<F, K, kPremul, kDiv>;
  static const int kBlocksPerSm = blocks_per_sm(kernel, kThreads);
  const Split sp = split(n, sizeof(S), {dst, a, b});
  const size_t items = sp.head + sp.nvec + (n - sp.head - sp.nvec * (16 / sizeof(S)));
  launch_kernel(kernel, dim3(grid_blocks(items, kThreads, kBlocksPerSm)), dim3(kThreads), 0, stream,
                "reduce kernel launch", static_cast<S*>(dst), static_cast<const S*>(a), static_cast<const S*>(b), n,
                sp.head, sp.nvec, p);
}

template <class F, bool kPremul, bool kDiv>
void launch_copy(void* dst, const void* src, size_t n, const Params<F>& p, cudaStream_t stream) {
  using S = typename F::Store;
  auto kernel = &copy_kernel<F, kPremul, kDiv>;
  static const int kBlocksPerSm = blocks_per_sm(kernel, kThreads);
  const Split sp = split(n, sizeof(S), {dst, src});
  const size_t items = sp.head + sp.nvec + (n - sp.head - sp.nvec * (16 / sizeof(S)));
  launch_kernel(kernel, dim3(grid_blocks(items, kThreads, kBlocksPerSm)), dim3(kThreads), 0, stream,
                "copy kernel launch", static_cast<S*>(dst), static_cast<const S*>(src), n, sp.head, sp.nvec, p);
}

// Loads one kernel into the current context (lazy loading would load it at its first launch).
template <typename Kernel>
void load(Kernel kernel) {
  cudaFuncAttributes attr{};
  check(cudaFuncGetAttributes(&attr, kernel), "cudaFuncGetAttributes (loading a kernel)");
}

template <class F, ReduceKind K>
void load_reduce_kernels() {
  load(&reduce_kernel<F, K, false, false>);
  load(&reduce_kernel<F, K, false, true>);
  load(&reduce_kernel<F, K, true, false>);
  load(&reduce_kernel<F, K, true, true>);
}

template <class F>
void load_format_kernels() {
  load_reduce_kernels<F, ReduceKind::Sum>();
  load_reduce_kernels<F, ReduceKind::Prod>();
  load_reduce_kernels<F, ReduceKind::Max>();
  load_reduce_kernels<F, ReduceKind::Min>();
  load(&copy_kernel<F, true, true>);
  load(&copy_kernel<F, true, false>);
  load(&copy_kernel<F, false, true>);
}

struct Call {
  void* dst;
  const void* a;
  const void* b;  // null for copy
  size_t n;
  bool premul;
  bool divide;
  cudaStream_t stream;
};

template <class F, ReduceKind K>
void run_reduce(const ReduceSpec& spec, const Call& c) {
  const Params<F> p = params_of<F>(spec);
  if (c.premul) {
    if (c.divide) {
      launch_reduce<F, K, true, true>(c.dst, c.a, c.b, c.n, p, c.stream);
    } else {
      launch_reduce<F, K, true, false>(c.dst, c.a, c.b, c.n, p, c.stream);
    }
  } else if (c.divide) {
    launch_reduce<F, K, false, true>(c.dst, c.a, c.b, c.n, p, c.stream);
  } else {
    launch_reduce<F, K, false, false>(c.dst, c.a, c.b, c.n, p, c.stream);
  }
}

template <class F>
void run_format(const ReduceSpec& spec, const Call& c) {
  if (c.b == nullptr) {  // copy with a transform
    const Params<F> p = params_of<F>(spec);
    if (c.premul && c.divide) {
      launch_copy<F, true, true>(c.dst, c.a, c.n, p, c.stream);
    } else if (c.premul) {
      launch_copy<F, true, false>(c.dst, c.a, c.n, p, c.stream);
    } else {
      launch_copy<F, false, true>(c.dst, c.a, c.n, p, c.stream);
    }
    return;
  }
  switch (spec.kind) {
    case ReduceKind::Sum: run_reduce<F, ReduceKind::Sum>(spec, c); return;
    case ReduceKind::Prod: run_reduce<F, ReduceKind::Prod>(spec, c); return;
    case ReduceKind::Max: run_reduce<F, ReduceKind::Max>(spec, c); return;
    case ReduceKind::Min: run_reduce<F, ReduceKind::Min>(spec, c); return;
  }
  throw Error(chorusInvalidArgument, Subsys::Kernels,
              cat("cuda reduce: invalid reduction kind ", static_cast<int>(spec.kind)));
}

void dispatch(const ReduceSpec& spec, const Call& c) {
  switch (spec.dtype) {
    case chorusInt8: return run_format<Integer<int8_t>>(spec, c);
    case chorusUint8: return run_format<Integer<uint8_t>>(spec, c);
    case chorusInt32: return run_format<Integer<int32_t>>(spec, c);
    case chorusUint32: return run_format<Integer<uint32_t>>(spec, c);
    case chorusInt64: return run_format<Integer<int64_t>>(spec, c);
    case chorusUint64: return run_format<Integer<uint64_t>>(spec, c);
    case chorusFloat16: return run_format<Half>(spec, c);
    case chorusFloat32: return run_format<NativeFloat<float>>(spec, c);
    case chorusFloat64: return run_format<NativeFloat<double>>(spec, c);
    case chorusBfloat16: return run_format<Bf16>(spec, c);
    case chorusFloat8e4m3: return run_format<E4M3>(spec, c);
    case chorusFloat8e5m2: return run_format<E5M2>(spec, c);
    case chorusNumTypes:
    case chorusMinDataType:
    case chorusMaxDataType: break;
  }
  throw Error(chorusInvalidArgument, Subsys::Kernels,
              cat("cuda reduce: invalid datatype ", static_cast<int>(spec.dtype)));
}

// Checks shared by reduce and copy; returns the element size.
size_t validate(const ReduceSpec& spec, const char* what) {
  if (!dtype_valid(spec.dtype)) {
    throw Error(chorusInvalidArgument, Subsys::Kernels,
                cat("cuda ", what, ": invalid datatype ", static_cast<int>(spec.dtype)));
  }
  if (static_cast<int>(spec.kind) > static_cast<int>(ReduceKind::Min)) {
    throw Error(chorusInvalidArgument, Subsys::Kernels,
                cat("cuda ", what, ": invalid reduction kind ", static_cast<int>(spec.kind)));
  }
  if (spec.avg_divisor < 0) {
    throw Error(chorusInvalidArgument, Subsys::Kernels,
                cat("cuda ", what, ": negative average divisor ", spec.avg_divisor));
  }
  return dtype_size(spec.dtype);
}

void check_pointer(const void* p, size_t elem, const char* what, const char* name) {
  if (p == nullptr) throw Error(chorusInvalidArgument, Subsys::Kernels, cat("cuda ", what, ": ", name, " is null"));
  if (reinterpret_cast<uintptr_t>(p) % elem != 0) {
    throw Error(chorusInvalidArgument, Subsys::Kernels,
                cat("cuda ", what, ": ", name, " is not aligned to its ", elem, "-byte elements"));
  }
}

// dst must be exactly src or disjoint from it.
void check_alias(const void* dst, const void* src, size_t bytes, const char* what) {
  if (dst == src) return;
  check_no_overlap(dst, bytes, src, bytes, what);
}

}  // namespace

void reduce(const ReduceSpec& spec, void* dst, const void* a, const void* b, size_t n, bool b_is_input, bool final,
            cudaStream_t stream) {
  const size_t elem = validate(spec, "reduce");
  if (n == 0) return;
  check_pointer(dst, elem, "reduce", "dst");
  check_pointer(a, elem, "reduce", "a");
  check_pointer(b, elem, "reduce", "b");
  check_alias(dst, a, n * elem, "cuda reduce: dst partially overlaps a");
  check_alias(dst, b, n * elem, "cuda reduce: dst partially overlaps b");
  dispatch(spec, {dst, a, b, n, spec.premul && b_is_input, final && spec.avg_divisor > 1, stream});
}

void load_kernels() {
  load_format_kernels<Integer<int8_t>>();
  load_format_kernels<Integer<uint8_t>>();
  load_format_kernels<Integer<int32_t>>();
  load_format_kernels<Integer<uint32_t>>();
  load_format_kernels<Integer<int64_t>>();
  load_format_kernels<Integer<uint64_t>>();
  load_format_kernels<Half>();
  load_format_kernels<NativeFloat<float>>();
  load_format_kernels<NativeFloat<double>>();
  load_format_kernels<Bf16>();
  load_format_kernels<E4M3>();
  load_format_kernels<E5M2>();
}

void copy(const ReduceSpec& spec, void* dst, const void* src, size_t n, bool src_is_input, bool final,
          cudaStream_t stream) {
  const size_t elem = validate(spec, "copy");
  if (n == 0) return;
  check_pointer(dst, elem, "copy", "dst");
  check_pointer(src, elem, "copy", "src");
  check_alias(dst, src, n * elem, "cuda copy: dst partially overlaps src");
  const bool pm = spec.premul && src_is_input;
  const bool dv = final && spec.avg_divisor > 1;
  if (!pm && !dv) {
    if (dst != src) check(cudaMemcpyAsync(dst, src, n * elem, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync");
    return;
  }
  dispatch(spec, {dst, src, nullptr, n, pm, dv, stream});
}

}  // namespace chorus::kernels::cuda
