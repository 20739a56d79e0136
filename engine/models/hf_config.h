// The Hugging Face front end: a config.json (HfConfigSpec in engine/models/model.h) built, offline
// and without weights, into the same decoders the presets use (engine/models/decoders.h), as
// AutoModelForCausalLM.from_config would build it. Fields are read as the model's transformers
// Config class reads them: a field left out takes that class's default, except the sizes that
// make the model (hidden size, layers, heads, MLP size, vocabulary), which must be given.
//
// model_type    module                  what the config decides
//   llama       LlamaForCausalLM        Llama 1, 2, 3, 3.1, 3.2: GQA, head_dim, attention_bias
//                                       (q, k, v, o), mlp_bias, tie_word_embeddings, rope_scaling
//   mistral     MistralForCausalLM      sliding_window (4096 when left out), head_dim
//   qwen2       Qwen2ForCausalLM        q, k, v biased (o_proj not); use_sliding_window refused
//   qwen3       Qwen3ForCausalLM        head_dim (128 when left out), q_norm and k_norm
//   gemma       GemmaForCausalLM        Gemma 1: head_dim (256), embeddings scaled by
//                                       sqrt(hidden_size), GemmaRMSNorm, tied by default
//   gemma2      Gemma2ForCausalLM       as Gemma 1, and four norms a layer (post_attention,
//                                       pre_ and post_feedforward), query_pre_attn_scalar,
//                                       attn_logit_softcapping (eager), final_logit_softcapping,
//                                       sliding_window on every other layer (layer_types),
//                                       hidden_activation
//   gemma3_text Gemma3ForCausalLM       as Gemma 2 without the scores' soft-capping, q_norm
//                                       and k_norm, sliding_window_pattern (6), the windowed
//                                       layers' own rotary tables; "gemma3" (the multimodal
//                                       Gemma3ForConditionalGeneration) is refused
//   phi3        Phi3ForCausalLM         qkv_proj and gate_up_proj fused, partial_rotary_factor,
//                                       resid_pdrop, sliding_window (none when left out)
//   gpt_neox    GPTNeoXForCausalLM      Pythia, GPT-NeoX-20B: use_parallel_residual, rotary_pct,
//                                       attention_bias, hidden_dropout
//   gpt2        GPT2LMHeadModel         n_positions, n_inner, activation_function, the dropouts
//   falcon      FalconForCausalLM       Falcon 7B/40B/180B: query_key_value fused, multi_query,
//                                       new_decoder_architecture (num_kv_heads, ln_attn/ln_mlp),
//                                       parallel_attn, bias, ffn_hidden_size, activation,
//                                       tied by default; alibi and the remote-code types
//                                       "RefinedWebModel"/"RefinedWeb" are refused
//   opt         OPTForCausalLM          learned positions (+2 rows), word_embed_proj_dim with
//                                       project_in/project_out, do_layer_norm_before,
//                                       enable_bias, layer_norm_elementwise_affine, ffn_dim,
//                                       activation_function, dropout; every position's logits
//                                       in inference
//
// Errors are INVALID_ARGUMENT naming "model.hf_config.config.<field>" (a missing size, a value
// of the wrong type or out of range, an unknown model_type or hidden_act, an architecture other
// than the causal LM, a setting not modelled such as a quantization_config) or
// "model.hf_config.seq".
#ifndef MEMEST_ENGINE_MODELS_HF_CONFIG_H_
#define MEMEST_ENGINE_MODELS_HF_CONFIG_H_

#include <optional>
#include <string>
#include <vector>

#include "engine/ir/config.h"
#include "engine/ir/dtype.h"
#include "engine/ir/graph.h"
#include "engine/models/model.h"

namespace memest {

StatusOr<Graph> BuildHfConfig(const HfConfigSpec& spec, const BuildContext& context);

// Whether the config's model has sparse mixture-of-experts layers (mixtral, qwen2_moe,
// qwen3_moe with experts), which config.expert_load applies to.
bool HfConfigRoutesExperts(const JsonValue& config);

// What a config says about running the model, for a request that leaves it unset: the dtype the
// weights are stored in ("torch_dtype", or "dtype" since transformers 4.56) and the attention
// implementation ("attn_implementation" / "_attn_implementation": eager, sdpa,
// flash_attention_2). Only what `dtype` and `attention` ask for is read (a request that sets
// the precision does not care what the config's torch_dtype holds). Errors name the field.
struct HfRunHints {
  std::optional<DType> dtype;
  std::optional<AttentionImpl> attention;
};
StatusOr<HfRunHints> HfConfigRunHints(const JsonValue& config, bool dtype, bool attention);

// The model types BuildHfConfig builds, sorted.
const std::vector<std::string>& HfModelTypes();

}  // namespace memest

#endif  // MEMEST_ENGINE_MODELS_HF_CONFIG_H_
