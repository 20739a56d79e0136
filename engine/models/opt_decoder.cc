// OPT as transformers 4.47's modeling_opt.py runs it (engine/models/decoders.h, OptSpec):
// OPTForCausalLM over OPTDecoder, its OPTDecoderLayer and OPTAttention (eager) or
// OPTSdpaAttention.
#include <cmath>
#include <string>
#include <vector>

#include "engine/models/decoders.h"
#include "engine/models/decoders_internal.h"
#include "engine/models/layers.h"
#include "engine/rules/sdpa_select.h"

namespace memest {
namespace {

using namespace decoders_internal;  // NOLINT: the helpers every decoder uses

AttrValue Int(int64_t v) { return AttrInt(v); }
AttrValue Ints(std::vector<int64_t> v) { return AttrInts(std::move(v)); }

// OPTAttention._shape: x.view(N, T, H, hd).transpose(1, 2).contiguous() (a copy).
int Heads(GraphBuilder& b, int x, int64_t heads) {
  if (!b.ok() || x < 0) return -1;
  const Shape s = b.shape(x);
  x = b.Add1("view", {x}, {{"shape", Ints({s[0], s[1], heads, s[2] / heads})}});
  x = b.Add1("transpose", {x}, {{"dim0", Int(1)}, {"dim1", Int(2)}});
  return b.Add1("contiguous", {x});
}

// The eager core on [N*H, T, hd]: bmm(q, k^T), + the 4-D mask, torch.max with finfo.min (a
// 0-dim tensor; maximum keeps both), softmax (a float16 model's in float32 and back), dropout,
// bmm with v; returns [N, H, T, hd].
int OptEager(GraphBuilder& b, const LayerContext& c, int q, int k, int v, int mask, double p) {
  ScopeGuard core(b, "core");
  if (!b.ok() || q < 0 || k < 0 || v < 0) return -1;
  const Shape s = b.shape(q);
  const int64_t n = s[0], heads = s[1], t = s[2], hd = s[3];
  q = b.Add1("view", {q}, {{"shape", Ints({n * heads, t, hd})}});
  k = b.Add1("view", {k}, {{"shape", Ints({n * heads, t, hd})}});
  v = b.Add1("view", {v}, {{"shape", Ints({n * heads, t, hd})}});
  const int kt = b.Add1("transpose", {k}, {{"dim0", Int(1)}, {"dim1", Int(2)}});
  int w = b.Add1("bmm", {q, kt});
  w = b.Add1("view", {w}, {{"shape", Ints({n, heads, t, t})}});
  w = b.Add1("add", {w, mask});
  const std::string dtype(w >= 0 ? DTypeName(b.tensor(w).dtype) : "float32");
  const int lowest = b.Add1("full", {}, {{"shape", Ints({})}, {"dtype", dtype}});
  w = b.Add1("maximum", {w, lowest});
  w = b.Add1("view", {w}, {{"shape", Ints({n * heads, t, t})}});
  if (w >= 0 && b.tensor(w).dtype == DType::kFloat16) {
    w = b.Add1("softmax", {w}, {{"dim", Int(-1)}, {"half_to_float", Int(1)}});
    w = b.Add1("to", {w}, {{"dtype", std::string("float16")}});
  } else {
    w = b.Add1("softmax", {w}, {{"dim", Int(-1)}});
  }
  w = Dropout(b, c, w, p);
  const int out = b.Add1("bmm", {w, v});
  return b.Add1("view", {out}, {{"shape", Ints({n, heads, t, hd})}});
}

// OPTSdpaAttention's core: scaled_dot_product_attention(q, k, v, is_causal=True,
// dropout_p=attention_dropout, scale=1.0) (no mask without padding).
int OptSdpa(GraphBuilder& b, const LayerContext& c, int q, int k, int v, double dropout) {
  if (!b.ok() || q < 0 || k < 0 || v < 0) return -1;
  const SdpaParams p = SdpaCallOf(b, c, q, b.shape(q)[1], /*causal=*/true, dropout);
  StatusOr<SdpaBackend> backend = SelectSdpaBackend(p, c.attention);
  if (!backend.ok()) {
    b.Fail(backend.status());
    return -1;
  }
  return SdpaCore(b, {q, k, v}, *backend, p);
}

// OPTAttention.forward: q_proj(x) * head_dim ** -0.5, k and v projected and made [N, H, T, hd]
// (the cache holds them), the core, the heads merged and out_proj.
int OptAttention(GraphBuilder& b, const LayerContext& c, int x, const OptSpec& s, int mask,
                 int64_t kv_cache_len) {
  if (!b.ok() || x < 0) return -1;
  ScopeGuard scope(b, "self_attn");
  const int64_t n = b.shape(x)[0], t = b.shape(x)[1], hd = s.d_model / s.heads;
  int q = Linear(b, c, "q_proj", x, s.d_model, s.bias);
  q = b.Add1("mul", {q}, {{"scalar", AttrFloat(1.0 / std::sqrt(static_cast<double>(hd)))}});
  const int k = Heads(b, Linear(b, c, "k_proj", x, s.d_model, s.bias), s.heads);
  const int v = Heads(b, Linear(b, c, "v_proj", x, s.d_model, s.bias), s.heads);
  q = Heads(b, q, s.heads);
  // past_key_value = (key_states, value_states): the copies.
  AttentionCache(b, c, k, v, n, s.heads, kv_cache_len, hd);
  int context = c.attention == AttentionImpl::kEager ? OptEager(b, c, q, k, v, mask, s.attn_dropout)
                                                     : OptSdpa(b, c, q, k, v, s.attn_dropout);
  context = b.Add1("transpose", {context}, {{"dim0", Int(1)}, {"dim1", Int(2)}});
  context = b.Add1("reshape", {context}, {{"shape", Ints({n, t, s.d_model})}});
  const int out = Linear(b, c, "out_proj", context, s.d_model, s.bias);
  for (int local : {x, q, k, v}) b.HoldUntilLastOp(local);  // forward's locals
  return out;
}

// OPTDecoderLayer.forward: the norms before the attention and fc1 (do_layer_norm_before) or
// after each residual add; the MLP on the tokens as [N*T, d].
int OptLayer(GraphBuilder& b, const LayerContext& c, int x, const OptSpec& s, int mask,
             int64_t kv_cache_len) {
  if (!b.ok() || x < 0) return -1;
  const Shape shape = b.shape(x);
  const int input = x;
  // OPTDecoder.forward draws `dropout_probability = torch.rand([])` before each layer in
  // training (layerdrop), a local until the next draw.
  const int draw = c.training() ? b.Add1("full", {}, {{"shape", Ints({})}}) : -1;
  int h = s.norm_before ? LayerNorm(b, c, "self_attn_layer_norm", x, s.norm_affine) : x;
  h = OptAttention(b, c, h, s, mask, kv_cache_len);
  h = b.Add1("add", {x, Dropout(b, c, h, s.dropout)});
  if (!s.norm_before) h = LayerNorm(b, c, "self_attn_layer_norm", h, s.norm_affine);
  h = b.Add1("reshape", {h}, {{"shape", Ints({-1, s.d_model})}});
  const int residual = h;
  if (s.norm_before) h = LayerNorm(b, c, "final_layer_norm", h, s.norm_affine);
  h = Linear(b, c, "fc1", h, s.ffn, s.bias);
  {
    ScopeGuard act(b, "activation_fn");
    h = Activate(b, h, s.activation);
  }
  h = Linear(b, c, "fc2", h, s.d_model, s.bias);
  h = b.Add1("add", {residual, Dropout(b, c, h, s.dropout)});
  h = b.Add1("view", {h}, {{"shape", Ints(shape)}});
  if (!s.norm_before) h = LayerNorm(b, c, "final_layer_norm", h, s.norm_affine);
  for (int local : {input, residual, draw}) b.HoldUntilLastOp(local);
  return h;
}

}  // namespace

Status BuildOptModel(GraphBuilder& b, const BuildContext& ctx, const OptSpec& s,
                     const FieldOf& field) {
  MEMEST_RETURN_IF_ERROR(CheckHeadsDivide(field, s.d_model, s.heads));
  if (s.seq > s.positions) {
    return FieldError(field, "seq",
                      "must be at most the " + Str(s.positions) +
                          " positions of the position table, got " + Str(s.seq));
  }
  const LayerContext c = LayerContextOf(ctx);
  const int64_t n = ctx.micro_batch, t = s.seq;
  const int64_t embed_dim = s.embed_dim > 0 ? s.embed_dim : s.d_model;
  const int ids = b.Input("input_ids", {n, t}, DType::kInt64, 0);
  int embed = -1;
  int h = -1;
  {
    ScopeGuard model(b, "model");
    ScopeGuard decoder(b, "decoder");
    const int inputs_embeds = Embedding(b, c, "embed_tokens", ids, s.vocab, embed_dim, &embed);
    // attention_mask = torch.ones(N, T) (float32); the 4-D mask the eager attention adds,
    // [N, 1, T, T] in the embeddings' dtype (SDPA runs is_causal and gets none);
    // position_ids = (cumsum(mask, 1) * mask - 1).long(); embed_positions(position_ids + 2).
    const int ones = b.Add1("full", {}, {{"shape", Ints({n, t})}});
    int mask = -1;
    if (c.attention == AttentionImpl::kEager && inputs_embeds >= 0) {
      const std::string dtype(DTypeName(b.tensor(inputs_embeds).dtype));
      mask = b.Add1("full", {}, {{"shape", Ints({n, 1, t, t})}, {"dtype", dtype}});
    }
    int pos = b.Add1("cumsum", {ones}, {{"dim", Int(1)}});
    pos = b.Add1("mul", {pos, ones});
    pos = b.Add1("sub", {pos}, {{"scalar", AttrFloat(1.0)}});
    const int position_ids = b.Add1("to", {pos}, {{"dtype", std::string("int64")}});
    pos = b.Add1("add", {position_ids}, {{"scalar", AttrFloat(2.0)}});
    const int pos_embeds = Embedding(b, c, "embed_positions", pos, s.positions + 2, s.d_model);
    h = inputs_embeds;
    if (embed_dim != s.d_model) h = Linear(b, c, "project_in", h, s.d_model, /*bias=*/false);
    h = b.Add1("add", {h, pos_embeds});
    const int64_t kv_cache_len = KvCacheLength(ctx, s.seq);
    h = RepeatBlocks(
        b, "layers.", s.layers, h,
        [&](int64_t, int x) { return OptLayer(b, c, x, s, mask, kv_cache_len); }, AllAlike);
    if (s.final_norm) h = LayerNorm(b, c, "final_layer_norm", h, s.norm_affine);
    if (embed_dim != s.d_model) h = Linear(b, c, "project_out", h, embed_dim, /*bias=*/false);
    // OPTDecoder.forward's locals, until it returns.
    for (int local : {inputs_embeds, ones, mask, position_ids, pos_embeds})
      b.HoldUntilLastOp(local);
  }
  LmHeadOptions head;
  head.embed = embed;
  head.tied = s.tie_embeddings;
  head.vocab = s.vocab;
  head.every_position = true;  // 4.47's OPTForCausalLM.forward takes no logits_to_keep
  LanguageModelHead(b, ctx, c, h, head);
  return Status::Ok();
}

}  // namespace memest
