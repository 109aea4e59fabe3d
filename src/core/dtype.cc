#include "core/dtype.h"

namespace chorus {

const char* dtype_name(chorusDataType_t dtype) {
  switch (dtype) {
    case chorusInt8: return "int8";
    case chorusUint8: return "uint8";
    case chorusInt32: return "int32";
    case chorusUint32: return "uint32";
    case chorusInt64: return "int64";
    case chorusUint64: return "uint64";
    case chorusFloat16: return "half";
    case chorusFloat32: return "float";
    case chorusFloat64: return "double";
    case chorusBfloat16: return "bfloat16";
    case chorusFloat8e4m3: return "f8e4m3";
    case chorusFloat8e5m2: return "f8e5m2";
    default: return "invalid";
  }
}

const char* op_name(chorusRedOp_t op) {
  switch (op) {
    case chorusSum: return "sum";
    case chorusProd: return "prod";
    case chorusMax: return "max";
    case chorusMin: return "min";
    case chorusAvg: return "avg";
    default: return op >= chorusNumOps ? "premulsum" : "invalid";
  }
}

}  // namespace chorus
