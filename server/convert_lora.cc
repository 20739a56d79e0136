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
  out.use_dora = lora.use_dora();
  return out;
}

StatusOr<QuantizationConfig> QuantizationFromProto(const v1::Quantization& q) {
  QuantizationConfig out;
  switch (q.format()) {
    case v1::WEIGHT_FORMAT_BNB_NF4:
      out.format = WeightFormat::kBnbNf4;
      break;
    case v1::WEIGHT_FORMAT_BNB_FP4:
      out.format = WeightFormat::kBnbFp4;
      break;
    case v1::WEIGHT_FORMAT_BNB_INT8:
      out.format = WeightFormat::kBnbInt8;
      break;
    case v1::WEIGHT_FORMAT_TORCHAO_INT4:
      out.format = WeightFormat::kTorchaoInt4;
      break;
    case v1::WEIGHT_FORMAT_TORCHAO_INT8:
      out.format = WeightFormat::kTorchaoInt8;
      break;
    case v1::WEIGHT_FORMAT_W8A8_FP8:
      out.format = WeightFormat::kW8A8Fp8;
      break;
    case v1::WEIGHT_FORMAT_W8A8_INT8:
      out.format = WeightFormat::kW8A8Int8;
      break;
    case v1::WEIGHT_FORMAT_W4A16:
      out.format = WeightFormat::kW4A16;
      break;
    case v1::WEIGHT_FORMAT_W8A16:
      out.format = WeightFormat::kW8A16;
      break;
    case v1::WEIGHT_FORMAT_UNSPECIFIED:
      return InvalidArgument(
          "config.quantization.format: required when config.quantization is "
          "set (WEIGHT_FORMAT_BNB_NF4, _BNB_FP4, _BNB_INT8, _TORCHAO_INT4, "
          "_TORCHAO_INT8, _W8A8_FP8, _W8A8_INT8, _W4A16 or _W8A16)");
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
  if (q.has_int8_threshold()) out.int8_threshold = q.int8_threshold();
  if (q.has_int8_outlier_columns()) out.int8_outlier_columns = q.int8_outlier_columns();
  switch (q.weight_scales()) {
    case v1::SCALE_GRANULARITY_UNSPECIFIED:
    case v1::SCALE_GRANULARITY_CHANNEL:
      out.weight_scales = ScaleGranularity::kChannel;
      break;
    case v1::SCALE_GRANULARITY_TENSOR:
      out.weight_scales = ScaleGranularity::kTensor;
      break;
    case v1::SCALE_GRANULARITY_BLOCK:
      out.weight_scales = ScaleGranularity::kBlock;
      break;
    default:
      return InvalidArgument("config.quantization.weight_scales: unknown value " +
                             std::to_string(static_cast<int>(q.weight_scales())));
  }
  switch (q.inputs()) {
    case v1::INPUT_QUANTIZATION_UNSPECIFIED:
    case v1::INPUT_QUANTIZATION_DYNAMIC_TOKEN:
      out.inputs = InputQuantization::kDynamicToken;
      break;
    case v1::INPUT_QUANTIZATION_DYNAMIC_TENSOR:
      out.inputs = InputQuantization::kDynamicTensor;
      break;
    case v1::INPUT_QUANTIZATION_STATIC:
      out.inputs = InputQuantization::kStatic;
      break;
    default:
      return InvalidArgument("config.quantization.inputs: unknown value " +
                             std::to_string(static_cast<int>(q.inputs())));
  }
  if (q.block_n() != 0) out.block_n = q.block_n();
  if (q.block_k() != 0) out.block_k = q.block_k();
  out.asymmetric_inputs = q.asymmetric_inputs();
  if (q.has_group_size()) out.group_size = q.group_size();
  out.zero_point = q.zero_point();
  out.act_order = q.act_order();
  out.gptq_layout = q.gptq_layout();
  return out;
}

}  // namespace memest
