// Datatype and reduction-op facts shared by validation, kernels and tools.
#pragma once

#include <chorus/chorus.h>

#include <cstddef>

namespace chorus {

inline bool dtype_valid(int dtype) { return dtype >= 0 && dtype < chorusNumTypes; }
inline size_t dtype_size(chorusDataType_t dtype) {
  switch (dtype) {
    case chorusInt8:
    case chorusUint8:
    case chorusFloat8e4m3:
    case chorusFloat8e5m2: return 1;
    case chorusFloat16:
    case chorusBfloat16: return 2;
    case chorusInt32:
    case chorusUint32:
    case chorusFloat32: return 4;
    case chorusInt64:
    case chorusUint64:
    case chorusFloat64: return 8;
    default: return 0;
  }
}
inline bool dtype_is_float(chorusDataType_t d) {
  return d == chorusFloat16 || d == chorusFloat32 || d == chorusFloat64 || d == chorusBfloat16 ||
         d == chorusFloat8e4m3 || d == chorusFloat8e5m2;
}
// The floats narrower than float32 (fp16, bf16, fp8), which CHORUS_FP32_PARTIALS widens for a reduction.
inline bool dtype_is_narrow_float(chorusDataType_t d) {
  return d == chorusFloat16 || d == chorusBfloat16 || d == chorusFloat8e4m3 || d == chorusFloat8e5m2;
}
const char* dtype_name(chorusDataType_t dtype);  // "float", "half", ... (nccl-tests names)
const char* op_name(chorusRedOp_t op);           // "sum", "prod", "max", "min", "avg", "premulsum"

}  // namespace chorus
