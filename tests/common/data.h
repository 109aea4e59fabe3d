// Test data whose reductions are exact: every rank gets distinct values, chosen per op so that every partial result
// is exactly representable in every dtype (fp8 included), whatever order the ranks are combined in. Expected
// results are computed once per case, in double or int64, with the library's documented semantics.
#pragma once

#include <chorus/chorus.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/float_types.h"

namespace chorus::test {

// Op under test: the five built-ins plus a pre-multiplied sum (scalar 2).
enum class TestOp { Sum, Prod, Max, Min, Avg, PreMulSum };
inline const char* test_op_name(TestOp o) {
  static const char* n[] = {"sum", "prod", "max", "min", "avg", "premulsum"};
  return n[static_cast<int>(o)];
}
constexpr TestOp kAllOps[] = {TestOp::Sum, TestOp::Prod, TestOp::Max, TestOp::Min, TestOp::Avg, TestOp::PreMulSum};
constexpr chorusDataType_t kAllTypes[] = {chorusInt8,    chorusUint8,    chorusInt32,      chorusUint32,
                                          chorusInt64,   chorusUint64,   chorusFloat16,    chorusFloat32,
                                          chorusFloat64, chorusBfloat16, chorusFloat8e4m3, chorusFloat8e5m2};
constexpr double kPreMulScalar = 2.0;

// The value rank r holds at element i for op o (small integers; min/max use non-negative ones for unsigned types,
// so that comparing the stored values and comparing these agree).
inline int64_t test_value(TestOp o, int r, size_t i, bool unsigned_type = false) {
  const uint64_t h = (static_cast<uint64_t>(r) * 0x9E3779B97F4A7C15ull) ^ (i * 0xBF58476D1CE4E5B9ull);
  const uint64_t m = (h ^ (h >> 29)) * 0x94D049BB133111EBull;
  const uint64_t x = m ^ (m >> 32);
  switch (o) {
    case TestOp::Prod: return (x % 5 == 0) ? 2 : ((x & 1) ? -1 : 1);  // |product| <= 2^8
    case TestOp::Max:
    case TestOp::Min: return static_cast<int64_t>(x % 17) - (unsigned_type ? 0 : 8);
    default: return static_cast<int64_t>(x % 3) - 1;  // sums of 8 ranks stay within [-16, 16]
  }
}

inline bool is_float(chorusDataType_t t) {
  return t == chorusFloat16 || t == chorusFloat32 || t == chorusFloat64 || t == chorusBfloat16 ||
         t == chorusFloat8e4m3 || t == chorusFloat8e5m2;
}
inline bool is_unsigned(chorusDataType_t t) { return t == chorusUint8 || t == chorusUint32 || t == chorusUint64; }
inline size_t type_size(chorusDataType_t t) { return chorusTypeSize(t); }

// Stores v (an exact small value, or a wrapped integer) as element i of a `t` array.
inline void store(chorusDataType_t t, void* p, size_t i, double v) {
  using namespace chorus::kernels;
  switch (t) {
    case chorusInt8: static_cast<int8_t*>(p)[i] = static_cast<int8_t>(static_cast<int64_t>(v)); break;
    case chorusUint8: static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(static_cast<int64_t>(v)); break;
    case chorusInt32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(static_cast<int64_t>(v)); break;
    case chorusUint32: static_cast<uint32_t*>(p)[i] = static_cast<uint32_t>(static_cast<int64_t>(v)); break;
    case chorusInt64: static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v); break;
    case chorusUint64: static_cast<uint64_t*>(p)[i] = static_cast<uint64_t>(static_cast<int64_t>(v)); break;
    case chorusFloat16: static_cast<uint16_t*>(p)[i] = float_to_half(static_cast<float>(v)); break;
    case chorusFloat32: static_cast<float*>(p)[i] = static_cast<float>(v); break;
    case chorusFloat64: static_cast<double*>(p)[i] = v; break;
    case chorusBfloat16: static_cast<uint16_t*>(p)[i] = float_to_bf16(static_cast<float>(v)); break;
    case chorusFloat8e4m3: static_cast<uint8_t*>(p)[i] = float_to_e4m3(static_cast<float>(v)); break;
    case chorusFloat8e5m2: static_cast<uint8_t*>(p)[i] = float_to_e5m2(static_cast<float>(v)); break;
    default: break;
  }
}

