// GPT-2, the Llama family and GPT-NeoX as Hugging Face's modules run them
// (engine/models/decoders.h).
#include "engine/models/decoders.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>

#include "engine/models/decoders_internal.h"
#include "engine/models/layers.h"
#include "engine/models/vllm_sampler.h"

namespace memest {

namespace decoders_internal {

std::string Name(const FieldOf& field, const char* name) {
  const std::string path = field(name);
  return path.substr(path.rfind('.') + 1);
}

Status FieldError(const FieldOf& field, const char* name, const std::string& message) {
  return InvalidArgument(field(name) + ": " + message);
}

void LanguageModelHead(GraphBuilder& b, const BuildContext& ctx, const LayerContext& c,
                       int last_hidden_state, const LmHeadOptions& o) {
  int h = last_hidden_state;
  if (!Training(ctx) && !o.every_position && b.ok() && h >= 0) {
    const int64_t t = b.shape(h)[1];
    h = b.Add1("slice", {h}, {{"dim", AttrInt(1)}, {"start", AttrInt(t - 1)}, {"end", AttrInt(t)}});
  }
  int gathered = -1;
  if (ctx.serving) h = VllmSamplerInput(b, h, &gathered);
  int logits = o.tied ? TiedLinear(b, o.name, h, o.embed)
                      : Linear(b, c, o.name, h, o.vocab, /*bias=*/false);
  if (o.softcap > 0) logits = SoftCap(b, logits, o.softcap);
  if (Training(ctx)) {
    const int loss = CrossEntropyLoss(b, logits, /*upcast=*/true);
    if (o.aux_loss) b.SetLoss(o.aux_loss(loss));
  } else if (ctx.serving) {
    VllmSampler(b, logits, ctx.multiprocessors);
  }
  b.HoldUntilLastOp(last_hidden_state);
  b.HoldUntilLastOp(logits);
  b.HoldUntilLastOp(gathered);
}

Status CheckHeadsDivide(const FieldOf& field, int64_t d_model, int64_t heads) {
  if (d_model % heads == 0) return Status::Ok();
  return FieldError(field, "heads", "must divide " + Name(field, "d_model") + " " +
                                        Str(d_model) + ", got " + Str(heads));
}

}  // namespace decoders_internal

namespace {

using namespace decoders_internal;  // NOLINT: the helpers every decoder uses


// A partial rotary's dims: even, and within the head.
Status CheckRotaryDim(const FieldOf& field, const char* name, int64_t rotary_dim,
                      int64_t head_dim) {
  if (rotary_dim > 0 && rotary_dim <= head_dim && rotary_dim % 2 == 0) return Status::Ok();
  return FieldError(field, name,
                    "must rotate an even number of the head's " + Str(head_dim) +
                        " dims, got " + Str(rotary_dim));
}

// Whether layer i of a Llama-family model has the sparse MoE MLP (Qwen2MoeDecoderLayer: not in
// mlp_only_layers, and (i + 1) % decoder_sparse_step == 0).
bool SparseLayer(const LlamaSpec& s, int64_t i) {
  if (s.moe.experts <= 0 || i < s.first_dense_layers) return false;
  for (int64_t dense : s.dense_layers) {
    if (dense == i) return false;
  }
  return (i + 1) % s.moe_every == 0;
}

// Gemma 2 and 3: whether layer i attends within the window, and whether any layer does
// (`windowed`) or any does not.
bool Windowed(const LlamaSpec& s, int64_t i) {
  return i < static_cast<int64_t>(s.windowed_layers.size()) &&
         s.windowed_layers[static_cast<size_t>(i)];
}
bool AnyLayer(const LlamaSpec& s, bool windowed) {
  for (int64_t i = 0; i < s.layers; ++i) {
    if (Windowed(s, i) == windowed) return true;
  }
  return false;
}

// The options of Gemma 2's and 3's windowed layers: the global layers' `o` with the windowed
// layers' mask (eager: always, as transformers 5 builds it; SDPA: once the keys reach the
// window, flash-attn none), Gemma 3's local rotary tables and a KV cache of the window
// (LlamaSpec).
BlockOptions WindowedLayerOptions(GraphBuilder& b, const LayerContext& c, const LlamaSpec& s,
                                  int64_t rotary_dim, BlockOptions o) {
  if (s.local_rotary && AnyLayer(s, true)) {
    ScopeGuard rotary(b, "rotary_emb_local");
    LayerContext local = c;
    local.rotary_positions = c.rotary_local_positions;
    RotaryBuffers(b, local, s.seq, rotary_dim, &o.rotary_cos, &o.rotary_sin);
  }
  if (c.attention == AttentionImpl::kEager) {
    o.additive_mask = AdditiveCausalMask(b, c, s.seq, "sliding_window_mask");
  } else if (s.sliding_window <= s.seq && c.attention != AttentionImpl::kFlash) {
    o.sdpa_mask = AdditiveCausalMask(b, c, s.seq, "sliding_window_mask");
  }
  if (o.kv_cache_len > 0) {  // the window's room, less the prompt's keys the forward returns
    const int64_t prompt = c.use_cache ? s.seq : 0;
    o.kv_cache_len =
        std::min(o.kv_cache_len + prompt, std::max(s.seq, s.sliding_window)) - prompt;
  }
  return o;
}

Status CheckMoe(const FieldOf& field, const LlamaSpec& s) {
  if (s.moe.experts <= 0) return Status::Ok();
  if (s.moe.top_k <= 0 || s.moe.top_k > s.moe.experts) {
    return FieldError(field, "top_k", "must be from 1 to the " + Str(s.moe.experts) +
                                          " experts, got " + Str(s.moe.top_k));
  }
  if (s.moe.expert_ffn <= 0) {
    return FieldError(field, "expert_ffn", "must be positive, got " + Str(s.moe.expert_ffn));
  }
  if (s.moe_every <= 0) {
    return FieldError(field, "moe_every", "must be positive, got " + Str(s.moe_every));
  }
  return Status::Ok();
}

// GPTNeoXLayer.forward (transformers 5).
int NeoxLayer(GraphBuilder& b, const LayerContext& c, int x, const NeoxSpec& s,
              const AttentionOptions& a) {
  const int input = x;
  if (s.mask_positions > 0) {
    ScopeGuard attention(b, "attention");
    b.Buffer("bias", {1, 1, s.mask_positions, s.mask_positions}, DType::kBool);
    b.Buffer("masked_bias", {}, DType::kFloat32);
  }
  int weights = -1;
  int attn = Attention(b, c, "attention", LayerNorm(b, c, "input_layernorm", x), a, &weights);
  auto mlp = [&](int h) {  // GPTNeoXMLP, then post_mlp_dropout
    ScopeGuard scope(b, "mlp");
    h = Linear(b, c, "dense_h_to_4h", h, s.ffn);
    {
      ScopeGuard act(b, "act");
      h = Activate(b, h, s.activation);
    }
    h = Linear(b, c, "dense_4h_to_h", h, s.d_model);
    return Dropout(b, c, h, s.hidden_dropout);
  };
  int out = -1;
  if (s.parallel_residual) {
    // mlp_output + attn_output + hidden_states
    const int m = mlp(LayerNorm(b, c, "post_attention_layernorm", x));
    out = b.Add1("add", {b.Add1("add", {m, attn}), x});
  } else {
    attn = b.Add1("add", {attn, x});
    const int m = mlp(LayerNorm(b, c, "post_attention_layernorm", attn));
    out = b.Add1("add", {m, attn});
  }
  // The layer's input (the model's loop variable) and `attn_output, _ = self.attention(...)`.
  for (int local : {input, weights}) b.HoldUntilLastOp(local);
  return out;
}


}  // namespace

Status BuildGpt2Model(GraphBuilder& b, const BuildContext& ctx, const Gpt2Spec& s,
                      const FieldOf& field) {
  MEMEST_RETURN_IF_ERROR(CheckHeadsDivide(field, s.d_model, s.heads));
  if (s.seq > s.positions) {
    return FieldError(field, "seq", "must be at most the " + Str(s.positions) +
                                        " positions of the position table, got " + Str(s.seq));
  }
  const LayerContext c = LayerContextOf(ctx);
  int ids = b.Input("input_ids", {ctx.micro_batch, s.seq}, DType::kInt64, 0);
  int wte = -1;
  int h = -1;
  {
    ScopeGuard transformer(b, "transformer");
    const int inputs_embeds = Embedding(b, c, "wte", ids, s.vocab, s.d_model, &wte);
    // position_ids = arange(T).unsqueeze(0); wpe(position_ids)
    int pos = b.Add1("arange", {}, {{"end", AttrInt(s.seq)}});
    pos = b.Add1("unsqueeze", {pos}, {{"dim", AttrInt(0)}});
    const int position_embeds = Embedding(b, c, "wpe", pos, s.positions, s.d_model);
    h = b.Add1("add", {inputs_embeds, position_embeds});
    h = Dropout(b, c, h, s.embd_dropout);
    BlockOptions o;
    o.style = BlockStyle::kGpt2;
    o.heads = s.heads;
    o.ffn = s.ffn;
    o.dropout = s.resid_dropout;
    o.attn_dropout = s.attn_dropout;
    o.mlp_activation = s.activation;
    o.mask_positions = s.positions;
    o.hold_locals = true;
    o.kv_cache_len = KvCacheLength(ctx, s.seq);
    h = RepeatBlocks(
        b, "h.", s.layers, h, [&](int64_t, int x) { return TransformerBlock(b, c, "", x, o); },
        AllAlike);
    h = LayerNorm(b, c, "ln_f", h);
    // GPT2Model.forward's locals, until it returns.
    for (int local : {inputs_embeds, position_embeds, pos}) b.HoldUntilLastOp(local);
  }
  LmHeadOptions head;
  head.embed = wte;
  head.tied = s.tie_embeddings;
  head.vocab = s.vocab;
  LanguageModelHead(b, ctx, c, h, head);
  return Status::Ok();
}

Status BuildLlamaModel(GraphBuilder& b, const BuildContext& ctx, const LlamaSpec& s,
                       const FieldOf& field) {
  if (s.head_dim == 0) MEMEST_RETURN_IF_ERROR(CheckHeadsDivide(field, s.d_model, s.heads));
  const int64_t head_dim = s.head_dim > 0 ? s.head_dim : s.d_model / s.heads;
  if (head_dim % 2 != 0) {
    return FieldError(field, s.head_dim > 0 ? "head_dim" : "heads",
                      "must leave an even head_dim for rotary, got head_dim " + Str(head_dim));
  }
  if (s.phi3) {
    MEMEST_RETURN_IF_ERROR(
        CheckRotaryDim(field, "partial_rotary_factor", s.rotary_dim, head_dim));
  }
  if (s.heads % s.kv_heads != 0) {
    return FieldError(field, "kv_heads", "must divide heads " + Str(s.heads) + ", got " +
                                             Str(s.kv_heads));
  }
  MEMEST_RETURN_IF_ERROR(CheckMoe(field, s));
  if (s.mla && ctx.attention == AttentionImpl::kFlash &&
      s.mla->v_head_dim > s.mla->qk_nope_head_dim + s.mla->qk_rope_head_dim) {
    return FieldError(field, "v_head_dim",
                      "flash-attn pads the values to the queries' width (qk_nope_head_dim + "
                      "qk_rope_head_dim " +
                          Str(s.mla->qk_nope_head_dim + s.mla->qk_rope_head_dim) +
                          "), which must be at least v_head_dim, got " + Str(s.mla->v_head_dim) +
                          " (transformers' F.pad fails); use sdpa or eager attention");
  }
  if (s.moe.deepseek && ctx.megatron) {
    return FieldError(field, "n_routed_experts",
                      "Megatron-LM's MoELayer with DeepSeek's grouped sigmoid router is not "
                      "modelled; estimate the model as transformers runs it");
  }
  const LayerContext c = LayerContextOf(ctx);
  int ids = b.Input("input_ids", {ctx.micro_batch, s.seq}, DType::kInt64, 0);
  int embed = -1;
  int h = -1;
  std::function<int(int)> aux_loss;
  {
    ScopeGuard model(b, "model");
    const int inputs_embeds = Embedding(b, c, "embed_tokens", ids, s.vocab, s.d_model, &embed);
    h = inputs_embeds;
    if (s.gemma) {
      // hidden_states * torch.tensor(hidden_size ** 0.5, dtype=hidden_states.dtype)
      h = b.Add1("mul", {h}, {{"scalar", AttrFloat(std::sqrt(static_cast<double>(s.d_model)))}});
    }
    BlockOptions o;
    o.style = BlockStyle::kLlama;
    o.heads = s.heads;
    o.kv_heads = s.kv_heads;
    o.head_dim = s.head_dim;
    o.ffn = s.ffn;
    o.qkv_bias = s.qkv_bias;
    o.out_bias = s.out_bias;
    o.mlp_bias = s.mlp_bias;
    o.qk_norm = s.qk_norm;
    o.gemma_norm = s.gemma;
    o.fused_projections = s.phi3;
    o.rotary_dim = s.phi3 ? s.rotary_dim : 0;
    o.resid_dropout = s.resid_dropout;
    o.hold_locals = true;
    o.mlp_activation = s.activation;
    o.attn_dropout = s.attn_dropout;
    o.kv_cache_len = KvCacheLength(ctx, s.seq);
    o.sandwich_norms = s.sandwich_norms;
    o.attn_scaling = s.attn_scaling;
    o.attn_softcap = s.attn_softcap;
    const int64_t rotary_dim = o.rotary_dim > 0 ? o.rotary_dim : head_dim;
    if (!s.local_rotary || AnyLayer(s, false)) {
      ScopeGuard rotary(b, "rotary_emb");
      RotaryBuffers(b, c, s.seq, rotary_dim, &o.rotary_cos, &o.rotary_sin);
    }
    // HF builds the 4-D additive causal mask for eager attention; SDPA and flash get is_causal,
    // unless a window makes SDPA take the mask: transformers builds it once the keys reach the
    // window (kv_length >= sliding_window; 4.47 modeling_attn_mask_utils.py, 5.x
    // masking_utils.py), at seq == sliding_window too. Gemma 2's and 3's global layers take no
    // window (WindowedLayerOptions gives the windowed ones theirs).
    const bool layered = !s.windowed_layers.empty();
    const bool windowed = s.sliding_window > 0 && s.sliding_window <= s.seq && !layered;
    if (c.attention == AttentionImpl::kEager) {
      o.additive_mask = AdditiveCausalMask(b, c, s.seq);
    } else if (windowed && c.attention != AttentionImpl::kFlash) {
      o.sdpa_mask = AdditiveCausalMask(b, c, s.seq);
    }
    o.moe = s.moe;
    o.moe.load = ctx.expert_load;
    // Megatron-LM adds its load-balancing loss whenever moe_aux_loss_coeff > 0 (router.py),
    // the config's router_aux_loss_coef; transformers only with output_router_logits.
    o.moe.router_aux_loss =
        Training(ctx) && (s.router_aux_loss || (ctx.megatron && s.router_aux_loss_coef > 0));
    o.moe_name = s.moe_name;
    o.mla = s.mla;
    std::vector<int> router_logits;  // MixtralModel's all_router_logits
    if (s.router_aux_loss && Training(ctx)) o.router_logits = &router_logits;
    const BlockOptions windowed_o = layered ? WindowedLayerOptions(b, c, s, rotary_dim, o) : o;
    // Blocks differ in their window and in whether their MLP is sparse; with the router's
    // logits gathered for the loss, each block adds to that list, and is built.
    std::function<int64_t(int64_t)> variant;
    if (o.router_logits == nullptr) {
      variant = [&s](int64_t i) { return int64_t{Windowed(s, i)} * 2 + SparseLayer(s, i); };
    }
    h = RepeatBlocks(
        b, "layers.", s.layers, h,
        [&](int64_t i, int x) {
          BlockOptions layer_o = Windowed(s, i) ? windowed_o : o;
          if (!SparseLayer(s, i)) layer_o.moe.experts = 0;
          return TransformerBlock(b, c, "", x, layer_o);
        },
        variant);
    h = s.gemma ? GemmaRmsNorm(b, c, "norm", h) : RmsNorm(b, c, "norm", h, true);
    b.HoldUntilLastOp(inputs_embeds);  // LlamaModel.forward's local, until it returns
    if (!router_logits.empty()) {
      aux_loss = [&, router_logits](int loss) {
        return RouterAuxLoss(b, router_logits, s.moe, s.router_aux_loss_coef, loss);
      };
    }
  }
  LmHeadOptions head;
  head.embed = embed;
  head.tied = s.tie_embeddings;
  head.vocab = s.vocab;
  head.softcap = s.final_softcap;
  head.aux_loss = aux_loss;
  LanguageModelHead(b, ctx, c, h, head);
  return Status::Ok();
}

Status BuildNeoxModel(GraphBuilder& b, const BuildContext& ctx, const NeoxSpec& s,
                      const FieldOf& field) {
  MEMEST_RETURN_IF_ERROR(CheckHeadsDivide(field, s.d_model, s.heads));
  MEMEST_RETURN_IF_ERROR(
      CheckRotaryDim(field, "rotary_dim", s.rotary_dim, s.d_model / s.heads));
  const LayerContext c = LayerContextOf(ctx);
  int ids = b.Input("input_ids", {ctx.micro_batch, s.seq}, DType::kInt64, 0);
  int embed = -1;
  int h = -1;
  {
    ScopeGuard model(b, "gpt_neox");
    const int inputs_embeds = Embedding(b, c, "embed_in", ids, s.vocab, s.d_model, &embed);
    h = Dropout(b, c, inputs_embeds, s.hidden_dropout);
    AttentionOptions a;
    a.heads = s.heads;
    a.causal = true;
    a.projection = AttentionProjection::kFusedPerHead;
    a.names = {"", "", "", "dense"};
    a.bias = s.attention_bias;
    a.scale = AttentionScale::kMultiplyScores;
    a.softmax_fp32 = true;
    a.attn_dropout = s.attn_dropout;
    a.resid_dropout = s.hidden_dropout;  // post_attention_dropout
    a.rotary_dim = s.rotary_dim;
    a.kv_cache_len = KvCacheLength(ctx, s.seq);
    a.hold_locals = true;
    {
      ScopeGuard rotary(b, "rotary_emb");
      RotaryBuffers(b, c, s.seq, s.rotary_dim, &a.rotary_cos, &a.rotary_sin);
    }
    if (c.attention == AttentionImpl::kEager) a.additive_mask = AdditiveCausalMask(b, c, s.seq);
    NeoxSpec layer = s;
    if (ctx.serving) layer.mask_positions = 0;  // transformers 4's mask buffers; vLLM has none
    h = RepeatBlocks(
        b, "layers.", s.layers, h, [&](int64_t, int x) { return NeoxLayer(b, c, x, layer, a); },
        AllAlike);
    h = LayerNorm(b, c, "final_layer_norm", h);
    b.HoldUntilLastOp(inputs_embeds);  // GPTNeoXModel.forward's local, until it returns
  }
  LmHeadOptions head;
  head.name = "embed_out";
  head.embed = embed;
  head.tied = s.tie_embeddings;
  head.vocab = s.vocab;
  LanguageModelHead(b, ctx, c, h, head);
  return Status::Ok();
}

}  // namespace memest
