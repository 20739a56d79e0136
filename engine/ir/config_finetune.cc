// config.lora's and config.quantization's checks (engine/ir/config.h, ValidateLora and
// ValidateQuantization).
#include <algorithm>
#include <cmath>
#include <iterator>
#include <string>
#include <vector>

#include "engine/ir/config.h"
#include "engine/ir/text.h"

namespace memest {
namespace {

Status CheckNames(const std::vector<std::string>& names, const std::string& field) {
  if (names.size() > kMaxLoraModules) {
    return InvalidArgument(field + ": at most " + std::to_string(kMaxLoraModules) +
                           " names, got " + std::to_string(names.size()));
  }
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string entry = field + "[" + std::to_string(i) + "]";
    if (names[i].empty()) return InvalidArgument(entry + ": must name a module, got an empty name");
    MEMEST_RETURN_IF_ERROR(CheckNameSize(names[i], entry));
  }
  return Status::Ok();
}

// vLLM's LoRA serving (config.serving with config.lora): the rank is max_lora_rank, one of
// LoRAConfig's MaxLoRARanks; target_modules are vLLM's module suffixes (empty: every module).
Status ValidateServedLora(const LoraConfig& l) {
  static constexpr int64_t kRanks[] = {1, 8, 16, 32, 64, 128, 256, 320, 512};
  if (std::find(std::begin(kRanks), std::end(kRanks), l.rank) == std::end(kRanks)) {
    return InvalidArgument("config.lora.rank: vLLM's max_lora_rank is one of 1, 8, 16, 32, 64, "
                           "128, 256, 320 or 512, got " + std::to_string(l.rank));
  }
  if (l.dropout != 0) {
    return InvalidArgument("config.lora.dropout: a server runs its adapters without dropout; "
                           "leave it unset");
  }
  if (!l.modules_to_save.empty()) {
    return InvalidArgument("config.lora.modules_to_save: vLLM's adapter slots hold the adapters' "
                           "A and B only; leave it unset");
  }
  if (l.use_dora) {
    return InvalidArgument("config.lora.use_dora: vLLM serves plain LoRA adapters, not DoRA");
  }
  MEMEST_RETURN_IF_ERROR(CheckNames(l.target_modules, "config.lora.target_modules"));
  for (size_t i = 0; i < l.target_modules.size(); ++i) {
    if (l.target_modules[i] == kLoraAllLinear) {
      return InvalidArgument("config.lora.target_modules[" + std::to_string(i) +
                             "]: vLLM's target_modules are module suffixes (\"qkv_proj\", "
                             "\"o_proj\", ...); leave it empty for every module");
    }
  }
  return Status::Ok();
}

}  // namespace

Status ValidateLora(const RunConfig& c) {
  const LoraConfig& l = c.lora;
  if (l.rank < 0 || l.rank > kMaxLoraRank) {
    return InvalidArgument("config.lora.rank: must be in [1, " + std::to_string(kMaxLoraRank) +
                           "], got " + std::to_string(l.rank));
  }
  if (l.rank == 0) {
    if (!l.target_modules.empty() || !l.modules_to_save.empty()) {
      return InvalidArgument(std::string("config.lora.") +
                             (l.target_modules.empty() ? "modules_to_save" : "target_modules") +
                             ": a LoRA setting, and config.lora.rank is not set");
    }
    return Status::Ok();
  }
  if (!std::isfinite(l.alpha)) {
    return InvalidArgument("config.lora.alpha: must be finite, got " + std::to_string(l.alpha));
  }
  if (!(l.dropout >= 0 && l.dropout <= 1)) {
    return InvalidArgument("config.lora.dropout: must be in [0, 1], got " +
                           std::to_string(l.dropout));
  }
  if (c.serving.enabled) return ValidateServedLora(l);
  if (l.target_modules.empty()) {
    return InvalidArgument("config.lora.target_modules: name the modules to adapt (their names, "
                           "as PEFT's target_modules, or \"all-linear\")");
  }
  MEMEST_RETURN_IF_ERROR(CheckNames(l.target_modules, "config.lora.target_modules"));
  MEMEST_RETURN_IF_ERROR(CheckNames(l.modules_to_save, "config.lora.modules_to_save"));
  for (size_t i = 0; i < l.target_modules.size(); ++i) {
    if (l.target_modules[i] == kLoraAllLinear && l.target_modules.size() > 1) {
      return InvalidArgument("config.lora.target_modules[" + std::to_string(i) +
                             "]: \"all-linear\" stands alone (PEFT takes it as the whole "
                             "target_modules), and " + std::to_string(l.target_modules.size()) +
                             " entries are given");
    }
  }
  const ParallelismConfig& p = c.parallelism;
  if (p.tensor > 1 || p.context > 1) {
    return InvalidArgument(std::string("config.lora: LoRA under ") +
                           (p.tensor > 1 ? "tensor" : "context") +
                           " parallelism is not modelled (data parallelism and pipelines are)");
  }
  if (p.sharding == DataSharding::kFsdp1) {
    // FSDP1's flat parameters (use_orig_params=False) take one requires_grad per unit; PEFT's
    // recipes wrap the adapters in units of their own (fsdp_auto_wrap_policy), not modelled.
    return InvalidArgument("config.lora: LoRA under FSDP1 is not modelled (a flat parameter "
                           "cannot mix frozen and trained parameters); FSDP2, ZeRO and DDP are");
  }
  return Status::Ok();
}