// Element i as a double (integers exactly as their type holds them).
inline double load(chorusDataType_t t, const void* p, size_t i) {
  using namespace chorus::kernels;
  switch (t) {
    case chorusInt8: return static_cast<const int8_t*>(p)[i];
    case chorusUint8: return static_cast<const uint8_t*>(p)[i];
    case chorusInt32: return static_cast<const int32_t*>(p)[i];
    case chorusUint32: return static_cast<const uint32_t*>(p)[i];
    case chorusInt64: return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    case chorusUint64: return static_cast<double>(static_cast<const uint64_t*>(p)[i]);
    case chorusFloat16: return half_to_float(static_cast<const uint16_t*>(p)[i]);
    case chorusFloat32: return static_cast<const float*>(p)[i];
    case chorusFloat64: return static_cast<const double*>(p)[i];
    case chorusBfloat16: return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
    case chorusFloat8e4m3: return e4m3_to_float(static_cast<const uint8_t*>(p)[i]);
    case chorusFloat8e5m2: return e5m2_to_float(static_cast<const uint8_t*>(p)[i]);
    default: return 0;
  }
}

// The reduction of one value per rank, exactly, in int64 (for avg: the sum; for premulsum: the scaled sum).
inline int64_t reduce_values(TestOp o, const int64_t* vals, int n) {
  int64_t acc = (o == TestOp::Prod) ? 1 : (o == TestOp::Max ? INT64_MIN : (o == TestOp::Min ? INT64_MAX : 0));
  for (int r = 0; r < n; ++r) {
    int64_t v = vals[r];
    switch (o) {
      case TestOp::Prod: acc *= v; break;
      case TestOp::Max: acc = v > acc ? v : acc; break;
      case TestOp::Min: acc = v < acc ? v : acc; break;
      case TestOp::PreMulSum: acc += v * static_cast<int64_t>(kPreMulScalar); break;
      default: acc += v;
    }
  }
  return acc;
}

// Stores the expected result for reduced value `acc` (from reduce_values) as element i of `out` (type t).
inline void store_result(chorusDataType_t t, TestOp o, int64_t acc, int n, void* out, size_t i) {
  if (o != TestOp::Avg) {
    store(t, out, i, static_cast<double>(acc));
    return;
  }
  // avg: floats divide the exact sum; integers divide the sum as the type holds it (wrapped), truncating.
  switch (t) {
    case chorusFloat64: store(t, out, i, static_cast<double>(acc) / n); break;
    case chorusInt8: store(t, out, i, static_cast<int8_t>(acc) / n); break;
    case chorusUint8: store(t, out, i, static_cast<uint8_t>(acc) / static_cast<unsigned>(n)); break;
    case chorusInt32: store(t, out, i, static_cast<int32_t>(acc) / n); break;
    case chorusUint32: store(t, out, i, static_cast<uint32_t>(acc) / static_cast<uint32_t>(n)); break;
    case chorusInt64: store(t, out, i, static_cast<double>(acc / n)); break;
    case chorusUint64: static_cast<uint64_t*>(out)[i] = static_cast<uint64_t>(acc) / static_cast<uint64_t>(n); break;
    default: store(t, out, i, static_cast<float>(acc) / static_cast<float>(n)); break;
  }
}

// Index of the first element where `got` differs from `want` (bitwise, except that avg on 16/8-bit floats may
// differ by rounding of the division), or -1.
inline int64_t first_mismatch(chorusDataType_t t, TestOp o, const void* got, const void* want, size_t count) {
  const size_t esz = type_size(t);
  if (std::memcmp(got, want, count * esz) == 0) return -1;
  for (size_t i = 0; i < count; ++i) {
    if (std::memcmp(static_cast<const char*>(got) + i * esz, static_cast<const char*>(want) + i * esz, esz) == 0)
      continue;
    if (o == TestOp::Avg && is_float(t)) {
      double g = load(t, got, i), w = load(t, want, i);
      double tol = (t == chorusFloat64 ? 1e-12 : t == chorusFloat32 ? 1e-6 : 0.13) * std::max(1.0, std::fabs(w));
      if (std::fabs(g - w) <= tol) continue;
    }
    return static_cast<int64_t>(i);
  }
  return -1;
}

}  // namespace chorus::test
