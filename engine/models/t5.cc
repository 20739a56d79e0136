// T5ForConditionalGeneration (engine/models/t5.h), op by op as transformers 4.47.1's
// modeling_t5.py runs it: T5LayerNorm, T5Attention, T5LayerFF, T5Block, T5Stack.
#include "engine/models/t5.h"

#include <cmath>
#include <string>
#include <vector>

#include "engine/models/layers_internal.h"

namespace memest {
namespace {

using namespace layers_internal;  // NOLINT

std::string Str(int64_t v) { return std::to_string(v); }
Attrs To(DType d) { return {{"dtype", std::string(DTypeName(d))}}; }

// T5LayerNorm: variance = x.to(float32).pow(2).mean(-1, keepdim=True); x * rsqrt(variance +
// eps) (x's dtype times float32: float32), cast to a half weight's dtype; weight * that.
int T5Norm(GraphBuilder& b, const LayerContext& c, std::string_view name, int x, double eps) {
  if (!b.ok() || x < 0) return -1;
  const int64_t d = LastDim(b, x);
  ModuleScope scope(b, name);
  const int weight = b.Parameter("weight", {d}, c.param_dtype);
  const int xf = b.tensor(x).dtype == DType::kFloat32 ? x : b.Add1("to", {x}, To(DType::kFloat32));
  const int variance = b.Add1("mean", {b.Add1("pow", {xf}, {{"exponent", Float(2.0)}})},
                              {{"dim", Ints({-1})}, {"keepdim", Int(1)}});
  int h =
      b.Add1("mul", {x, b.Add1("rsqrt", {b.Add1("add", {variance}, {{"scalar", Float(eps)}})})});
  if (c.param_dtype == DType::kBFloat16 || c.param_dtype == DType::kFloat16) {
    h = b.Add1("to", {h}, To(c.param_dtype));
  }
  h = b.Add1("mul", {weight, h});
  b.HoldUntilLastOp(variance);  // forward's local
  return h;
}

// What a stack's attentions share: the mask (-1: none) and the position bias the first layer
// makes (-1 until then), read by every layer.
struct Bias {
  int mask = -1;
  int position = -1;
};

// [N, L, heads * d_kv] -> [N, heads, L, d_kv]
int Heads(GraphBuilder& b, int x, int64_t heads, int64_t d_kv) {
  const Shape& s = b.shape(x);
  const int v = b.Add1("view", {x}, {{"shape", Ints({s[0], s[1], heads, d_kv})}});
  return b.Add1("transpose", {v}, {{"dim0", Int(1)}, {"dim1", Int(2)}});
}

// T5Attention.forward over x (its queries) and kv (the encoder's output for the
// cross-attention; -1: x). `relative`: this layer has relative_attention_bias (the first of its
// stack's self-attentions) and makes the position bias; a layer without it whose stack has none
// yet makes zeros (the cross-attention's). Scores are not scaled; the bias is added in place.
int T5Attention(GraphBuilder& b, const LayerContext& c, std::string_view name, int x, int kv,
                const T5Spec& s, bool relative, Bias* bias) {
  if (!b.ok() || x < 0) return -1;
  const Shape xs = b.shape(x);
  const int src = kv >= 0 ? kv : x;
  const int64_t n = xs[0], t = xs[1], len = b.shape(src)[1], inner = s.heads * s.d_kv;
  ModuleScope scope(b, name);
  const int q = Heads(b, Linear(b, c, "q", x, inner, /*bias=*/false), s.heads, s.d_kv);
  const int k = Heads(b, Linear(b, c, "k", src, inner, /*bias=*/false), s.heads, s.d_kv);
  const int v = Heads(b, Linear(b, c, "v", src, inner, /*bias=*/false), s.heads, s.d_kv);
  if (c.use_cache) {  // the decoder's self- and cross-attention caches: curr_past_key_value.update
    b.MarkCache(k);
    b.MarkCache(v);
  }
  int scores =
      b.Add1("matmul", {q, b.Add1("transpose", {k}, {{"dim0", Int(3)}, {"dim1", Int(2)}})});
  if (!b.ok()) return -1;
  const DType dtype = b.tensor(scores).dtype;
  if (bias->position < 0) {
    int position = -1;
    if (relative) {
      // compute_bias: the relative positions' buckets [T, S] (integers, made without autograd),
      // looked up [T, S, heads], permuted and unsqueezed to [1, heads, T, S].
      const int buckets =
          b.Add1("full", {}, {{"shape", Ints({t, len})}, {"dtype", std::string("int64")}});
      position = Embedding(b, c, "relative_attention_bias", buckets, s.buckets, s.heads);
      position = b.Add1("permute", {position}, {{"dims", Ints({2, 0, 1})}});
      position = b.Add1("unsqueeze", {position}, {{"dim", Int(0)}});
    } else {
      position =
          b.Add1("full", {},
                 {{"shape", Ints({1, s.heads, t, len})}, {"dtype", std::string(DTypeName(dtype))}});
    }
    if (bias->mask >= 0) position = b.Add1("add", {position, bias->mask});
    bias->position = position;
  }
  scores = b.Add1("add_", {scores, bias->position});
  int probs = -1;
  if (dtype == DType::kFloat32) {
    probs = b.Add1("softmax", {scores}, {{"dim", Int(-1)}});
  } else {  // softmax(scores.float(), dim=-1).type_as(scores)
    probs = b.Add1("softmax", {b.Add1("to", {scores}, To(DType::kFloat32))}, {{"dim", Int(-1)}});
    probs = b.Add1("to", {probs}, To(dtype));
  }
  probs = Dropout(b, c, probs, s.dropout);
  int out = b.Add1("matmul", {probs, v});
  out = b.Add1("contiguous", {b.Add1("transpose", {out}, {{"dim0", Int(1)}, {"dim1", Int(2)}})});
  out = b.Add1("view", {out}, {{"shape", Ints({n, t, inner})}});
  out = Linear(b, c, "o", out, s.d_model, /*bias=*/false);
  for (int local : {x, q, k, v, scores, probs}) b.HoldUntilLastOp(local);  // forward's locals
  return out;
}

// T5LayerSelfAttention / T5LayerCrossAttention: x + dropout(attention(layer_norm(x))).
int AttentionLayer(GraphBuilder& b, const LayerContext& c, const std::string& name,
                   const char* attention, int x, int kv, const T5Spec& s, bool relative,
                   Bias* bias) {
  ModuleScope scope(b, name);
  const int normed = T5Norm(b, c, "layer_norm", x, s.eps);
  const int a = T5Attention(b, c, attention, normed, kv, s, relative, bias);
  const int out = b.Add1("add", {x, Dropout(b, c, a, s.dropout)});
  b.HoldUntilLastOp(normed);
  return out;
}

// T5LayerFF: x + dropout(DenseReluDense(layer_norm(x))); the hidden state cast to wo's dtype
// when it differs (autocast's half products against float32 weights; a float16 model's float32
// wo).
int FeedForwardLayer(GraphBuilder& b, const LayerContext& c, const std::string& name, int x,
                     const T5Spec& s) {
  ModuleScope scope(b, name);
  const int normed = T5Norm(b, c, "layer_norm", x, s.eps);
  int h = -1;
  {
    ModuleScope dense(b, "DenseReluDense");
    if (s.gated) {  // T5DenseGatedActDense: act(wi_0(x)) * wi_1(x)
      int gate = Linear(b, c, "wi_0", normed, s.d_ff, /*bias=*/false);
      {
        ModuleScope act(b, "act");
        gate = Activate(b, gate, s.activation);
      }
      h = b.Add1("mul", {gate, Linear(b, c, "wi_1", normed, s.d_ff, /*bias=*/false)});
    } else {
      h = Linear(b, c, "wi", normed, s.d_ff, /*bias=*/false);
      ModuleScope act(b, "act");
      h = Activate(b, h, s.activation);
    }
    h = Dropout(b, c, h, s.dropout);
    // T5PreTrainedModel._keep_in_fp32_modules = ["wo"]: from_pretrained in float16 keeps wo
    // in float32 (its output then promotes the residual stream to float32).
    LayerContext wo = c;
    if (c.param_dtype == DType::kFloat16) wo.param_dtype = DType::kFloat32;
    if (b.ok() && b.tensor(h).dtype != wo.param_dtype) h = b.Add1("to", {h}, To(wo.param_dtype));
    h = Linear(b, wo, "wo", h, s.d_model, /*bias=*/false);
  }
  const int out = b.Add1("add", {x, Dropout(b, c, h, s.dropout)});
  b.HoldUntilLastOp(normed);
  return out;
}

// T5Block's float16 guard after each layer: where(isinf(x).any(), max - 1000, max), clamp.
int Clamp(GraphBuilder& b, int x) {
  if (!b.ok() || b.tensor(x).dtype != DType::kFloat16) return x;
  b.Add1("any", {b.Add1("eq", {x}, {{"scalar", Float(65504.0)}})});  // isinf's bool tensor
  return b.Add1("clamp", {x}, {{"min", Float(-64504.0)}, {"max", Float(64504.0)}});
}

// T5Stack: the shared embedding of ids, dropout, the blocks, the final norm and dropout. With
// `encoder_out` (>= 0) a decoder: causal self-attention and cross-attention over it.
int Stack(GraphBuilder& b, const LayerContext& c, const T5Spec& s, int ids, int shared,
          int encoder_out) {
  const bool decoder = encoder_out >= 0;
  const int64_t n = b.shape(ids)[0], t = b.shape(ids)[1];
  const DType dtype = c.param_dtype;
  ModuleScope scope(b, decoder ? "decoder" : "encoder");
  const int flat_ids = b.Add1("view", {ids}, {{"shape", Ints({-1, t})}});
  int embeds = -1;
  {
    ModuleScope embed(b, "embed_tokens");
    embeds = b.Add1("embedding", {shared, flat_ids});
  }
  // The attention masks of all-ones attention_masks: the encoder's (1 - mask[:, None, None, :])
  // * finfo.min [N, 1, 1, T]; the decoder's causal one [N, 1, T, T] and the encoder's again for
  // the cross-attention (invert_attention_mask); made without autograd, held by the stack.
  // forward's locals: cache_position (arange(T)), the all-ones attention_mask [N, T] (float32)
  // and, in the decoder, encoder_attention_mask [N, S] (int64), held until the stack returns.
  const auto full = [&](Shape shape, DType d) {
    return b.Add1("full", {}, {{"shape", Ints(shape)}, {"dtype", std::string(DTypeName(d))}});
  };
  std::vector<int> locals = {full({t}, DType::kInt64), full({n, t}, DType::kFloat32)};
  Bias self, cross;
  self.mask = full({n, 1, decoder ? t : 1, t}, b.tensor(embeds).dtype);
  if (decoder) {
    const int64_t len = b.shape(encoder_out)[1];
    locals.push_back(full({n, len}, DType::kInt64));
    cross.mask = full({n, 1, 1, len}, dtype);
  }
  int h = Dropout(b, c, embeds, s.dropout);
  const int64_t layers = decoder ? s.decoder_layers : s.layers;
  for (int64_t i = 0; i < layers && b.ok(); ++i) {
    ModuleScope block(b, "block." + Str(i));
    b.MarkBlock();
    const int in = h;
    h = Clamp(b, AttentionLayer(b, c, "layer.0", "SelfAttention", h, -1, s, i == 0, &self));
    if (decoder) {
      h = Clamp(
          b, AttentionLayer(b, c, "layer.1", "EncDecAttention", h, encoder_out, s, false, &cross));
    }
    h = Clamp(b, FeedForwardLayer(b, c, decoder ? "layer.2" : "layer.1", h, s));
    b.HoldUntilLastOp(in);  // the stack's loop variable until the block returns
  }
  h = T5Norm(b, c, "final_layer_norm", h, s.eps);
  h = Dropout(b, c, h, s.dropout);
  for (int local : {flat_ids, embeds, self.mask, self.position, cross.mask, cross.position}) {
    locals.push_back(local);
  }
  for (int local : locals) {
    if (local >= 0) b.HoldUntilLastOp(local);
  }
  return h;
}

}  // namespace

Status BuildT5Model(GraphBuilder& b, const BuildContext& ctx, const T5Spec& s,
                    const FieldOf& field) {
  if (s.buckets < 2) {
    return InvalidArgument(field("buckets") +
                           ": must be at least 2 (half of them for each "
                           "direction in the encoder), got " +
                           Str(s.buckets));
  }
  if (ctx.mode == Mode::kInference && ctx.generate_tokens > 0) {
    return InvalidArgument("config.generate_tokens: T5's generation is not modelled (the decoder "
                           "reads seq decoder_input_ids in one forward); leave it 0");
  }
  const LayerContext c = LayerContextOf(ctx);
  LayerContext encoder = c;  // T5Model.forward runs the encoder with use_cache=False
  encoder.use_cache = false;
  const int64_t n = ctx.micro_batch;
  const int ids = b.Input("input_ids", {n, s.seq}, DType::kInt64, 0);
  const int decoder_ids = b.Input("decoder_input_ids", {n, s.seq}, DType::kInt64, 0);
  const int shared = b.Parameter("shared.weight", {s.vocab, s.d_model}, c.param_dtype);
  const int encoder_out = Stack(b, encoder, s, ids, shared, -1);
  const int sequence_output = Stack(b, c, s, decoder_ids, shared, encoder_out);
  int h = sequence_output;
  // Rescale output before projecting on vocab (mesh TensorFlow's tied head).
  if (s.tie_embeddings)
    h = b.Add1("mul", {h}, {{"scalar", Float(1.0 / std::sqrt(double(s.d_model)))}});
  int logits = -1;
  {
    ModuleScope head(b, "lm_head");
    const int weight =
        s.tie_embeddings ? shared : b.Parameter("weight", {s.vocab, s.d_model}, c.param_dtype);
    logits = b.Add1("linear", {h, weight});
  }
  for (int local : {encoder_out, sequence_output, h}) b.HoldUntilLastOp(local);
  if (ctx.mode == Mode::kTraining) {
    CrossEntropyLoss(b, logits, /*upcast=*/false);
    // Seq2SeqLMOutput: the logits and the encoder's last hidden state (and the cache).
    b.MarkOutput(logits);
    b.MarkOutput(encoder_out);
  }
  return b.status();
}

}  // namespace memest
