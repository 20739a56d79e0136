// Falcon as transformers 4.47's modeling_falcon.py runs it (engine/models/decoders.h, FalconSpec):
// FalconForCausalLM over FalconModel, its FalconDecoderLayer, FalconAttention (eager and SDPA,
// rotary; alibi is refused by the config reader) and FalconMLP.
#include <cmath>
#include <string>
#include <string_view>
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

// What every layer's attention reads from the model: the rotary tables, the eager mask (-1
// under SDPA, which runs is_causal) and the inference KV cache's length.
struct FalconShared {
  int cos = -1;
  int sin = -1;
  int mask = -1;
  int64_t kv_cache_len = 0;
};

// FalconLinear: `input @ self.weight.T`, then `+ self.bias` as a second op (an output-sized
// temporary beside the product) when biased.
int FalconLinear(GraphBuilder& b, const LayerContext& c, std::string_view name, int x,
                 int64_t out_features, bool bias) {
  if (!b.ok() || x < 0) return -1;
  int y = Linear(b, c, name, x, out_features, /*bias=*/false);
  if (!bias) return y;
  ScopeGuard scope(b, name);
  return b.Add1("add", {y, b.Parameter("bias", {out_features}, c.param_dtype)});
}

// x[..., [-2], :] along `dim`: an int64 index tensor and a copy of the rows it picks.
int PickRow(GraphBuilder& b, int x, int64_t dim) {
  const int index = b.Add1("full", {}, {{"shape", Ints({1})}, {"dtype", std::string("int64")}});
  return b.Add1("index", {x, index}, {{"dim", Int(dim)}});
}

// FalconAttention._split_heads and the transposes after it: q [N, H, T, hd] and k, v
// [N, kv, T, hd] where kv is 1 (multi_query) or H (a head each, or new_decoder_architecture,
// whose groups' k and v are broadcast to every head and flattened: copies).
void SplitFalconHeads(GraphBuilder& b, int fused, const FalconSpec& s, int64_t hd, int* q, int* k,
                      int* v, int64_t* kv) {
  if (!b.ok() || fused < 0) return;
  const int64_t n = b.shape(fused)[0], t = b.shape(fused)[1], heads = s.heads;
  if (s.new_decoder_architecture) {
    const int64_t groups = s.kv_heads > 0 ? s.kv_heads : heads;
    const int64_t per_group = heads / groups;
    const int qkv = b.Add1("view", {fused}, {{"shape", Ints({n, t, groups, per_group + 2, hd})}});
    *q = b.Add1("slice", {qkv}, {{"dim", Int(3)}, {"start", Int(0)}, {"end", Int(per_group)}});
    *k = PickRow(b, qkv, 3);
    *v = PickRow(b, qkv, 3);
    // torch.broadcast_to(key, query.shape), then [x.flatten(2, 3) for x in (q, k, v)]
    for (int* part : {k, v}) {
      *part = b.Add1("expand", {*part}, {{"shape", Ints({n, t, groups, per_group, hd})}});
    }
    for (int* part : {q, k, v}) {
      *part = b.Add1("flatten", {*part}, {{"start_dim", Int(2)}, {"end_dim", Int(3)}});
    }
    *kv = heads;
  } else if (!s.multi_query) {
    // fused_qkv.view(N, T, H, 3, hd)[..., i, :]
    const int qkv = b.Add1("view", {fused}, {{"shape", Ints({n, t, heads, 3, hd})}});
    int* parts[] = {q, k, v};
    for (int64_t i = 0; i < 3; ++i) {
      const int row =
          b.Add1("slice", {qkv}, {{"dim", Int(3)}, {"start", Int(i)}, {"end", Int(i + 1)}});
      *parts[i] = b.Add1("squeeze", {row}, {{"dim", Int(3)}});
    }
    *kv = heads;
  } else {
    // fused_qkv.view(N, T, H + 2, hd): [..., :-2, :], [..., [-2], :], [..., [-1], :]
    const int qkv = b.Add1("view", {fused}, {{"shape", Ints({n, t, heads + 2, hd})}});
    *q = b.Add1("slice", {qkv}, {{"dim", Int(2)}, {"start", Int(0)}, {"end", Int(heads)}});
    *k = PickRow(b, qkv, 2);
    *v = PickRow(b, qkv, 2);
    *kv = 1;
  }
  // x.transpose(1, 2).reshape(N, heads, T, hd): a copy of a strided x.
  for (int* part : {q, k, v}) {
    const int64_t h = part == q ? heads : *kv;
    *part = b.Add1("transpose", {*part}, {{"dim0", Int(1)}, {"dim1", Int(2)}});
    *part = b.Add1("reshape", {*part}, {{"shape", Ints({n, h, t, hd})}});
  }
}

