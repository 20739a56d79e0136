// Transformer blocks (declared in engine/models/layers.h): GPT-2's and the Llama family's,
// built from the attention in attention_layers.cc, the norms and the MLPs.
#include <algorithm>
#include <string_view>
#include <vector>

#include "engine/models/layers.h"
#include "engine/models/layers_internal.h"

namespace memest {

using namespace layers_internal;  // NOLINT: the helpers every layer uses

int TransformerBlock(GraphBuilder& b, const LayerContext& c, std::string_view name, int x,
                     const BlockOptions& o) {
  if (!ExpectRank(b, x, 3, "transformer_block")) return -1;
  const int64_t t = b.shape(x)[1];
  const int64_t d = b.shape(x)[2];
  const int64_t ffn = o.ffn > 0 ? o.ffn : 4 * d;
  ModuleScope scope(b, name);
  AttentionOptions a;
  a.heads = o.heads;
  a.kv_heads = o.kv_heads;
  a.causal = o.causal;
  a.mask_positions = o.mask_positions;
  a.kv_cache_len = o.kv_cache_len;
  a.hold_locals = o.hold_locals;
  const int input = x;
  int weights = -1;  // the eager probabilities, which the block keeps (`attn_output, _ = ...`)
  if (o.style == BlockStyle::kGpt2) {
    a.projection = AttentionProjection::kFusedHfConv1D;
    a.scale = AttentionScale::kDivideScores;
    a.probs_to_value_dtype = true;
    a.attn_dropout = o.attn_dropout >= 0 ? o.attn_dropout : o.dropout;
    a.resid_dropout = o.dropout;
    int residual = x;
    int h = LayerNorm(b, c, "ln_1", x);
    h = Attention(b, c, "attn", h, a, &weights);
    const int attn_output = h;  // GPT2Block's local (and attn_outputs'), until it returns
    x = b.Add1("add", {h, residual});
    residual = x;
    h = LayerNorm(b, c, "ln_2", x);
    const int mlp_input = h;
    {
      ModuleScope mlp(b, "mlp");
      h = HfConv1D(b, c, "c_fc", h, ffn);
      {
        ModuleScope act(b, "act");
        h = Activate(b, h, o.mlp_activation.value_or(Activation::kGeluNew));
      }
      h = HfConv1D(b, c, "c_proj", h, d);
      h = Dropout(b, c, h, o.dropout);
    }
    if (o.hold_locals) b.HoldUntilLastOp(mlp_input);
    const int out = b.Add1("add", {residual, h});
    if (o.hold_locals) {
      b.HoldUntilLastOp(input);
      b.HoldUntilLastOp(attn_output);
    }
    return out;
  }
  // Llama.
  a.projection = o.fused_projections ? AttentionProjection::kFusedQkv
                                     : AttentionProjection::kSeparate;
  a.rotary_dim = o.rotary_dim;
  a.resid_dropout = o.resid_dropout;
  a.scale = AttentionScale::kMultiplyScores;
  a.bias = o.qkv_bias;
  a.out_bias = o.out_bias;
  a.head_dim = o.head_dim;
  a.qk_norm = o.qk_norm;
  a.gemma_qk_norm = o.qk_norm && o.gemma_norm;
  a.scaling = o.attn_scaling;
  a.softcap = o.attn_softcap;
  a.sdpa_mask = o.sdpa_mask;
  a.softmax_fp32 = true;
  a.attn_dropout = std::max(o.attn_dropout, 0.0);
  a.rotary_cos = o.rotary_cos;
  a.rotary_sin = o.rotary_sin;
  a.additive_mask = o.additive_mask;
  a.mla = o.mla;
  if (a.rotary_cos < 0 && o.heads > 0) {
    const int64_t head_dim = o.head_dim > 0 ? o.head_dim : d / o.heads;
    RotaryBuffers(b, c, t, o.rotary_dim > 0 ? o.rotary_dim : head_dim, &a.rotary_cos,
                  &a.rotary_sin);
  }
  // HF builds the 4-D additive mask for eager attention only; SDPA and flash get is_causal.
  if (a.additive_mask < 0 && o.causal && c.attention == AttentionImpl::kEager) {
    a.additive_mask = AdditiveCausalMask(b, c, t);
  }
  auto norm = [&](std::string_view norm_name, int input) {
    return o.gemma_norm ? GemmaRmsNorm(b, c, norm_name, input)
                        : RmsNorm(b, c, norm_name, input, true);
  };
  int residual = x;
  int h = norm("input_layernorm", x);
  h = Attention(b, c, "self_attn", h, a, &weights);
  // Phi3DecoderLayer's `attn_outputs` (transformers 4.47), until the layer returns.
  const int attn_outputs = o.fused_projections ? h : -1;
  if (o.sandwich_norms) h = norm("post_attention_layernorm", h);
  x = b.Add1("add", {residual, h});
  residual = x;
  h = norm(o.sandwich_norms ? "pre_feedforward_layernorm" : "post_attention_layernorm", x);
  const int mlp_input = h;
  int router_logits = -1;
  if (o.moe.experts > 0) {
    h = SparseMoe(b, c, o.moe_name, h, o.moe, &router_logits);
    if (o.router_logits != nullptr && router_logits >= 0) o.router_logits->push_back(router_logits);
  } else {
    ModuleScope mlp(b, "mlp");
    const Activation act = o.mlp_activation.value_or(Activation::kSilu);
    if (o.fused_projections) {
      // Phi3MLP: gate, up = gate_up_proj(x).chunk(2, dim=-1); down_proj(up * act(gate))
      int both = Linear(b, c, "gate_up_proj", h, 2 * ffn, o.mlp_bias);
      std::vector<int> parts =
          b.Add("split", {both}, {{"dim", Int(2)}, {"sizes", Ints({ffn, ffn})}});
      if (parts.size() != 2) return -1;
      int gate = -1;
      {
        ModuleScope act_scope(b, "activation_fn");
        gate = Activate(b, parts[0], act);
      }
      h = b.Add1("mul", {parts[1], gate});
    } else {
      int gate = Linear(b, c, "gate_proj", h, ffn, o.mlp_bias);
      {
        ModuleScope act_scope(b, "act_fn");
        gate = Activate(b, gate, act);
      }
      int up = Linear(b, c, "up_proj", h, ffn, o.mlp_bias);
      h = b.Add1("mul", {gate, up});
    }
    h = Linear(b, c, "down_proj", h, d, o.mlp_bias);
    h = Dropout(b, c, h, o.resid_dropout);
  }
  if (o.hold_locals) b.HoldUntilLastOp(mlp_input);
  if (o.sandwich_norms) h = norm("post_feedforward_layernorm", h);
  const int out = b.Add1("add", {residual, h});
  if (o.hold_locals) {
    b.HoldUntilLastOp(input);
    b.HoldUntilLastOp(attn_outputs);
  }
  if (router_logits >= 0 && o.router_logits == nullptr) b.HoldUntilLastOp(router_logits);
  return out;
}

}  // namespace memest
