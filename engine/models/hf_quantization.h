// A config.json's quantization_config, the checkpoint's quantized weights, as
// config.quantization (engine/ir/config.h): what transformers and vLLM read from it.
//
// quant_method        becomes
//   bitsandbytes      load_in_4bit: bnb-nf4 / bnb-fp4 with bnb_4bit_use_double_quant,
//                     bnb_4bit_compute_dtype and llm_int8_skip_modules; load_in_8bit: bnb-int8
//                     with llm_int8_threshold and llm_int8_skip_modules
//                     (llm_int8_has_fp16_weight true refused)
//   fp8               w8a8-fp8: weight_block_size's block scales, else one per tensor;
//                     activation_scheme dynamic (per tensor; per token group with blocks) or
//                     static; modules_to_not_convert / ignored_layers skipped
//   compressed-tensors  its config_groups' one scheme: 8-bit float weights and inputs w8a8-fp8,
//                     8-bit int weights and inputs w8a8-int8 (input_activations.symmetric
//                     false: zero points), 4- or 8-bit int weights alone w4a16 / w8a16
//                     (weights.group_size, symmetric false: zero points, actorder); weight
//                     strategies channel, tensor, group and block; input strategies token and
//                     tensor, dynamic or static; `ignore` skipped ("re:" patterns as they are)
//   awq               w4a16 with zero points (bits 4, group_size, modules_to_not_convert)
//   gptq              w4a16 / w8a16 (bits), group_size, desc_act, sym false: zero points; the
//                     GPTQ layout
// Anything else (another method, 2- or 3-bit weights, several schemes, sparsity, a quantized
// lm_head) is refused naming "model.hf_config.config.quantization_config.<field>".
#ifndef MEMEST_ENGINE_MODELS_HF_QUANTIZATION_H_
#define MEMEST_ENGINE_MODELS_HF_QUANTIZATION_H_

#include <string>

#include "engine/ir/config.h"
#include "engine/ir/json.h"
#include "engine/ir/status.h"
#include "engine/models/model.h"

namespace memest {

// config.json's quantization_config (present: the caller checks) as config.quantization.
StatusOr<QuantizationConfig> HfConfigQuantization(const JsonValue& config);

// The config's quant_method, for notes ("" when absent or not a string).
std::string HfQuantMethod(const JsonValue& config);

// A model whose config.json carries a quantization_config, resolved for the builders: the
// model without it, and `config->quantization` set to the checkpoint's (which the request must
// leave unset: INVALID_ARGUMENT naming config.quantization otherwise). Any other model is
// returned as it is. Estimate and the planner call it first.
StatusOr<ModelSpec> ResolveCheckpointQuantization(const ModelSpec& model, RunConfig* config);

}  // namespace memest

#endif  // MEMEST_ENGINE_MODELS_HF_QUANTIZATION_H_
