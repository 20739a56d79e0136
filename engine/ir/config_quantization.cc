// config.quantization's served formats (engine/ir/config.h), checked for ValidateRunConfig.
#include <string>
#include <utility>

#include "engine/ir/config.h"

namespace memest {

bool IsServedWeightFormat(WeightFormat f) {
  return f == WeightFormat::kW8A8Fp8 || f == WeightFormat::kW8A8Int8 ||
         f == WeightFormat::kW4A16 || f == WeightFormat::kW8A16;
}

const char* WeightFormatName(WeightFormat f) {
  switch (f) {
    case WeightFormat::kDense: return "dense";
    case WeightFormat::kBnbNf4: return "bnb-nf4";
    case WeightFormat::kBnbFp4: return "bnb-fp4";
    case WeightFormat::kBnbInt8: return "bnb-int8";
    case WeightFormat::kTorchaoInt4: return "torchao-int4";
    case WeightFormat::kTorchaoInt8: return "torchao-int8";
    case WeightFormat::kW8A8Fp8: return "w8a8-fp8";
    case WeightFormat::kW8A8Int8: return "w8a8-int8";
    case WeightFormat::kW4A16: return "w4a16";
    case WeightFormat::kW8A16: return "w8a16";
  }
  return "?";
}

namespace {

constexpr int64_t kMaxQuantBlock = int64_t{1} << 20;

Status Refuse(const std::string& field, const std::string& message) {
  return InvalidArgument("config.quantization." + field + ": " + message);
}

}  // namespace

// The served formats' settings (ValidateQuantization's, for a served format): each setting
// only where its format has it; bitsandbytes' settings never.
Status ValidateServedQuantization(const RunConfig& c) {
  const QuantizationConfig& q = c.quantization;
  const char* name = WeightFormatName(q.format);
  if (q.double_quant) return Refuse("double_quant", std::string("bitsandbytes' setting; the format is ") + name);
  if (q.compute_dtype != DType::kFloat32) {
    return Refuse("compute_dtype", std::string("bitsandbytes' setting; a ") + name +
                                       " model computes in its own dtype (config.precision)");
  }
  if (q.prepare_for_kbit_training.has_value()) {
    return Refuse("prepare_model_for_kbit_training",
                  std::string("PEFT's preparation of a bitsandbytes model; the format is ") + name);
  }
  if (!c.serving.enabled) {
    return Refuse("format", std::string(name) +
                                " is modelled as vLLM serves it (its checkpoint's layout and "
                                "kernels): set config.serving");
  }
  const bool w8a8 = q.format == WeightFormat::kW8A8Fp8 || q.format == WeightFormat::kW8A8Int8;
  if (w8a8) {
    if (q.group_size != 128 || q.zero_point || q.act_order || q.gptq_layout) {
      return Refuse(q.group_size != 128 ? "group_size"
                    : q.zero_point      ? "zero_point"
                    : q.act_order       ? "act_order"
                                        : "gptq_layout",
                    std::string("a weight-only (w4a16, w8a16) setting; the format is ") + name);
    }
    if (q.weight_scales == ScaleGranularity::kBlock &&
        (q.block_n < 1 || q.block_n > kMaxQuantBlock || q.block_k < 1 ||
         q.block_k > kMaxQuantBlock)) {
      return Refuse(q.block_n < 1 || q.block_n > kMaxQuantBlock ? "block_n" : "block_k",
                    "a block's size in [1, " + std::to_string(kMaxQuantBlock) + "], got " +
                        std::to_string(q.block_n < 1 || q.block_n > kMaxQuantBlock ? q.block_n
                                                                                   : q.block_k));
    }
    if (q.weight_scales != ScaleGranularity::kBlock && (q.block_n != 128 || q.block_k != 128)) {
      return Refuse(q.block_n != 128 ? "block_n" : "block_k",
                    "a block size is for block-wise weight scales (weight_scales block)");
    }
    if (q.weight_scales == ScaleGranularity::kBlock && q.format != WeightFormat::kW8A8Fp8) {
      return Refuse("weight_scales", "block-wise scales are fp8's (w8a8-fp8)");
    }
    if (q.asymmetric_inputs && q.format != WeightFormat::kW8A8Int8) {
      return Refuse("asymmetric_inputs", "zero points for the inputs are int8's (w8a8-int8)");
    }
    return Status::Ok();
  }
  // The W8A8 settings, each named when set.
  const std::pair<const char*, bool> w8a8_settings[] = {
      {"weight_scales", q.weight_scales != ScaleGranularity::kChannel},
      {"block_n", q.block_n != 128},
      {"block_k", q.block_k != 128},
      {"inputs", q.inputs != InputQuantization::kDynamicToken},
      {"asymmetric_inputs", q.asymmetric_inputs},
  };
  for (const auto& [field, set] : w8a8_settings) {
    if (set) {
      return Refuse(field, std::string("a W8A8 setting; ") + name + " keeps its inputs "
                    "unquantized and scales its weights per group (group_size)");
    }
  }
  if (q.group_size != -1 && (q.group_size < 1 || q.group_size > kMaxQuantBlock)) {
    return Refuse("group_size", "-1 (one group per output channel) or in [1, " +
                                    std::to_string(kMaxQuantBlock) + "], got " +
                                    std::to_string(q.group_size));
  }
  if (q.act_order && q.group_size == -1) {
    return Refuse("act_order", "act-order reorders the groups; with group_size -1 there is one");
  }
  return Status::Ok();
}

}  // namespace memest
