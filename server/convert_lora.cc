// config.lora and config.quantization from the proto (server/convert.h).
#include <string>

#include "server/convert.h"

namespace memest {

StatusOr<LoraConfig> LoraFromProto(const v1::Lora& lora) {
  if (lora.rank() == 0) {
    return InvalidArgument("config.lora.rank: required when config.lora is set (1 to " +
                           std::to_string(kMaxLoraRank) + ")");
  }
  LoraConfig out;
  out.rank = lora.rank();
  if (lora.has_alpha()) out.alpha = lora.alpha();
  out.dropout = lora.dropout();
  out.target_modules.assign(lora.target_modules().begin(), lora.target_modules().end());
  out.modules_to_save.assign(lora.modules_to_save().begin(), lora.modules_to_save().end());
  out.autocast_adapter_dtype = !lora.keep_adapter_dtype();
  return out;
}

StatusOr<QuantizationConfig> QuantizationFromProto(const v1::Quantization& q) {
  QuantizationConfig out;
  switch (q.format()) {
    case v1::WEIGHT_FORMAT_BNB_NF4: out.format = WeightFormat::kBnbNf4; break;
    case v1::WEIGHT_FORMAT_BNB_FP4: out.format = WeightFormat::kBnbFp4; break;
    case v1::WEIGHT_FORMAT_UNSPECIFIED:
      return InvalidArgument("config.quantization.format: required when config.quantization is "
                             "set (WEIGHT_FORMAT_BNB_NF4 or WEIGHT_FORMAT_BNB_FP4)");
    default:
      return InvalidArgument("config.quantization.format: unknown value " +
                             std::to_string(static_cast<int>(q.format())));
  }
  out.double_quant = q.double_quant();
  if (!q.compute_dtype().empty()) {
    StatusOr<DType> dtype = ParseDType(q.compute_dtype());
    if (!dtype.ok()) return dtype.status().Prefixed("config.quantization.compute_dtype: ");
    out.compute_dtype = *dtype;
  }
  out.skip_modules.assign(q.skip_modules().begin(), q.skip_modules().end());
  if (q.has_prepare_model_for_kbit_training()) {
    out.prepare_for_kbit_training = q.prepare_model_for_kbit_training();
  }
  return out;
}

}  // namespace memest
