#include "engine/ir/dtype.h"

#include <string>

#include "engine/ir/text.h"

namespace memest {

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "float32";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat64: return "float64";
    case DType::kInt64: return "int64";
    case DType::kInt32: return "int32";
    case DType::kInt8: return "int8";
    case DType::kUInt8: return "uint8";
    case DType::kBool: return "bool";
  }
  return "?";
}

StatusOr<DType> ParseDType(std::string_view name) {
  struct Alias { std::string_view name; DType dtype; };
  static constexpr Alias kAliases[] = {
      {"float32", DType::kFloat32}, {"float", DType::kFloat32}, {"fp32", DType::kFloat32},
      {"f32", DType::kFloat32},     {"float16", DType::kFloat16}, {"half", DType::kFloat16},
      {"fp16", DType::kFloat16},    {"f16", DType::kFloat16},   {"bfloat16", DType::kBFloat16},
      {"bf16", DType::kBFloat16},   {"float64", DType::kFloat64}, {"double", DType::kFloat64},
      {"fp64", DType::kFloat64},    {"int64", DType::kInt64},   {"long", DType::kInt64},
      {"int32", DType::kInt32},     {"int", DType::kInt32},     {"int8", DType::kInt8},
      {"uint8", DType::kUInt8},     {"bool", DType::kBool},
  };
  for (const Alias& a : kAliases) {
    if (a.name == name) return a.dtype;
  }
  return InvalidArgument("unknown dtype " + Quote(name) +
                         " (expected float32, float16, bfloat16, float64, int64, int32, "
                         "int8, uint8 or bool)");
}

bool IsFloating(DType d) {
  return d == DType::kFloat32 || d == DType::kFloat16 || d == DType::kBFloat16 ||
         d == DType::kFloat64;
}

DType PromoteTypes(DType a, DType b) {
  if (a == b) return a;
  if (IsFloating(a) != IsFloating(b)) return IsFloating(a) ? a : b;
  if (IsFloating(a)) {
    if (a == DType::kFloat64 || b == DType::kFloat64) return DType::kFloat64;
    if (a == DType::kFloat32 || b == DType::kFloat32) return DType::kFloat32;
    return DType::kFloat32;  // float16 with bfloat16
  }
  if (a == DType::kBool) return b;
  if (b == DType::kBool) return a;
  return DTypeSize(a) >= DTypeSize(b) ? a : b;
}

}  // namespace memest
