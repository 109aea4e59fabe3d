// CPU reduction kernels: one Reducer per collective call applies the op element-wise, vectorised.
//
// Semantics (the public contract of chorus.h):
//  - fp16, bf16, fp8 e4m3, fp8 e5m2 are widened to fp32, combined, and rounded to nearest-even once per result.
//    fp8 e4m3 saturates to +-448 on overflow (it has no infinity); e5m2 overflows to +-inf; NaN stays NaN.
//  - min/max propagate NaN (any NaN operand gives NaN).
//  - Integer sum/prod wrap modulo 2^bits; integer avg truncates toward zero.
//  - premul (pre-multiplied sum): the operand that comes from the user's input buffer is multiplied by the scalar
//    (in fp32 for 16/8-bit floats, in the type otherwise) before it is combined.
//  - avg: the final result is divided by nranks (in fp32 / fp64 for floats; integer division for integers); a
//    reduction that divides first rounds the sum to the type, so the bits do not depend on which step divides.
#pragma once

#include <chorus/chorus.h>

#include <cstddef>
#include <cstdint>

namespace chorus::kernels {

enum class ReduceKind : uint8_t { Sum, Prod, Max, Min };

struct ReduceSpec {
  chorusDataType_t dtype = chorusFloat32;
  ReduceKind kind = ReduceKind::Sum;
  bool premul = false;    // multiply operands read from the user's input by `scalar`
  double scalar_f = 1.0;  // premul scalar for floating types
  int64_t scalar_i = 1;   // premul scalar for integer types (used modulo 2^bits)
  int avg_divisor = 0;    // > 0: divide the final result by this (chorusAvg)
};

class Reducer {
 public:
  explicit Reducer(const ReduceSpec& spec);
  // dst[i] = a[i] op b'[i] for i < n elements, where b' = premul(b) if b_is_input, and the result is divided by
  // avg_divisor if final. dst may equal a or b; no other overlap.
  void reduce(void* dst, const void* a, const void* b, size_t n, bool b_is_input, bool final) const;
  // dst[i] = src'[i]: premul if src_is_input, divided if final; a plain memcpy when neither applies.
  // dst == src is allowed (then only the transform is applied).
  void copy(void* dst, const void* src, size_t n, bool src_is_input, bool final) const;
  const ReduceSpec& spec() const { return spec_; }
  size_t elem_size() const { return elem_; }

  using ReduceFn = void (*)(const ReduceSpec&, void*, const void*, const void*, size_t, bool, bool);
  using CopyFn = void (*)(const ReduceSpec&, void*, const void*, size_t, bool, bool);

 private:
  ReduceSpec spec_;
  size_t elem_;
  ReduceFn reduce_fn_;
  CopyFn copy_fn_;
};

// Element-wise conversion between float32 and a floating-point type, n elements: widen_to_float writes
// dst[i] = src[i] exactly; narrow_from_float rounds to nearest-even with the reducer's rules above (fp16 and e5m2
// overflow to inf, e4m3 saturates, NaN stays NaN). dtype: chorusFloat16, chorusBfloat16, chorusFloat8e4m3,
// chorusFloat8e5m2, or chorusFloat32 (a copy); anything else is chorusInvalidArgument. The buffers must not
// overlap. Thread-safe (no state).
void widen_to_float(chorusDataType_t dtype, const void* src, float* dst, size_t n);
void narrow_from_float(chorusDataType_t dtype, const float* src, void* dst, size_t n);

}  // namespace chorus::kernels
