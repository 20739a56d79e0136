// Falcon and OPT configs into FalconSpec and OptSpec (engine/models/hf_falcon_opt.h), with the
// defaults of transformers 4.47.1's FalconConfig and OPTConfig.
#include "engine/models/hf_falcon_opt.h"

#include <string>

namespace memest::hf {

StatusOr<FalconSpec> ReadFalcon(const Fields& f, int64_t seq) {
  FalconSpec s;
  s.seq = seq;
  // FalconConfig: hidden_size = hidden_size if n_embed is None else n_embed.
  const char* hidden = f.Get("n_embed") != nullptr ? "n_embed" : "hidden_size";
  MEMEST_ASSIGN_OR_RETURN(s.d_model, f.Size(hidden));
  MEMEST_ASSIGN_OR_RETURN(s.layers, f.Size("num_hidden_layers"));
  MEMEST_ASSIGN_OR_RETURN(s.heads, f.Size("num_attention_heads"));
  MEMEST_ASSIGN_OR_RETURN(s.vocab, f.Size("vocab_size"));
  if (s.d_model > kMaxSize / 4) {
    return InvalidArgument(Field(hidden) + ": must be at most " + std::to_string(kMaxSize / 4) +
                           " (the MLP's 4 * hidden_size), got " + std::to_string(s.d_model));
  }
  MEMEST_ASSIGN_OR_RETURN(s.ffn, f.Size("ffn_hidden_size", 4 * s.d_model));
  MEMEST_ASSIGN_OR_RETURN(s.kv_heads, f.Size("num_kv_heads", s.heads));
  MEMEST_ASSIGN_OR_RETURN(s.new_decoder_architecture, f.Flag("new_decoder_architecture", false));
  MEMEST_ASSIGN_OR_RETURN(s.multi_query, f.Flag("multi_query", true));
  MEMEST_ASSIGN_OR_RETURN(s.parallel_attn, f.Flag("parallel_attn", true));
  MEMEST_ASSIGN_OR_RETURN(s.bias, f.Flag("bias", false));
  MEMEST_ASSIGN_OR_RETURN(s.tie_embeddings, f.Flag("tie_word_embeddings", true));
  MEMEST_ASSIGN_OR_RETURN(s.activation, ActivationOf(f, "activation", "gelu"));
  MEMEST_ASSIGN_OR_RETURN(s.hidden_dropout, f.Probability("hidden_dropout", 0.0));
  MEMEST_ASSIGN_OR_RETURN(s.attention_dropout, f.Probability("attention_dropout", 0.0));
  MEMEST_RETURN_IF_ERROR(CheckRope(f, "rope_scaling"));
  MEMEST_RETURN_IF_ERROR(RefuseIfSet(
      f, "alibi", "ALiBi's position biases (Falcon-RW); the rotary Falcons (alibi false) build"));
  // FalconDecoderLayer: num_ln_in_parallel_attn None is 2 under new_decoder_architecture.
  MEMEST_ASSIGN_OR_RETURN(s.parallel_norms,
                          f.Size("num_ln_in_parallel_attn", s.new_decoder_architecture ? 2 : 1));
  if (s.parallel_norms > 2) {
    return InvalidArgument(Field("num_ln_in_parallel_attn") + ": must be 1 or 2, got " +
                           std::to_string(s.parallel_norms));
  }
  if (s.new_decoder_architecture && !s.parallel_attn) {
    return InvalidArgument(Field("parallel_attn") +
                           ": false with new_decoder_architecture true: FalconDecoderLayer "
                           "builds no MLP input for it (transformers fails in forward)");
  }
  if (!s.new_decoder_architecture && s.parallel_attn && s.parallel_norms == 2) {
    return InvalidArgument(Field("num_ln_in_parallel_attn") +
                           ": 2 without new_decoder_architecture: FalconDecoderLayer builds "
                           "ln_attn and ln_mlp and its forward calls input_layernorm");
  }
  if (!s.new_decoder_architecture && !s.multi_query && s.kv_heads != s.heads) {
    return InvalidArgument(Field("num_kv_heads") + ": must be the " + std::to_string(s.heads) +
                           " heads when neither new_decoder_architecture nor multi_query is "
                           "set (FalconAttention gives each head its own k and v), got " +
                           std::to_string(s.kv_heads));
  }
  return s;
}

StatusOr<OptSpec> ReadOpt(const Fields& f, int64_t seq) {
  OptSpec s;
  s.seq = seq;
  MEMEST_ASSIGN_OR_RETURN(s.d_model, f.Size("hidden_size"));
  MEMEST_ASSIGN_OR_RETURN(s.layers, f.Size("num_hidden_layers"));
  MEMEST_ASSIGN_OR_RETURN(s.heads, f.Size("num_attention_heads"));
  MEMEST_ASSIGN_OR_RETURN(s.ffn, f.Size("ffn_dim"));
  MEMEST_ASSIGN_OR_RETURN(s.vocab, f.Size("vocab_size"));
  MEMEST_ASSIGN_OR_RETURN(s.positions, f.Size("max_position_embeddings", 2048));
  if (s.positions > kMaxSize - 2) {
    return InvalidArgument(Field("max_position_embeddings") + ": must be at most " +
                           std::to_string(kMaxSize - 2) + " (the table has 2 more rows), got " +
                           std::to_string(s.positions));
  }
  MEMEST_ASSIGN_OR_RETURN(s.embed_dim, f.Size("word_embed_proj_dim", s.d_model));
  MEMEST_ASSIGN_OR_RETURN(s.norm_before, f.Flag("do_layer_norm_before", true));
  MEMEST_ASSIGN_OR_RETURN(bool removed, f.Flag("_remove_final_layer_norm", false));
  s.final_norm = s.norm_before && !removed;
  MEMEST_ASSIGN_OR_RETURN(s.bias, f.Flag("enable_bias", true));
  MEMEST_ASSIGN_OR_RETURN(s.norm_affine, f.Flag("layer_norm_elementwise_affine", true));
  MEMEST_ASSIGN_OR_RETURN(s.tie_embeddings, f.Flag("tie_word_embeddings", true));
  MEMEST_ASSIGN_OR_RETURN(s.activation, ActivationOf(f, "activation_function", "relu"));
  MEMEST_ASSIGN_OR_RETURN(s.dropout, f.Probability("dropout", 0.1));
  MEMEST_ASSIGN_OR_RETURN(s.attn_dropout, f.Probability("attention_dropout", 0.0));
  MEMEST_RETURN_IF_ERROR(f.Probability("layerdrop", 0.0).status());
  return s;
}

FieldOf FalconFields() {
  return [](const char* name) {
    const std::string n = name;
    if (n == "seq") return std::string("model.hf_config.seq");
    if (n == "heads") return Field("num_attention_heads");
    if (n == "kv_heads") return Field("num_kv_heads");
    if (n == "d_model") return Field("hidden_size");
    return Field(n);
  };
}

FieldOf OptFields() {
  return [](const char* name) {
    const std::string n = name;
    if (n == "seq") return std::string("model.hf_config.seq");
    if (n == "heads") return Field("num_attention_heads");
    if (n == "d_model") return Field("hidden_size");
    return Field(n);
  };
}

}  // namespace memest::hf
