// The mixture-of-experts fields of Mixtral, Qwen2-MoE and Qwen3-MoE configs
// (engine/models/hf_config.cc's Llama-family reader calls it; docs/moe.md).
#ifndef MEMEST_ENGINE_MODELS_HF_MOE_H_
#define MEMEST_ENGINE_MODELS_HF_MOE_H_

#include <string>

#include "engine/ir/status.h"
#include "engine/models/decoders.h"
#include "engine/models/hf_fields.h"

namespace memest::hf {

// Whether `type` is a model type with sparse MoE layers.
bool IsMoeType(const std::string& type);
// The config key of such a type's experts count: Mixtral's num_local_experts, Qwen's
// num_experts.
const char* ExpertsKey(const std::string& type);

// Fills spec->moe, moe_name, moe_every, dense_layers and the router's auxiliary loss from the
// config (MixtralConfig, Qwen2MoeConfig, Qwen3MoeConfig defaults), for `layers` layers.
Status ReadMoe(const Fields& f, const std::string& type, LlamaSpec* spec);

}  // namespace memest::hf

#endif  // MEMEST_ENGINE_MODELS_HF_MOE_H_
