// BERT, RoBERTa, ViT and T5 configs into their specs (engine/models/hf_encoders.h), with the
// defaults of transformers' BertConfig, RobertaConfig, ViTConfig and T5Config
// (configuration_bert.py, configuration_roberta.py, configuration_vit.py, configuration_t5.py).
#include "engine/models/hf_encoders.h"

#include <cmath>
#include <string>

#include "engine/ir/text.h"

namespace memest::hf {

StatusOr<BertSpec> ReadBert(const Fields& f, bool roberta, int64_t seq) {
  BertSpec s;
  s.seq = seq;
  s.roberta = roberta;
  MEMEST_ASSIGN_OR_RETURN(s.d_model, f.Size("hidden_size", 768));
  MEMEST_ASSIGN_OR_RETURN(s.layers, f.Size("num_hidden_layers", 12));
  MEMEST_ASSIGN_OR_RETURN(s.heads, f.Size("num_attention_heads", 12));
  MEMEST_ASSIGN_OR_RETURN(s.ffn, f.Size("intermediate_size", 3072));
  MEMEST_ASSIGN_OR_RETURN(s.vocab, f.Size("vocab_size", 30522));
  MEMEST_ASSIGN_OR_RETURN(s.positions, f.Size("max_position_embeddings", 512));
  MEMEST_ASSIGN_OR_RETURN(s.type_vocab, f.Size("type_vocab_size", 2));
  MEMEST_ASSIGN_OR_RETURN(s.activation, ActivationOf(f, "hidden_act", "gelu"));
  MEMEST_ASSIGN_OR_RETURN(s.hidden_dropout, f.Probability("hidden_dropout_prob", 0.1));
  MEMEST_ASSIGN_OR_RETURN(s.attn_dropout, f.Probability("attention_probs_dropout_prob", 0.1));
  MEMEST_ASSIGN_OR_RETURN(s.tie_embeddings, f.Flag("tie_word_embeddings", true));
  // RobertaConfig's pad_token_id is 1; RobertaEmbeddings numbers positions after it.
  if (const JsonValue* pad = f.Get("pad_token_id"); roberta && pad != nullptr) {
    if (pad->kind != Kind::kNumber) return WrongKind("pad_token_id", "a token id", *pad);
    if (!(pad->number >= 0 && pad->number < static_cast<double>(kMaxSize)) ||
        pad->number != std::floor(pad->number)) {
      return InvalidArgument(Field("pad_token_id") + ": must be a token id, an integer from 0 "
                             "below " + std::to_string(kMaxSize));
    }
    s.padding_idx = static_cast<int64_t>(pad->number);
  }
  MEMEST_ASSIGN_OR_RETURN(std::string positions, f.Text("position_embedding_type", "absolute"));
  if (positions != "absolute") {
    return InvalidArgument(Field("position_embedding_type") + ": " + Quote(positions) +
                           " is not modelled (the relative position scores, distance_embedding "
                           "and its einsums); absolute builds");
  }
  MEMEST_RETURN_IF_ERROR(RefuseIfSet(f, "is_decoder", "a BERT decoder (causal mask, cache)"));
  MEMEST_RETURN_IF_ERROR(RefuseIfSet(f, "add_cross_attention", "the cross-attention layers"));
  // PretrainedConfig's chunk_size_feed_forward: 0 (what to_dict() writes) runs the FFN whole.
  if (const JsonValue* chunk = f.Get("chunk_size_feed_forward");
      chunk != nullptr && !(chunk->kind == Kind::kNumber && chunk->number == 0)) {
    return InvalidArgument(Field("chunk_size_feed_forward") +
                           ": not modelled (apply_chunking_to_forward's chunked FFN); 0 builds");
  }
  return s;
}

StatusOr<VitSpec> ReadVit(const Fields& f) {
  VitSpec s;
  MEMEST_ASSIGN_OR_RETURN(s.d_model, f.Size("hidden_size", 768));
  MEMEST_ASSIGN_OR_RETURN(s.layers, f.Size("num_hidden_layers", 12));
  MEMEST_ASSIGN_OR_RETURN(s.heads, f.Size("num_attention_heads", 12));
  MEMEST_ASSIGN_OR_RETURN(s.ffn, f.Size("intermediate_size", 3072));
  MEMEST_ASSIGN_OR_RETURN(s.image, f.Size("image_size", 224));
  MEMEST_ASSIGN_OR_RETURN(s.patch, f.Size("patch_size", 16));
  MEMEST_ASSIGN_OR_RETURN(s.channels, f.Size("num_channels", 3));
  MEMEST_ASSIGN_OR_RETURN(s.activation, ActivationOf(f, "hidden_act", "gelu"));
  MEMEST_ASSIGN_OR_RETURN(s.hidden_dropout, f.Probability("hidden_dropout_prob", 0.0));
  MEMEST_ASSIGN_OR_RETURN(s.attn_dropout, f.Probability("attention_probs_dropout_prob", 0.0));
  MEMEST_ASSIGN_OR_RETURN(s.qkv_bias, f.Flag("qkv_bias", true));
  // PretrainedConfig: the labels are id2label's when it is given (a num_labels beside it is
  // overridden, with a warning), else num_labels, else 2.
  MEMEST_ASSIGN_OR_RETURN(s.classes, f.Size("num_labels", 2));
  if (const JsonValue* labels = f.Get("id2label")) {
    if (labels->kind != Kind::kObject) return WrongKind("id2label", "an object of labels", *labels);
    if (labels->items.empty()) {
      return InvalidArgument(Field("id2label") + ": no labels: ViTForImageClassification's "
                             "classifier is then an Identity, not modelled");
    }
    s.classes = static_cast<int64_t>(labels->items.size());
  }
  // ViTForImageClassification's loss: cross_entropy for single-label classification (the
  // default for integer labels with more than one label); MSE and BCE are not modelled.
  MEMEST_ASSIGN_OR_RETURN(std::string problem, f.Text("problem_type", "single_label_classification"));
  if (problem != "single_label_classification") {
    return InvalidArgument(Field("problem_type") + ": " + Quote(problem) +
                           " is not modelled (its MSELoss or BCEWithLogitsLoss); "
                           "single_label_classification builds");
  }
  if (s.classes == 1) {
    return InvalidArgument(Field("num_labels") + ": 1 label is regression (MSELoss), not "
                           "modelled; a classifier of 2 or more labels builds");
  }
  if (s.image > (int64_t{1} << 16)) {
    return InvalidArgument(Field("image_size") + ": must be at most 65536 pixels, got " +
                           std::to_string(s.image));
  }
  return s;
}

StatusOr<T5Spec> ReadT5(const Fields& f, int64_t seq) {
  T5Spec s;
  s.seq = seq;
  MEMEST_ASSIGN_OR_RETURN(s.d_model, f.Size("d_model", 512));
  MEMEST_ASSIGN_OR_RETURN(s.d_kv, f.Size("d_kv", 64));
  MEMEST_ASSIGN_OR_RETURN(s.d_ff, f.Size("d_ff", 2048));
  MEMEST_ASSIGN_OR_RETURN(s.layers, f.Size("num_layers", 6));
  // T5Config: num_decoder_layers None (to_dict writes null) is num_layers.
  MEMEST_ASSIGN_OR_RETURN(s.decoder_layers, f.Size("num_decoder_layers", s.layers));
  MEMEST_ASSIGN_OR_RETURN(s.heads, f.Size("num_heads", 8));
  MEMEST_ASSIGN_OR_RETURN(s.vocab, f.Size("vocab_size", 32128));
  MEMEST_ASSIGN_OR_RETURN(s.buckets, f.Size("relative_attention_num_buckets", 32));
  MEMEST_RETURN_IF_ERROR(f.Size("relative_attention_max_distance", 128).status());
  MEMEST_ASSIGN_OR_RETURN(s.dropout, f.Probability("dropout_rate", 0.1));
  MEMEST_ASSIGN_OR_RETURN(s.eps, f.Positive("layer_norm_epsilon", 1e-6));
  MEMEST_ASSIGN_OR_RETURN(s.tie_embeddings, f.Flag("tie_word_embeddings", true));
  // T5Config.__init__: "gated-<act>" or "<act>"; "gated-gelu" is gelu_new (the original T5 v1.1).
  MEMEST_ASSIGN_OR_RETURN(std::string proj, f.Text("feed_forward_proj", "relu"));
  const size_t dash = proj.find('-');
  s.gated = dash != std::string::npos && proj.compare(0, dash, "gated") == 0;
  std::string act = dash == std::string::npos ? proj : proj.substr(dash + 1);
  if ((dash != std::string::npos && !s.gated) || act.find('-') != std::string::npos || act.empty()) {
    return InvalidArgument(Field("feed_forward_proj") + ": " + Quote(proj) + " is not a valid "
                           "activation; give \"gated-{ACT_FN}\" or \"{ACT_FN}\", e.g. "
                           "'gated-gelu' or 'relu'");
  }
  if (proj == "gated-gelu") act = "gelu_new";
  // A saved config carries the derived dense_act_fn and is_gated_act too; PretrainedConfig sets
  // them after T5Config.__init__ derived its own, so they win.
  MEMEST_ASSIGN_OR_RETURN(act, f.Text("dense_act_fn", act));
  MEMEST_ASSIGN_OR_RETURN(s.gated, f.Flag("is_gated_act", s.gated));
  if (act == "relu") {
    s.activation = Activation::kRelu;
  } else if (act == "gelu_new") {
    s.activation = Activation::kGeluNew;
  } else if (act == "gelu") {
    s.activation = Activation::kGelu;
  } else if (act == "silu" || act == "swish") {
    s.activation = Activation::kSilu;
  } else {
    return InvalidArgument(Field(f.Get("dense_act_fn") != nullptr ? "dense_act_fn" : "feed_forward_proj") +
                           ": the activation " + Quote(act) +
                           " is not modelled; relu, gelu, gelu_new and silu build");
  }
  MEMEST_ASSIGN_OR_RETURN(bool encoder_decoder, f.Flag("is_encoder_decoder", true));
  if (!encoder_decoder) {
    return InvalidArgument(Field("is_encoder_decoder") + ": false is not modelled: a t5 config "
                           "builds T5ForConditionalGeneration (encoder and decoder)");
  }
  MEMEST_RETURN_IF_ERROR(RefuseIfSet(f, "is_decoder", "a T5 decoder alone"));
  return s;
}

FieldOf T5Fields() {
  return [](const char* name) {
    const std::string n = name;
    if (n == "seq") return std::string("model.hf_config.seq");
    if (n == "buckets") return Field("relative_attention_num_buckets");
    return Field(n);
  };
}

FieldOf VitFields() {
  return [](const char* name) {
    const std::string n = name;
    if (n == "heads") return Field("num_attention_heads");
    if (n == "d_model") return Field("hidden_size");
    if (n == "patch") return Field("patch_size");
    if (n == "image") return Field("image_size");
    return Field(n);
  };
}

FieldOf BertFields() {
  return [](const char* name) {
    const std::string n = name;
    if (n == "seq") return std::string("model.hf_config.seq");
    if (n == "heads") return Field("num_attention_heads");
    if (n == "d_model") return Field("hidden_size");
    if (n == "padding_idx") return Field("pad_token_id");
    if (n == "positions") return Field("max_position_embeddings");
    return Field(n);
  };
}

}  // namespace memest::hf
