// BERT and RoBERTa with their masked-LM heads (engine/models/encoders.h), as transformers'
// modeling_bert.py and modeling_roberta.py run them.
#include <string>
#include <vector>

#include "engine/models/encoders.h"
#include "engine/models/repeat_blocks.h"

namespace memest {
namespace {

std::string Str(int64_t v) { return std::to_string(v); }

// RobertaEmbeddings.create_position_ids_from_input_ids: mask = ids.ne(padding_idx).int();
// (cumsum(mask, 1).type_as(mask) + 0) * mask; .long() + padding_idx. Integers: no gradient.
int RobertaPositions(GraphBuilder& b, int ids, int64_t padding_idx) {
  const auto dtype = [](const char* d) { return Attrs{{"dtype", std::string(d)}}; };
  const int mask = b.Add1("to", {b.Add1("ne", {ids}, {{"scalar", static_cast<double>(padding_idx)}})},
                          dtype("int32"));
  int incremental = b.Add1("to", {b.Add1("cumsum", {mask}, {{"dim", AttrInt(1)}})}, dtype("int32"));
  incremental = b.Add1("add", {incremental}, {{"scalar", 0.0}});  // + past_key_values_length
  incremental = b.Add1("mul", {incremental, mask});
  return b.Add1("add", {b.Add1("to", {incremental}, dtype("int64"))},
                {{"scalar", static_cast<double>(padding_idx)}});
}

}  // namespace

Status BuildBertModel(GraphBuilder& b, const BuildContext& ctx, const BertSpec& s,
                      const FieldOf& field) {
  // RoBERTa's positions start after padding_idx: the table holds padding_idx + 1 more rows.
  const int64_t offset = s.roberta ? s.padding_idx + 1 : 0;
  if (s.roberta && (s.padding_idx < 0 || s.padding_idx >= s.vocab)) {
    return InvalidArgument(field("padding_idx") + ": must be a token id below the vocabulary's " +
                           Str(s.vocab) + ", got " + Str(s.padding_idx));
  }
  if (s.roberta && offset >= s.positions) {
    return InvalidArgument(field("padding_idx") + ": RoBERTa numbers its positions from " +
                           Str(offset) + " (pad_token_id + 1), past its " + Str(s.positions) +
                           " position embeddings");
  }
  if (s.seq > s.positions - offset) {
    return InvalidArgument(field("seq") + ": must be at most " + Str(s.positions - offset) + " (" +
                           Str(s.positions) + " position embeddings" +
                           (s.roberta ? ", numbered from padding_idx + 1" : "") + "), got " +
                           Str(s.seq));
  }
  if (s.d_model % s.heads != 0) {
    return InvalidArgument(field("heads") + ": must divide the hidden size " + Str(s.d_model) +
                           ", got " + Str(s.heads));
  }
  const LayerContext c = LayerContextOf(ctx);
  const int64_t n = ctx.micro_batch;
  const int ids = b.Input("input_ids", {n, s.seq}, DType::kInt64, 0);
  // The tokenizer's attention_mask, which every fine-tuning loop passes (all ones: the model
  // attends everywhere; its 4-D form is not built, as transformers skips it when every token
  // is attended under SDPA).
  const int attention_mask = b.Input("attention_mask", {n, s.seq}, DType::kInt64, 0);
  int word = -1;
  int h = -1;
  {
    ScopeGuard model(b, s.roberta ? "roberta" : "bert");
    {
      ScopeGuard emb(b, "embeddings");
      // RobertaEmbeddings makes its position ids first (its position_ids buffer unused); BERT
      // slices the buffer.
      const int buffer = b.Buffer("position_ids", {1, s.positions}, DType::kInt64);
      const int position_ids = s.roberta ? RobertaPositions(b, ids, s.padding_idx) : buffer;
      const int token_type_ids = b.Buffer("token_type_ids", {1, s.positions}, DType::kInt64);
      h = Embedding(b, c, "word_embeddings", ids, s.vocab, s.d_model, &word);
      // token_type_ids = self.token_type_ids[:, :T].expand(N, T)
      int tt = b.Add1("slice", {token_type_ids},
                      {{"dim", AttrInt(1)}, {"start", AttrInt(0)}, {"end", AttrInt(s.seq)}});
      tt = b.Add1("expand", {tt}, {{"shape", AttrInts({n, s.seq})}});
      h = b.Add1("add", {h, Embedding(b, c, "token_type_embeddings", tt, s.type_vocab, s.d_model)});
      const int pos = s.roberta ? position_ids
                                : b.Add1("slice", {position_ids}, {{"dim", AttrInt(1)},
                                                                   {"start", AttrInt(0)},
                                                                   {"end", AttrInt(s.seq)}});
      const int pe = Embedding(b, c, "position_embeddings", pos, s.positions, s.d_model);
      h = b.Add1("add_", {h, pe});  // embeddings += position_embeddings
      h = LayerNorm(b, c, "LayerNorm", h);
      h = Dropout(b, c, h, s.hidden_dropout);
    }
    const int embedding_output = h;  // BertModel.forward's local, until it returns
    AttentionOptions a;
    a.heads = s.heads;
    a.projection = AttentionProjection::kSeparate;
    a.names = {"self.query", "self.key", "self.value", "output.dense"};
    a.scale = AttentionScale::kDivideScores;
    a.attn_dropout = s.attn_dropout;
    a.resid_dropout = s.hidden_dropout;
    // Eager BertSelfAttention keeps q, k, v, the scores and the probabilities as locals until
    // it returns, and adds BertModel's extended mask to its scores: get_extended_attention_mask,
    // (1.0 - attention_mask[:, None, None, :].to(dtype)) * finfo(dtype).min, made once and read
    // by every layer. (SDPA takes none for an all-ones mask.)
    a.hold_locals = true;
    a.hold_scores = true;
    if (c.attention == AttentionImpl::kEager) {
      int m = b.Add1("unsqueeze", {attention_mask}, {{"dim", AttrInt(1)}});
      m = b.Add1("unsqueeze", {m}, {{"dim", AttrInt(2)}});
      m = b.Add1("to", {m}, {{"dtype", std::string(DTypeName(c.param_dtype))}});
      m = b.Add1("add", {b.Add1("mul", {m}, {{"scalar", -1.0}})}, {{"scalar", 1.0}});  // 1.0 - m
      a.additive_mask = b.Add1("mul", {m}, {{"scalar", -3.4028234663852886e38}});
    }
    auto layer = [&](int64_t, int h) {
      // Post-LN: LayerNorm(x + dropout(dense(attention(x)))), then the same around the FFN.
      const int attn = Attention(b, c, "attention", h, a);
      h = LayerNorm(b, c, "attention.output.LayerNorm", b.Add1("add", {attn, h}));
      int f = Linear(b, c, "intermediate.dense", h, s.ffn);
      {
        ScopeGuard act(b, "intermediate.intermediate_act_fn");
        f = Activate(b, f, s.activation);
      }
      f = Linear(b, c, "output.dense", f, s.d_model);
      f = Dropout(b, c, f, s.hidden_dropout);
      return LayerNorm(b, c, "output.LayerNorm", b.Add1("add", {f, h}));
    };
    h = RepeatBlocks(b, "encoder.layer.", s.layers, h, layer, AllAlike);
    b.HoldUntilLastOp(embedding_output);
  }
  // BERT's cls.predictions (transform: dense, act, LayerNorm; decoder) or RoBERTa's lm_head
  // (dense, gelu, layer_norm; decoder), the decoder tied to the word embeddings with its own bias.
  // BertForMaskedLM.forward holds sequence_output (and the encoder's outputs) until the head
  // has run.
  const int sequence_output = h;
  int logits = -1;
  {
    ScopeGuard head(b, s.roberta ? "lm_head" : "cls.predictions");
    h = Linear(b, c, s.roberta ? "dense" : "transform.dense", h, s.d_model);
    {
      ScopeGuard act(b, s.roberta ? "gelu" : "transform.transform_act_fn");
      h = Activate(b, h, s.roberta ? Activation::kGelu : s.activation);
    }
    h = LayerNorm(b, c, s.roberta ? "layer_norm" : "transform.LayerNorm", h);
    const int bias = b.Parameter("bias", {s.vocab}, c.param_dtype);
    ScopeGuard decoder(b, "decoder");
    const int weight = s.tie_embeddings ? word : b.Parameter("weight", {s.vocab, s.d_model}, c.param_dtype);
    logits = b.Add1("linear", {h, weight, bias});
  }
  b.HoldUntilLastOp(sequence_output);
  if (ctx.mode == Mode::kTraining) CrossEntropyLoss(b, logits, /*upcast=*/false);
  return b.status();
}

}  // namespace memest
