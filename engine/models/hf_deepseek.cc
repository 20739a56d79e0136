// DeepSeek-V3 fields of a config.json (engine/models/hf_deepseek.h). Defaults are those of
// transformers 4.57.1's DeepseekV3Config; the model is its modeling_deepseek_v3.py.
#include "engine/models/hf_deepseek.h"

#include <cmath>
#include <string>

namespace memest::hf {
namespace {

std::string Str(int64_t v) { return std::to_string(v); }

// DeepseekV3Attention's softmax scale: qk_head_dim ** -0.5, times yarn_get_mscale(factor,
// mscale_all_dim) squared when rope_scaling sets mscale_all_dim (the scores' value only).
StatusOr<double> Scaling(const Fields& f, int64_t qk_head_dim) {
  double scaling = 1.0 / std::sqrt(static_cast<double>(qk_head_dim));
  const JsonValue* rope = f.Get("rope_scaling");
  if (rope == nullptr || rope->kind != Kind::kObject) return scaling;
  const JsonValue* all_dim = rope->Find("mscale_all_dim");
  if (all_dim == nullptr || all_dim->kind != Kind::kNumber || all_dim->number == 0) return scaling;
  const JsonValue* factor = rope->Find("factor");
  if (factor == nullptr || factor->kind != Kind::kNumber || !std::isfinite(factor->number) ||
      !std::isfinite(all_dim->number)) {
    return InvalidArgument(Field("rope_scaling.factor") +
                           ": a finite number is required with mscale_all_dim "
                           "(DeepseekV3Attention reads rope_scaling[\"factor\"])");
  }
  if (factor->number > 1) {
    const double mscale = 0.1 * all_dim->number * std::log(factor->number) + 1.0;
    scaling *= mscale * mscale;
  }
  return scaling;
}

}  // namespace

bool IsDeepseekType(const std::string& type) { return type == "deepseek_v3"; }

Status ReadDeepseek(const Fields& f, const std::string& type, LlamaSpec* s) {
  if (!IsDeepseekType(type)) return Status::Ok();
  MlaOptions m;
  // q_lora_rank: null is the plain q_proj (Moonlight, DeepSeek-V2-Lite's layout).
  if (f.Present("q_lora_rank") && f.Get("q_lora_rank") == nullptr) {
    m.q_lora_rank = 0;
  } else {
    MEMEST_ASSIGN_OR_RETURN(m.q_lora_rank, f.Size("q_lora_rank", 1536));
  }
  MEMEST_ASSIGN_OR_RETURN(m.kv_lora_rank, f.Size("kv_lora_rank", 512));
  MEMEST_ASSIGN_OR_RETURN(m.qk_nope_head_dim, f.Size("qk_nope_head_dim", 128));
  MEMEST_ASSIGN_OR_RETURN(m.qk_rope_head_dim, f.Size("qk_rope_head_dim", 64));
  MEMEST_ASSIGN_OR_RETURN(m.v_head_dim, f.Size("v_head_dim", 128));
  MEMEST_ASSIGN_OR_RETURN(m.rope_interleave, f.Flag("rope_interleave", true));
  if (m.qk_rope_head_dim % 2 != 0) {
    return InvalidArgument(Field("qk_rope_head_dim") + ": the rotary needs an even width, got " +
                           Str(m.qk_rope_head_dim));
  }
  // DeepseekV3Config sets head_dim = qk_rope_head_dim, the rotary tables' width; a config that
  // says otherwise builds tables that do not fit q's rotary part.
  MEMEST_ASSIGN_OR_RETURN(const int64_t head_dim, f.Size("head_dim", m.qk_rope_head_dim));
  if (head_dim != m.qk_rope_head_dim) {
    return InvalidArgument(Field("head_dim") +
                           ": the rotary tables' width, must be "
                           "qk_rope_head_dim " +
                           Str(m.qk_rope_head_dim) + ", got " + Str(head_dim));
  }
  s->head_dim = m.qk_rope_head_dim;
  if (s->kv_heads != s->heads) {
    return InvalidArgument(Field("num_key_value_heads") +
                           ": latent attention gives every head its own key and value "
                           "(kv_b_proj), which eager attention repeats by num_attention_heads / "
                           "num_key_value_heads: must be the " +
                           Str(s->heads) + " heads, got " + Str(s->kv_heads));
  }
  MEMEST_ASSIGN_OR_RETURN(const bool bias, f.Flag("attention_bias", false));
  s->qkv_bias = s->out_bias = bias;
  MEMEST_ASSIGN_OR_RETURN(s->attn_scaling, Scaling(f, m.qk_nope_head_dim + m.qk_rope_head_dim));
  s->mla = m;

  MoeOptions& moe = s->moe;
  moe.deepseek = true;
  moe.activation = s->activation;
  MEMEST_ASSIGN_OR_RETURN(moe.experts, f.Size("n_routed_experts", 256));
  MEMEST_ASSIGN_OR_RETURN(moe.top_k, f.Size("num_experts_per_tok", 8));
  MEMEST_ASSIGN_OR_RETURN(moe.expert_ffn, f.Size("moe_intermediate_size", 2048));
  MEMEST_ASSIGN_OR_RETURN(const int64_t shared, f.Size("n_shared_experts", 1));
  moe.shared_expert_ffn = shared * moe.expert_ffn;
  MEMEST_ASSIGN_OR_RETURN(moe.groups, f.Size("n_group", 8));
  MEMEST_ASSIGN_OR_RETURN(moe.topk_groups, f.Size("topk_group", 4));
  MEMEST_ASSIGN_OR_RETURN(moe.norm_topk_prob, f.Flag("norm_topk_prob", true));
  const JsonValue* scale = f.Get("routed_scaling_factor");
  if (scale != nullptr) {
    if (scale->kind != Kind::kNumber) return WrongKind("routed_scaling_factor", "a number", *scale);
    if (!std::isfinite(scale->number)) {
      return InvalidArgument(Field("routed_scaling_factor") + ": must be finite, got " +
                             Fields::JsonNumber(scale->number));
    }
  }
  moe.routed_scaling = scale != nullptr ? scale->number : 2.5;
  if (moe.experts % moe.groups != 0 || moe.experts / moe.groups < 2) {
    return InvalidArgument(Field("n_group") + ": must split the " + Str(moe.experts) +
                           " n_routed_experts into groups of at least two (each group is "
                           "scored by its two best), got " +
                           Str(moe.groups));
  }
  if (moe.topk_groups > moe.groups) {
    return InvalidArgument(Field("topk_group") + ": must be at most n_group " + Str(moe.groups) +
                           ", got " + Str(moe.topk_groups));
  }
  if (moe.top_k > moe.experts) {
    return InvalidArgument(Field("num_experts_per_tok") + ": must be at most the " +
                           Str(moe.experts) + " n_routed_experts, got " + Str(moe.top_k));
  }
  // moe_layer_freq: transformers' DeepseekV3 reads none (every layer past the dense ones is an
  // MoE), vLLM's deepseek_v2.py builds the MoE where the index divides by it: only 1 agrees.
  MEMEST_ASSIGN_OR_RETURN(const int64_t freq, f.Size("moe_layer_freq", 1));
  if (freq != 1) {
    return InvalidArgument(Field("moe_layer_freq") +
                           ": transformers builds an MoE in every layer from "
                           "first_k_dense_replace on and vLLM one in every moe_layer_freq-th; "
                           "only 1, where they agree, is modelled, got " +
                           Str(freq));
  }
  // DeepseekV3DecoderLayer: the MoE from layer first_k_dense_replace on.
  MEMEST_ASSIGN_OR_RETURN(const int64_t dense, f.Count("first_k_dense_replace", 3));
  s->first_dense_layers = dense;
  return Status::Ok();
}

}  // namespace memest::hf