// The core under SDPA: scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0,
// is_causal=True). Falcon passes no enable_gqa, so a shared k and v (multi_query) rule out the
// fused kernels and the math kernel's products broadcast them to every head (copies); under
// flash_attention_2 (FalconFlashAttention2) flash-attn takes them as they are.
int FalconSdpa(GraphBuilder& b, const LayerContext& c, int q, int k, int v, int64_t kv) {
  if (!b.ok() || q < 0 || k < 0 || v < 0) return -1;
  const Shape qs = b.shape(q);
  const SdpaParams p = SdpaCallOf(b, c, q, kv, /*causal=*/true, /*dropout=*/0.0);
  SdpaBackend backend = SdpaBackend::kMath;
  if (kv == p.heads || c.attention == AttentionImpl::kFlash) {
    StatusOr<SdpaBackend> chosen = SelectSdpaBackend(p, c.attention);
    if (!chosen.ok()) {
      b.Fail(chosen.status());
      return -1;
    }
    backend = *chosen;
  }
  if (backend == SdpaBackend::kMath && kv < p.heads) {
    for (int* part : {&k, &v}) {
      const int e = b.Add1("expand", {*part}, {{"shape", Ints({qs[0], p.heads, qs[2], qs[3]})}});
      *part = b.Add1("reshape", {e}, {{"shape", Ints({qs[0], p.heads, qs[2], qs[3]})}});
    }
  }
  return SdpaCore(b, {q, k, v}, backend, p);
}

// The eager core without alibi: q @ k^T (broadcasting a shared k), `/= sqrt(hd)` in place,
// softmax(scores + mask, dtype=hidden_states.dtype), @ v; no dropout (4.47 applies none here).
int FalconEager(GraphBuilder& b, const LayerContext& c, int q, int k, int v, int mask) {
  ScopeGuard core(b, "core");
  if (!b.ok() || q < 0) return -1;
  const double hd = static_cast<double>(b.shape(q)[3]);
  const int kt = b.Add1("transpose", {k}, {{"dim0", Int(-1)}, {"dim1", Int(-2)}});
  int scores = b.Add1("matmul", {q, kt});
  scores = b.Add1("div_", {scores}, {{"scalar", AttrFloat(std::sqrt(hd))}});
  scores = b.Add1("add", {scores, mask});
  if (scores >= 0 && b.tensor(scores).dtype != c.param_dtype) {
    scores = b.Add1("to", {scores}, {{"dtype", std::string(DTypeName(c.param_dtype))}});
  }
  const int probs = b.Add1("softmax", {scores}, {{"dim", Int(-1)}});
  return b.Add1("matmul", {probs, v});
}

// FalconAttention.forward (rotary): query_key_value, the heads split, the rotary on q and k,
// the cache, the core, the heads merged (view, permute, reshape) and dense.
int FalconAttention(GraphBuilder& b, const LayerContext& c, int x, const FalconSpec& s,
                    const FalconShared& shared) {
  if (!b.ok() || x < 0) return -1;
  ScopeGuard scope(b, "self_attention");
  const int64_t n = b.shape(x)[0], t = b.shape(x)[1], d = s.d_model, hd = d / s.heads;
  if (c.rotary_positions == 0) {
    // The layer's own FalconRotaryEmbedding (4.47 keeps it beside the model's): inv_freq.
    ScopeGuard rotary(b, "rotary_emb");
    b.Buffer("inv_freq", {hd / 2}, DType::kFloat32);
  }
  const int64_t groups = s.kv_heads > 0 ? s.kv_heads : s.heads;
  const int64_t width = s.new_decoder_architecture ? (2 * groups + s.heads) * hd
                        : s.multi_query            ? d + 2 * hd
                                                   : 3 * d;
  const int fused = FalconLinear(b, c, "query_key_value", x, width, s.bias);
  int q = -1, k = -1, v = -1;
  int64_t kv = 0;
  SplitFalconHeads(b, fused, s, hd, &q, &k, &v, &kv);
  const int cos = b.Add1("unsqueeze", {shared.cos}, {{"dim", Int(1)}});
  const int sin = b.Add1("unsqueeze", {shared.sin}, {{"dim", Int(1)}});
  q = ApplyRotary(b, q, cos, sin);
  k = ApplyRotary(b, k, cos, sin);
  // layer_past.update(key_layer, value_layer): k after the rotary.
  AttentionCache(b, c, k, v, n, kv, shared.kv_cache_len, hd);
  int context = c.attention == AttentionImpl::kEager ? FalconEager(b, c, q, k, v, shared.mask)
                                                     : FalconSdpa(b, c, q, k, v, kv);
  context = b.Add1("permute", {context}, {{"dims", Ints({0, 2, 1, 3})}});
  context = b.Add1("reshape", {context}, {{"shape", Ints({n, t, d})}});
  const int out = FalconLinear(b, c, "dense", context, d, s.bias);
  for (int local : {x, fused, q, k, v}) b.HoldUntilLastOp(local);  // forward's locals
  return out;
}

