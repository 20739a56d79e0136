// Attention layers: rotary embeddings, the eager and SDPA attention cores (declared in
// engine/models/layers.h; the transformer blocks built from them are in block_layers.cc).
#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "engine/models/layers.h"
#include "engine/models/layers_internal.h"
#include "engine/rules/sdpa_select.h"

namespace memest {

using namespace layers_internal;  // NOLINT: the helpers every layer uses

int ApplyRotary(GraphBuilder& b, int x, int cos, int sin) {
  if (!b.ok() || x < 0) return -1;
  const int64_t hd = LastDim(b, x);
  const int rank = static_cast<int>(b.shape(x).size());
  // (x * cos) + (rotate_half(x) * sin); rotate_half: cat((-x2, x1), dim=-1).
  int a = b.Add1("mul", {x, cos});
  int x1 = b.Add1("slice", {x}, {{"dim", Int(rank - 1)}, {"start", Int(0)}, {"end", Int(hd / 2)}});
  int x2 = b.Add1("slice", {x}, {{"dim", Int(rank - 1)}, {"start", Int(hd / 2)}, {"end", Int(hd)}});
  int neg = b.Add1("neg", {x2});
  int rotated = b.Add1("cat", {neg, x1}, {{"dim", Int(rank - 1)}});
  int bm = b.Add1("mul", {rotated, sin});
  return b.Add1("add", {a, bm});
}

namespace {

// q_embed = cat([rotary(q[..., :rotary_dim]), q[..., rotary_dim:]], dim=-1).
int ApplyPartialRotary(GraphBuilder& b, int x, int cos, int sin, int64_t rotary_dim) {
  if (!b.ok() || x < 0) return -1;
  const int64_t hd = LastDim(b, x);
  const int last = static_cast<int>(b.shape(x).size()) - 1;
  int rot = b.Add1("slice", {x}, {{"dim", Int(last)}, {"start", Int(0)}, {"end", Int(rotary_dim)}});
  std::vector<int> parts = {ApplyRotary(b, rot, cos, sin)};
  if (rotary_dim < hd) {
    parts.push_back(
        b.Add1("slice", {x}, {{"dim", Int(last)}, {"start", Int(rotary_dim)}, {"end", Int(hd)}}));
  }
  return b.Add1("cat", std::move(parts), {{"dim", Int(last)}});
}

}  // namespace

SdpaParams SdpaCallOf(const GraphBuilder& b, const LayerContext& c, int q, int64_t kv_heads,
                      bool causal, double dropout) {
  SdpaParams p;
  const Shape& s = b.shape(q);  // [N, H, T, hd]
  p.dtype = b.tensor(q).dtype;
  if (c.autocast != DType::kFloat32 && p.dtype == DType::kFloat32) p.dtype = c.autocast;
  p.batch = s[0];
  p.heads = s[1];
  p.kv_heads = kv_heads;
  p.q_len = p.kv_len = s[2];
  p.head_dim_qk = p.head_dim_v = s[3];
  p.is_causal = causal;
  p.dropout = c.training() ? dropout : 0.0;
  p.requires_grad = c.training();
  p.compute_capability = c.compute_capability;
  return p;
}

int SdpaCore(GraphBuilder& b, std::vector<int> inputs, SdpaBackend backend, const SdpaParams& p) {
  ModuleScope core(b, "core");
  Attrs attrs = {{"fused", Int(backend == SdpaBackend::kMath ? 0 : 1)},
                 {"is_causal", Int(p.is_causal ? 1 : 0)},
                 {"backend", std::string(SdpaBackendName(backend))}};
  if (p.dropout > 0) attrs["dropout_p"] = Float(p.dropout);
  return b.Add1("scaled_dot_product_attention", std::move(inputs), std::move(attrs));
}

void RotaryBuffers(GraphBuilder& b, const LayerContext& c, int64_t seq, int64_t head_dim, int* cos,
                   int* sin) {
  if (c.rotary_positions > 0) {
    // vLLM's RotaryEmbedding: cat(cos, sin) of the rotary_dim / 2 frequencies for every position,
    // [max_position, rotary_dim] in the model dtype (rotary_embedding.py, _compute_cos_sin_cache),
    // which its kernel reads in place.
    const int64_t rows = std::max(c.rotary_positions, seq);
    int v = b.Buffer("cos_sin_cache", {rows, head_dim}, c.param_dtype);
    v = b.Add1("slice", {v}, {{"dim", Int(0)}, {"start", Int(0)}, {"end", Int(seq)}});
    *cos = *sin = b.Add1("unsqueeze", {v}, {{"dim", Int(0)}});
    return;
  }
  // HF's LlamaRotaryEmbedding returns cos/sin [1, T, head_dim] in the model dtype; the tables
  // are small next to activations, so they stand as buffers here.
  *cos = b.Buffer("cos_cached", {1, seq, head_dim}, c.param_dtype);
  *sin = b.Buffer("sin_cached", {1, seq, head_dim}, c.param_dtype);
}

int AdditiveCausalMask(GraphBuilder& b, const LayerContext& c, int64_t seq,
                       std::string_view name) {
  return b.Buffer(std::string(name), {1, 1, seq, seq}, c.param_dtype);
}

int SoftCap(GraphBuilder& b, int x, double cap) {
  if (!b.ok() || x < 0) return -1;
  x = b.Add1("div", {x}, {{"scalar", Float(cap)}});
  x = b.Add1("tanh", {x});
  return b.Add1("mul", {x}, {{"scalar", Float(cap)}});
}

namespace {

// [N, T, heads * hd] -> view [N, T, heads, hd] -> [RMSNorm `norm` over hd] -> transpose(1, 2):
// [N, heads, T, hd].
int SplitHeads(GraphBuilder& b, const LayerContext& c, int x, int64_t heads, int64_t hd,
               const char* norm) {
  if (!b.ok() || x < 0) return -1;
  const Shape& s = b.shape(x);
  int v = b.Add1("view", {x}, {{"shape", Ints({s[0], s[1], heads, hd})}});
  if (norm != nullptr) v = RmsNorm(b, c, norm, v, /*upcast=*/true);
  return b.Add1("transpose", {v}, {{"dim0", Int(1)}, {"dim1", Int(2)}});
}

// HF repeat_kv: x[:, :, None].expand(N, kvh, n_rep, T, hd).reshape(N, kvh * n_rep, T, hd).
int RepeatKv(GraphBuilder& b, int x, int64_t n_rep) {
  if (!b.ok() || x < 0 || n_rep == 1) return x;
  const Shape s = b.shape(x);
  int u = b.Add1("unsqueeze", {x}, {{"dim", Int(2)}});
  int e = b.Add1("expand", {u}, {{"shape", Ints({s[0], s[1], n_rep, s[2], s[3]})}});
  return b.Add1("reshape", {e}, {{"shape", Ints({s[0], s[1] * n_rep, s[2], s[3]})}});
}

}  // namespace

namespace {

// The tail every attention shares: heads merged (transpose(1, 2).contiguous().view(N, T, d)),
// the output projection and the residual dropout.
int MergeAndProject(GraphBuilder& b, const LayerContext& c, int context, int64_t n, int64_t t,
                    int64_t d, const AttentionOptions& o) {
  const int64_t width = context >= 0 && b.ok() ? b.shape(context)[1] * LastDim(b, context) : d;
  int merged = b.Add1("transpose", {context}, {{"dim0", Int(1)}, {"dim1", Int(2)}});
  merged = b.Add1("contiguous", {merged});
  merged = b.Add1("view", {merged}, {{"shape", Ints({n, t, width})}});
  int out = -1;
  switch (o.projection) {
    case AttentionProjection::kFusedHfConv1D:
      out = HfConv1D(b, c, "c_proj", merged, d);
      break;
    case AttentionProjection::kFusedLinear:
      out = Linear(b, c, "out_proj", merged, d, o.out_bias.value_or(o.bias));
      break;
    case AttentionProjection::kSeparate:
    case AttentionProjection::kFusedQkv:
    case AttentionProjection::kFusedPerHead:
      out = Linear(b, c, o.names[3], merged, d, o.out_bias.value_or(o.bias));
      break;
  }
  return Dropout(b, c, out, o.resid_dropout);
}

// The core as one F.scaled_dot_product_attention call (see Attention in layers.h).
int SdpaAttention(GraphBuilder& b, const LayerContext& c, int q, int k, int v,
                  const AttentionDims& dims, const AttentionOptions& o) {
  if (!b.ok() || q < 0 || k < 0 || v < 0) return -1;
  // GPT-2's module registers its causal-mask buffer whichever attention runs.
  if (o.causal && o.additive_mask < 0 && o.projection == AttentionProjection::kFusedHfConv1D) {
    const int64_t positions = o.mask_positions > 0 ? o.mask_positions : dims.t;
    b.Buffer("bias", {1, 1, positions, positions}, DType::kBool);
  }
  SdpaParams p = SdpaCallOf(b, c, q, dims.kv_heads, o.causal && o.sdpa_mask < 0, o.attn_dropout);
  p.head_dim_v = LastDim(b, v);
  p.has_mask = o.sdpa_mask >= 0;
  StatusOr<SdpaBackend> backend = SelectSdpaBackend(p, c.attention);
  if (!backend.ok()) {
    b.Fail(backend.status());
    return -1;
  }
  if (*backend == SdpaBackend::kMath) {  // math repeats k and v (repeat_interleave)
    k = RepeatKv(b, k, dims.heads / dims.kv_heads);
    v = RepeatKv(b, v, dims.heads / dims.kv_heads);
  }
  std::vector<int> inputs = {q, k, v};
  if (p.has_mask) inputs.push_back(o.sdpa_mask);
  int context = SdpaCore(b, std::move(inputs), *backend, p);
  if (dims.keep_dim > 0) {  // attn_output[:, :, :, :v_head_dim]
    context = b.Add1("slice", {context}, {{"dim", Int(3)}, {"start", Int(0)}, {"end", Int(dims.keep_dim)}});
  }
  return MergeAndProject(b, c, context, dims.n, dims.t, dims.d, o);
}

}  // namespace

void AttentionCache(GraphBuilder& b, const LayerContext& c, int k, int v, int64_t n,
                    int64_t kv_heads, int64_t room, int64_t head_dim, int64_t v_head_dim) {
  if (c.use_cache) {
    b.MarkCache(k);
    b.MarkCache(v);
  }
  if (!c.training() && (room > 0 || c.use_cache)) {
    b.KvCache("k_cache", {n, kv_heads, room, head_dim}, c.param_dtype);
    b.KvCache("v_cache", {n, kv_heads, room, v_head_dim > 0 ? v_head_dim : head_dim},
              c.param_dtype);
  }
}

int Attention(GraphBuilder& b, const LayerContext& c, std::string_view name, int x,
              const AttentionOptions& o, int* weights_out) {
  if (weights_out != nullptr) *weights_out = -1;
  if (o.mla) return MlaAttention(b, c, name, x, o, weights_out);
  if (!ExpectRank(b, x, 3, "attention")) return -1;
  const Shape in_shape = b.shape(x);
  const int64_t n = in_shape[0], t = in_shape[1], d = in_shape[2];
  const int64_t heads = o.heads;
  const int64_t kv_heads = o.kv_heads > 0 ? o.kv_heads : heads;
  if (heads <= 0 || (o.head_dim <= 0 && d % heads != 0) || heads % kv_heads != 0) {
    b.Fail(InvalidArgument("attention: d_model " + std::to_string(d) + " must divide into " +
                           std::to_string(heads) + " heads, and heads into " +
                           std::to_string(kv_heads) + " kv heads"));
    return -1;
  }
  const int64_t hd = o.head_dim > 0 ? o.head_dim : d / heads;
  ModuleScope scope(b, name);

  int q = -1, k = -1, v = -1;
  if (o.projection == AttentionProjection::kSeparate) {
    q = Linear(b, c, o.names[0], x, heads * hd, o.bias);
    k = Linear(b, c, o.names[1], x, kv_heads * hd, o.bias);
    v = Linear(b, c, o.names[2], x, kv_heads * hd, o.bias);
  } else if (o.projection != AttentionProjection::kFusedPerHead) {
    int qkv = -1;
    if (o.projection == AttentionProjection::kFusedHfConv1D) {
      qkv = HfConv1D(b, c, "c_attn", x, 3 * d);
    } else if (o.projection == AttentionProjection::kFusedLinear) {
      // nn.MultiheadAttention: in_proj_weight [3d, d] and in_proj_bias on the module itself.
      std::vector<int> inputs = {x, b.Parameter("in_proj_weight", {3 * d, d}, c.param_dtype)};
      if (o.bias) inputs.push_back(b.Parameter("in_proj_bias", {3 * d}, c.param_dtype));
      qkv = b.Add1("linear", std::move(inputs));
    }
    std::vector<int64_t> sizes = {d, d, d};
    if (o.projection == AttentionProjection::kFusedQkv) {
      sizes = {heads * hd, kv_heads * hd, kv_heads * hd};
      qkv = Linear(b, c, "qkv_proj", x, sizes[0] + sizes[1] + sizes[2], o.bias);
    }
    std::vector<int> parts = b.Add("split", {qkv}, {{"dim", Int(2)}, {"sizes", Ints(sizes)}});
    if (parts.size() != 3) return -1;
    q = parts[0];
    k = parts[1];
    v = parts[2];
  }
  if (o.projection == AttentionProjection::kFusedPerHead) {
    // qkv.view(N, T, heads, 3 * hd).transpose(1, 2).chunk(3, dim=-1): already [N, H, T, hd].
    int qkv = Linear(b, c, "query_key_value", x, 3 * heads * hd, o.bias);
    qkv = b.Add1("view", {qkv}, {{"shape", Ints({n, t, heads, 3 * hd})}});
    qkv = b.Add1("transpose", {qkv}, {{"dim0", Int(1)}, {"dim1", Int(2)}});
    std::vector<int> parts =
        b.Add("split", {qkv}, {{"dim", Int(3)}, {"sizes", Ints({hd, hd, hd})}});
    if (parts.size() != 3) return -1;
    q = parts[0];
    k = parts[1];
    v = parts[2];
  } else {
    const bool norm_first = o.qk_norm && !o.gemma_qk_norm;
    q = SplitHeads(b, c, q, heads, hd, norm_first ? "q_norm" : nullptr);
    k = SplitHeads(b, c, k, kv_heads, hd, norm_first ? "k_norm" : nullptr);
    v = SplitHeads(b, c, v, kv_heads, hd, nullptr);
    if (o.qk_norm && o.gemma_qk_norm) {  // Gemma3Attention: self.q_norm(query_states), ...
      q = GemmaRmsNorm(b, c, "q_norm", q);
      k = GemmaRmsNorm(b, c, "k_norm", k);
    }
  }
  if (o.rotary_cos >= 0 && o.rotary_sin >= 0) {
    // apply_rotary_pos_emb: cos = cos.unsqueeze(1); sin = sin.unsqueeze(1)
    int cos = b.Add1("unsqueeze", {o.rotary_cos}, {{"dim", Int(1)}});
    int sin = b.Add1("unsqueeze", {o.rotary_sin}, {{"dim", Int(1)}});
    if (o.rotary_dim > 0) {
      q = ApplyPartialRotary(b, q, cos, sin, o.rotary_dim);
      k = ApplyPartialRotary(b, k, cos, sin, o.rotary_dim);
    } else {
      q = ApplyRotary(b, q, cos, sin);
      k = ApplyRotary(b, k, cos, sin);
    }
  }
  // DynamicCache.update(key_states, value_states): k after the rotary.
  AttentionCache(b, c, k, v, n, kv_heads, o.kv_cache_len, hd);
  return AttendAndProject(b, c, x, q, k, v, {n, t, d, heads, kv_heads, hd}, o, weights_out);
}

namespace layers_internal {

int AttendAndProject(GraphBuilder& b, const LayerContext& c, int x, int q, int k, int v,
                     const AttentionDims& dims, const AttentionOptions& o, int* weights_out) {
  const int64_t n = dims.n, t = dims.t, d = dims.d, heads = dims.heads;
  const int64_t kv_heads = dims.kv_heads, hd = dims.head_dim;
  if (c.attention != AttentionImpl::kEager) {
    const int out = SdpaAttention(b, c, q, k, v, dims, o);
    if (o.hold_locals) {
      for (int local : {x, q, k, v}) b.HoldUntilLastOp(local);
    }
    return out;
  }
  k = RepeatKv(b, k, heads / kv_heads);
  v = RepeatKv(b, v, heads / kv_heads);
  int mask = -1;
  if (o.causal && o.additive_mask < 0) {
    const int64_t positions = o.mask_positions > 0 ? o.mask_positions : t;
    mask = b.Buffer("bias", {1, 1, positions, positions}, DType::kBool);
  }

  int context = -1;
  int weights = -1;  // the probabilities, which HF's eager attention returns with its output
  int held_scores = -1;  // o.hold_scores: the scores kept by the attention's local
  {
    ModuleScope core(b, "core");
    if (o.scale == AttentionScale::kScaleQK) {
      const double s = std::pow(static_cast<double>(hd), -0.25);
      q = b.Add1("mul", {q}, {{"scalar", Float(s)}});
      k = b.Add1("mul", {k}, {{"scalar", Float(s)}});
    }
    int kt = b.Add1("transpose", {k}, {{"dim0", Int(-2)}, {"dim1", Int(-1)}});
    int scores = b.Add1("matmul", {q, kt});
    if (o.scale == AttentionScale::kDivideScores) {
      scores = b.Add1("div", {scores}, {{"scalar", Float(std::sqrt(static_cast<double>(hd)))}});
    } else if (o.scale == AttentionScale::kMultiplyScores) {
      const double s = o.scaling > 0 ? o.scaling : 1.0 / std::sqrt(double(hd));
      scores = b.Add1("mul", {scores}, {{"scalar", Float(s)}});
    }
    if (o.softcap > 0) scores = SoftCap(b, scores, o.softcap);
    if (o.additive_mask >= 0) {  // HF's 4-D causal mask, or an encoder's extended padding mask
      scores = b.Add1("add", {scores, o.additive_mask});
    } else if (o.causal) {
      // self.bias[:, :, :T, :T] (the positions a query must not see), filled with finfo.min.
      int m = b.Add1("slice", {mask}, {{"dim", Int(2)}, {"start", Int(0)}, {"end", Int(t)}});
      m = b.Add1("slice", {m}, {{"dim", Int(3)}, {"start", Int(0)}, {"end", Int(t)}});
      scores = b.Add1("masked_fill", {scores, m},
                      {{"value", Float(std::numeric_limits<float>::lowest())}});
    }
    int probs = -1;
    if (o.softmax_fp32) {
      // softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
      const DType q_dtype = q >= 0 ? b.tensor(q).dtype : DType::kFloat32;
      probs = SoftmaxFloat32(b, scores, -1);
      probs = b.Add1("to", {probs}, {{"dtype", std::string(DTypeName(q_dtype))}});
    } else {
      probs = b.Add1("softmax", {scores}, {{"dim", Int(-1)}});
      if (o.probs_to_value_dtype && probs >= 0 && v >= 0 &&
          b.tensor(probs).dtype != b.tensor(v).dtype) {
        probs = b.Add1("to", {probs}, {{"dtype", std::string(DTypeName(b.tensor(v).dtype))}});
      }
    }
    if (o.hold_scores) held_scores = scores;
    probs = Dropout(b, c, probs, o.attn_dropout);
    weights = probs;
    context = b.Add1("matmul", {probs, v});
  }
  const int out = MergeAndProject(b, c, context, n, t, d, o);
  if (o.hold_locals) {
    for (int local : {x, q, k, v, held_scores, o.hold_scores ? weights : -1}) {
      b.HoldUntilLastOp(local);
    }
  }
  if (weights_out != nullptr) *weights_out = weights;
  return out;
}

}  // namespace layers_internal

}  // namespace memest