namespace {

// LLM.int8's settings; the 4-bit ones refused.
Status ValidateInt8(const QuantizationConfig& q) {
  if (q.double_quant || q.compute_dtype != DType::kFloat32) {
    return InvalidArgument(std::string("config.quantization.") +
                           (q.double_quant ? "double_quant" : "compute_dtype") +
                           ": a 4-bit setting; Linear8bitLt keeps a float32 scale per row and "
                           "computes in float16 (its input cast to it), returning the input's "
                           "dtype");
  }
  if (!(q.int8_threshold >= 0) || q.int8_threshold > 1e6) {
    return InvalidArgument("config.quantization.int8_threshold: in [0, 1e6] (llm_int8_threshold; "
                           "0: no outlier decomposition), got " +
                           std::to_string(q.int8_threshold));
  }
  if (q.int8_outlier_columns < 0 || q.int8_outlier_columns > kMaxInt8OutlierColumns) {
    return InvalidArgument("config.quantization.int8_outlier_columns: in [0, " +
                           std::to_string(kMaxInt8OutlierColumns) +
                           "] (a count at least a layer's input width is every column), got " +
                           std::to_string(q.int8_outlier_columns));
  }
  if (q.int8_threshold == 0 && q.int8_outlier_columns != kDefaultInt8OutlierColumns) {
    return InvalidArgument("config.quantization.int8_outlier_columns: with int8_threshold 0 "
                           "nothing is an outlier (no decomposition)");
  }
  return Status::Ok();
}

// torchao's weight-only formats (engine/passes/quantize_torchao.h): inference of a model loaded
// in its dtype, on one GPU.
Status ValidateTorchao(const RunConfig& c) {
  const QuantizationConfig& q = c.quantization;
  const std::string name = WeightFormatName(q.format);
  if (q.double_quant || q.compute_dtype != DType::kFloat32 ||
      q.prepare_for_kbit_training.has_value()) {
    return InvalidArgument(std::string("config.quantization.") +
                           (q.double_quant                       ? "double_quant"
                            : q.compute_dtype != DType::kFloat32 ? "compute_dtype"
                                                                 : "prepare_model_for_kbit_training") +
                           ": a bitsandbytes setting; the format is " + name);
  }
  if (c.mode != Mode::kInference) {
    return InvalidArgument("config.quantization.format: " + name +
                           " is torchao's weight-only quantization, for inference (a quantized "
                           "weight has no gradient; training it is QAT, not modelled)");
  }
  if (c.lora.rank > 0) {
    return InvalidArgument("config.lora: adapters over torchao's weights are not modelled");
  }
  if (c.runtime != Runtime::kCuda) {
    return InvalidArgument("config.quantization: torchao's kernels are modelled as they run on "
                           "CUDA; the step runs on " + std::string(RuntimeName(c.runtime)));
  }
  if (IsAutocast(c.precision)) {
    return InvalidArgument("config.precision: torchao's weights are the model's dtype; load it "
                           "in one (bf16-pure, fp16-pure, fp32), not under autocast");
  }
  if (q.format == WeightFormat::kTorchaoInt4) {
    if (ComputeDType(c.precision) != DType::kBFloat16) {
      return InvalidArgument("config.precision: torchao's int4 kernel (mslk bf16i4bf16_rowwise) "
                             "takes bfloat16: bf16-pure");
    }
    if (q.group_size != 32 && q.group_size != 64 && q.group_size != 128 && q.group_size != 256) {
      return InvalidArgument("config.quantization.group_size: torchao's int4 takes 32, 64, 128 "
                             "or 256, got " + std::to_string(q.group_size));
    }
  }
  const ParallelismConfig& p = c.parallelism;
  if (p.tensor > 1 || p.context > 1 || p.pipeline > 1 || p.sharding != DataSharding::kNone) {
    return InvalidArgument("config.parallelism: torchao's weights are modelled on one GPU");
  }
  return Status::Ok();
}

}  // namespace