// FalconDecoderLayer.forward.
int FalconLayer(GraphBuilder& b, const LayerContext& c, int x, const FalconSpec& s,
                const FalconShared& shared) {
  const bool two_norms = s.new_decoder_architecture && s.parallel_norms == 2;
  const int attn_ln = LayerNorm(b, c, two_norms ? "ln_attn" : "input_layernorm", x);
  int mlp_ln = two_norms ? LayerNorm(b, c, "ln_mlp", x) : attn_ln;
  const int attn = FalconAttention(b, c, attn_ln, s, shared);
  int residual = x;
  const bool parallel = s.new_decoder_architecture || s.parallel_attn;
  if (!parallel) {
    // dropout_add(attention_output, residual, config.attention_dropout)
    residual = b.Add1("add", {x, Dropout(b, c, attn, s.attention_dropout)});
    mlp_ln = LayerNorm(b, c, "post_attention_layernorm", residual);
  }
  int h = -1;
  {
    ScopeGuard mlp(b, "mlp");
    h = FalconLinear(b, c, "dense_h_to_4h", mlp_ln, s.ffn > 0 ? s.ffn : 4 * s.d_model, s.bias);
    {
      ScopeGuard act(b, "act");
      h = Activate(b, h, s.activation);
    }
    h = FalconLinear(b, c, "dense_4h_to_h", h, s.d_model, s.bias);
  }
  if (parallel) h = b.Add1("add_", {h, attn});  // mlp_output += attention_output
  const int out = b.Add1("add", {residual, Dropout(b, c, h, s.hidden_dropout)});
  for (int local : {x, attn_ln, mlp_ln, attn, residual}) b.HoldUntilLastOp(local);
  return out;
}

}  // namespace

Status BuildFalconModel(GraphBuilder& b, const BuildContext& ctx, const FalconSpec& s,
                        const FieldOf& field) {
  MEMEST_RETURN_IF_ERROR(CheckHeadsDivide(field, s.d_model, s.heads));
  const int64_t hd = s.d_model / s.heads;
  if (hd % 2 != 0) {
    return FieldError(field, "heads",
                      "must leave an even head_dim for rotary, got head_dim " + Str(hd));
  }
  if (s.new_decoder_architecture && s.kv_heads > 0 && s.heads % s.kv_heads != 0) {
    return FieldError(field, "kv_heads",
                      "must divide heads " + Str(s.heads) + ", got " + Str(s.kv_heads));
  }
  const LayerContext c = LayerContextOf(ctx);
  const int ids = b.Input("input_ids", {ctx.micro_batch, s.seq}, DType::kInt64, 0);
  int embed = -1;
  int h = -1;
  {
    ScopeGuard model(b, "transformer");
    const int inputs_embeds = Embedding(b, c, "word_embeddings", ids, s.vocab, s.d_model, &embed);
    FalconShared shared;
    shared.kv_cache_len = KvCacheLength(ctx, s.seq);
    {
      // FalconModel.forward computes position_embeddings (cos, sin [1, T, hd] in the hidden
      // states' dtype) from the non-persistent buffer inv_freq, and for eager attention the
      // [T, T] causal mask (an expanded view reaches the layers): tensors of the forward, which
      // it keeps until it returns. vLLM's cache (serving) is a buffer.
      ScopeGuard rotary(b, "rotary_emb");
      if (c.rotary_positions > 0) {
        RotaryBuffers(b, c, s.seq, hd, &shared.cos, &shared.sin);
      } else {
        b.Buffer("inv_freq", {hd / 2}, DType::kFloat32);
        const Attrs table = {{"shape", Ints({1, s.seq, hd})},
                             {"dtype", std::string(DTypeName(c.param_dtype))}};
        shared.cos = b.Add1("full", {}, table);
        shared.sin = b.Add1("full", {}, table);
      }
    }
    if (c.attention == AttentionImpl::kEager) {
      shared.mask = b.Add1("full", {},
                           {{"shape", Ints({1, 1, s.seq, s.seq})},
                            {"dtype", std::string(DTypeName(c.param_dtype))}});
    }
    h = RepeatBlocks(
        b, "h.", s.layers, inputs_embeds,
        [&](int64_t, int x) { return FalconLayer(b, c, x, s, shared); }, AllAlike);
    h = LayerNorm(b, c, "ln_f", h);
    // FalconModel.forward's locals, until it returns.
    for (int local : {inputs_embeds, shared.cos, shared.sin, shared.mask}) b.HoldUntilLastOp(local);
  }
  LmHeadOptions head;
  head.embed = embed;
  head.tied = s.tie_embeddings;
  head.vocab = s.vocab;
  LanguageModelHead(b, ctx, c, h, head);
  return Status::Ok();
}

}  // namespace memest
