// Element types of tensors, with their sizes and names as PyTorch spells them.
#ifndef MEMEST_ENGINE_IR_DTYPE_H_
#define MEMEST_ENGINE_IR_DTYPE_H_

#include <cstdint>
#include <string_view>

#include "engine/ir/status.h"

namespace memest {

enum class DType : uint8_t {
  kFloat32, kFloat16, kBFloat16, kFloat64, kInt64, kInt32, kInt8, kUInt8, kBool,
};

// Bytes per element (bool is one byte, as in PyTorch). Inline: the step asks it for every
// tensor it allocates.
inline int64_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat64:
    case DType::kInt64:
      return 8;
    case DType::kFloat32:
    case DType::kInt32:
      return 4;
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
    case DType::kInt8:
    case DType::kUInt8:
    case DType::kBool:
      return 1;
  }
  return 4;
}
// "float32", "float16", "bfloat16", "float64", "int64", "int32", "int8", "uint8", "bool".
std::string_view DTypeName(DType dtype);
// Accepts the names above and PyTorch's aliases ("float", "half", "bf16", "fp32", "long", ...).
StatusOr<DType> ParseDType(std::string_view name);
bool IsFloating(DType dtype);
// PyTorch's type promotion for two tensor operands of equal standing (float beats int; among
// floats the wider wins; float16 with bfloat16 gives float32).
DType PromoteTypes(DType a, DType b);

}  // namespace memest

#endif  // MEMEST_ENGINE_IR_DTYPE_H_