bool KbitPrepared(const RunConfig& c) {
  return c.quantization.format != WeightFormat::kDense && !IsTorchaoFormat(c.quantization.format) &&
         c.quantization.prepare_for_kbit_training.value_or(c.mode == Mode::kTraining);
}

QuantizationConfig PreparedQuantization(const RunConfig& c) {
  QuantizationConfig q = c.quantization;
  q.prepare_for_kbit_training = KbitPrepared(c);
  return q;
}

Status ValidateQuantization(const RunConfig& c) {
  const QuantizationConfig& q = c.quantization;
  if (q.format == WeightFormat::kDense || !IsServedWeightFormat(q.format)) {
    const QuantizationConfig plain;
    if (q.weight_scales != plain.weight_scales || q.block_n != plain.block_n ||
        q.block_k != plain.block_k || q.inputs != plain.inputs ||
        q.asymmetric_inputs != plain.asymmetric_inputs ||
        (q.group_size != plain.group_size && q.format != WeightFormat::kTorchaoInt4) ||
        q.zero_point != plain.zero_point || q.act_order != plain.act_order ||
        q.gptq_layout != plain.gptq_layout) {
      return InvalidArgument("config.quantization: a setting of the served formats (w8a8-fp8, "
                             "w8a8-int8, w4a16, w8a16), and the format is " +
                             std::string(WeightFormatName(q.format)));
    }
  }
  const QuantizationConfig plain;
  const bool int8 = q.format == WeightFormat::kBnbInt8;
  if (!int8 && (q.int8_threshold != plain.int8_threshold ||
                q.int8_outlier_columns != plain.int8_outlier_columns)) {
    return InvalidArgument(std::string("config.quantization.") +
                           (q.int8_threshold != plain.int8_threshold ? "int8_threshold"
                                                                     : "int8_outlier_columns") +
                           ": LLM.int8's setting (bnb-int8), and the format is " +
                           WeightFormatName(q.format));
  }
  if (q.format == WeightFormat::kDense) {
    if (q.double_quant || !q.skip_modules.empty() || q.compute_dtype != DType::kFloat32 ||
        q.prepare_for_kbit_training.has_value()) {
      return InvalidArgument("config.quantization: a bitsandbytes setting, and no bitsandbytes "
                             "format is set");
    }
    return Status::Ok();
  }
  MEMEST_RETURN_IF_ERROR(CheckNames(q.skip_modules, "config.quantization.skip_modules"));
  if (IsServedWeightFormat(q.format)) return ValidateServedQuantization(c);
  if (IsTorchaoFormat(q.format)) return ValidateTorchao(c);
  if (!IsFloating(q.compute_dtype) || q.compute_dtype == DType::kFloat64) {
    return InvalidArgument("config.quantization.compute_dtype: float32, float16 or bfloat16, got " +
                           std::string(DTypeName(q.compute_dtype)));
  }
  if (int8) MEMEST_RETURN_IF_ERROR(ValidateInt8(q));
  if (c.runtime != Runtime::kCuda) {
    return InvalidArgument(std::string("config.quantization: bitsandbytes' layers are modelled "
                                       "as they run on CUDA; the step runs on ") +
                           RuntimeName(c.runtime));
  }
  const ParallelismConfig& p = c.parallelism;
  const bool sharded = p.sharding != DataSharding::kNone && p.sharding != DataSharding::kDdp &&
                       !IsDeepSpeedZero(p.sharding);
  if (p.tensor > 1 || p.context > 1 || p.pipeline > 1 || sharded) {
    return InvalidArgument("config.quantization: bitsandbytes' weights are modelled on one GPU and "
                           "under "
                           "DDP or DeepSpeed ZeRO-1/2, not with " +
                           std::string(p.tensor > 1     ? "tensor parallelism"
                                       : p.context > 1  ? "context parallelism"
                                       : p.pipeline > 1 ? "pipeline parallelism"
                                                        : DataShardingName(p.sharding)));
  }
  return Status::Ok();
}

}  // namespace memest
