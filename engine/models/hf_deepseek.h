// The fields of DeepSeek-V3 configs beyond the Llama family's (engine/models/hf_config.cc's
// reader calls it; docs/hf-config.md, docs/moe.md): model_type deepseek_v3
// (DeepseekV3ForCausalLM: DeepSeek-V3, R1, V3.1, Moonlight). Defaults are those of transformers
// 4.57.1's DeepseekV3Config.
#ifndef MEMEST_ENGINE_MODELS_HF_DEEPSEEK_H_
#define MEMEST_ENGINE_MODELS_HF_DEEPSEEK_H_

#include <string>

#include "engine/ir/status.h"
#include "engine/models/decoders.h"
#include "engine/models/hf_fields.h"

namespace memest::hf {

bool IsDeepseekType(const std::string& type);

// For deepseek_v3 (nothing for another type): fills spec's latent attention (q_lora_rank, null
// for q_proj; kv_lora_rank; qk_nope_head_dim, qk_rope_head_dim, v_head_dim; rope_interleave),
// the scores' scaling (qk_head_dim ** -0.5, times yarn's mscale squared when rope_scaling gives
// mscale_all_dim), the rotary tables' width (head_dim, which must be qk_rope_head_dim), the
// attention biases, and the MoE layers from first_k_dense_replace on (n_routed_experts,
// num_experts_per_tok, moe_intermediate_size, n_shared_experts, n_group, topk_group,
// routed_scaling_factor, norm_topk_prob). Refuses num_key_value_heads other than the heads
// (the eager attention's repeat_kv would not fit), experts that n_group does not split into
// groups of two or more, topk_group above n_group, and no shared expert. Errors name the field.
Status ReadDeepseek(const Fields& f, const std::string& type, LlamaSpec* spec);

}  // namespace memest::hf

#endif  // MEMEST_ENGINE_MODELS_HF_DEEPSEEK_H_
