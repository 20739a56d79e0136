// Hugging Face config.json into the decoders (engine/models/hf_config.h). Defaults are those of
// transformers' Config classes (LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config,
// GemmaConfig, Phi3Config, GPT2Config, the MoE ones in hf_moe.cc and Gemma 2's and 3's in
// hf_gemma.cc; docs/hf-config.md cites them).
#include "engine/models/hf_config.h"

#include <algorithm>
#include <initializer_list>
#include <optional>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>

#include "engine/ir/text.h"
#include "engine/models/decoders.h"
#include "engine/models/hf_encoders.h"
#include "engine/models/hf_falcon_opt.h"
#include "engine/models/hf_fields.h"
#include "engine/models/hf_deepseek.h"
#include "engine/models/hf_gemma.h"
#include "engine/models/hf_moe.h"
#include "engine/models/op_count.h"

namespace memest {
namespace {

using namespace hf;  // NOLINT: the config readers (engine/models/hf_fields.h)

std::string Str(int64_t v) { return std::to_string(v); }

// What `spec` fields are called in a config, for the decoders' errors.
FieldOf LlamaFields() {
  return [](const char* name) {
    const std::string n = name;
    if (n == "seq") return std::string("model.hf_config.seq");
    if (n == "heads") return Field("num_attention_heads");
    if (n == "kv_heads") return Field("num_key_value_heads");
    if (n == "rotary_dim") return Field("rotary_pct");
    if (n == "d_model") return Field("hidden_size");
    if (n == "top_k") return Field("num_experts_per_tok");
    if (n == "expert_ffn") return Field("moe_intermediate_size");
    if (n == "moe_every") return Field("decoder_sparse_step");
    return Field(n);
  };
}

FieldOf Gpt2Fields() {
  return [](const char* name) {
    const std::string n = name;
    if (n == "seq") return std::string("model.hf_config.seq");
    if (n == "heads") return Field("n_head");
    if (n == "d_model") return Field("n_embd");
    return Field(n);
  };
}

struct Family {
  const char* model_type;
  const char* causal_lm;
};

// The rotary share of each head: partial_rotary_factor in rope_parameters (transformers 5) or at
// the top, else rotary_pct (GPT-NeoX's own name), else `fallback`.
StatusOr<double> RotaryShare(const Fields& f, double fallback) {
  const JsonValue* rope = f.Get("rope_parameters");
  const JsonValue* in_rope = rope != nullptr ? rope->Find("partial_rotary_factor") : nullptr;
  if (in_rope != nullptr && in_rope->kind == Kind::kNumber) {
    if (!(in_rope->number > 0 && in_rope->number <= 1)) {
      return InvalidArgument(Field("rope_parameters.partial_rotary_factor") +
                             ": must be in (0, 1], got " + Fields::JsonNumber(in_rope->number));
    }
    return in_rope->number;
  }
  if (f.Get("partial_rotary_factor") != nullptr) {
    return f.Fraction("partial_rotary_factor", fallback);
  }
  return f.Fraction("rotary_pct", fallback);
}

// The sizes every family but GPT-2 names alike, which the config must give.
template <typename Spec>
Status ReadSizes(const Fields& f, Spec* s) {
  MEMEST_ASSIGN_OR_RETURN(s->d_model, f.Size("hidden_size"));
  MEMEST_ASSIGN_OR_RETURN(s->layers, f.Size("num_hidden_layers"));
  MEMEST_ASSIGN_OR_RETURN(s->heads, f.Size("num_attention_heads"));
  MEMEST_ASSIGN_OR_RETURN(s->ffn, f.Size("intermediate_size"));
  MEMEST_ASSIGN_OR_RETURN(s->vocab, f.Size("vocab_size"));
  return Status::Ok();
}

// The Llama family: which defaults and variants a model type has.
StatusOr<LlamaSpec> ReadLlama(const Fields& f, const std::string& type, int64_t seq) {
  LlamaSpec s;
  s.seq = seq;
  MEMEST_RETURN_IF_ERROR(ReadSizes(f, &s));
  // num_key_value_heads null is the heads' count in the Llama, Mistral and Qwen Config classes
  // (the Gemma classes keep the null, which their models cannot build: refused below); left
  // out, it is that for Llama and Phi-3, 8 for Mistral, 16 for Gemma and Qwen2-MoE, 4 for Gemma 2
  // and 3 and Qwen3-MoE, and 32 for Qwen2 and Qwen3 (their classes' defaults).
  const bool heads_default = type == "llama" || type == "phi3";
  const int64_t kv_default = heads_default || f.Present("num_key_value_heads") ? s.heads
                             : type == "deepseek_v3"                            ? 128
                             : type == "mistral" || type == "mixtral"           ? 8
                             : type == "gemma" || type == "qwen2_moe"           ? 16
                             : type == "qwen2" || type == "qwen3"               ? 32
                                                                                : 4;
  MEMEST_ASSIGN_OR_RETURN(s.kv_heads, f.Size("num_key_value_heads", kv_default));
  const bool gemma = IsGemmaType(type);
  if (gemma && f.Present("num_key_value_heads") && f.Get("num_key_value_heads") == nullptr) {
    return InvalidArgument(Field("num_key_value_heads") +
                           ": null is not a count: GemmaConfig keeps it, and GemmaAttention "
                           "cannot be built with it");
  }
  MEMEST_ASSIGN_OR_RETURN(s.head_dim, f.Size("head_dim", type == "qwen3" ? 128 : gemma ? 256 : 0));
  MEMEST_ASSIGN_OR_RETURN(s.tie_embeddings, f.Flag("tie_word_embeddings", gemma));
  // Gemma 2's and 3's MLPs read hidden_activation (Gemma 1's hidden_act in transformers 5).
  MEMEST_ASSIGN_OR_RETURN(
      s.activation,
      ActivationOf(f, gemma && type != "gemma" ? "hidden_activation" : "hidden_act",
                   gemma ? "gelu_pytorch_tanh" : "silu"));
  s.gemma = gemma;
  if (gemma) {
    MEMEST_RETURN_IF_ERROR(RefuseIfSet(f, "use_bidirectional_attention",
                                       "attention without the causal mask (transformers 5)"));
  }
  MEMEST_ASSIGN_OR_RETURN(s.attn_dropout, f.Probability("attention_dropout", 0.0));
  MEMEST_RETURN_IF_ERROR(CheckRope(f, "rope_scaling"));
  MEMEST_RETURN_IF_ERROR(CheckRope(f, "rope_parameters"));
  if (type == "qwen2" || type == "qwen2_moe") {
    s.qkv_bias = true;  // Qwen2Attention: q_proj, k_proj, v_proj bias=True; o_proj bias=False
  } else if (type != "mistral" && type != "mixtral") {
    MEMEST_ASSIGN_OR_RETURN(bool bias, f.Flag("attention_bias", false));
    s.qkv_bias = s.out_bias = bias;
  }
  if (type == "llama") {
    MEMEST_ASSIGN_OR_RETURN(s.mlp_bias, f.Flag("mlp_bias", false));
  }
  if (type == "phi3") {
    // Phi3Attention: qkv_proj and o_proj without bias whatever attention_bias says.
    s.qkv_bias = s.out_bias = false;
    s.phi3 = true;
    MEMEST_ASSIGN_OR_RETURN(s.resid_dropout, f.Probability("resid_pdrop", 0.0));
    MEMEST_ASSIGN_OR_RETURN(double factor, RotaryShare(f, 1.0));
    const int64_t head_dim = s.head_dim > 0 ? s.head_dim : s.d_model / s.heads;
    // Phi3RotaryEmbedding: dim = int(head_dim * partial_rotary_factor)
    s.rotary_dim = static_cast<int64_t>(static_cast<double>(head_dim) * factor);
  }
  s.qk_norm = type == "qwen3" || type == "qwen3_moe";
  if (type == "mixtral") {
    MEMEST_ASSIGN_OR_RETURN(s.sliding_window, f.Size("sliding_window", 0));  // None: full
  } else if (type == "mistral") {
    // MistralConfig's default is 4096; "sliding_window": null is full attention (Mistral v0.2
    // and later).
    MEMEST_ASSIGN_OR_RETURN(s.sliding_window,
                            f.Size("sliding_window", f.Present("sliding_window") ? 0 : 4096));
  } else if (type == "phi3") {
    // Phi3Config: sliding_window None (full attention) unless the config gives one.
    MEMEST_ASSIGN_OR_RETURN(s.sliding_window, f.Size("sliding_window", 0));
  } else if (type == "qwen2" || type == "qwen3" || type == "qwen2_moe" || type == "qwen3_moe") {
    MEMEST_RETURN_IF_ERROR(RefuseIfSet(
        f, "use_sliding_window",
        "the windowed layers above max_window_layers; leave it false for full attention in "
        "every layer, which holds at least as much"));
  }
  MEMEST_RETURN_IF_ERROR(ReadMoe(f, type, &s));
  MEMEST_RETURN_IF_ERROR(ReadDeepseek(f, type, &s));
  MEMEST_RETURN_IF_ERROR(ReadGemma2(f, type, &s));
  return s;
}

StatusOr<NeoxSpec> ReadNeox(const Fields& f, int64_t seq) {
  NeoxSpec s;
  s.seq = seq;
  MEMEST_RETURN_IF_ERROR(ReadSizes(f, &s));
  MEMEST_ASSIGN_OR_RETURN(s.parallel_residual, f.Flag("use_parallel_residual", true));
  MEMEST_ASSIGN_OR_RETURN(s.attention_bias, f.Flag("attention_bias", true));
  MEMEST_ASSIGN_OR_RETURN(s.tie_embeddings, f.Flag("tie_word_embeddings", false));
  MEMEST_ASSIGN_OR_RETURN(s.activation, ActivationOf(f, "hidden_act", "gelu"));
  MEMEST_ASSIGN_OR_RETURN(s.attn_dropout, f.Probability("attention_dropout", 0.0));
  MEMEST_ASSIGN_OR_RETURN(s.hidden_dropout, f.Probability("hidden_dropout", 0.0));
  MEMEST_ASSIGN_OR_RETURN(s.mask_positions, f.Size("max_position_embeddings", 2048));
  MEMEST_RETURN_IF_ERROR(CheckRope(f, "rope_scaling"));
  MEMEST_RETURN_IF_ERROR(CheckRope(f, "rope_parameters"));
  MEMEST_ASSIGN_OR_RETURN(double share, RotaryShare(f, 0.25));
  if (s.d_model % s.heads == 0) {
    // GPTNeoXRotaryEmbedding: dim = int(head_size * partial_rotary_factor)
    s.rotary_dim = static_cast<int64_t>(static_cast<double>(s.d_model / s.heads) * share);
  }
  return s;
}

StatusOr<Gpt2Spec> ReadGpt2(const Fields& f, int64_t seq) {
  Gpt2Spec s;
  s.seq = seq;
  MEMEST_ASSIGN_OR_RETURN(s.d_model, f.Size("n_embd"));
  MEMEST_ASSIGN_OR_RETURN(s.layers, f.Size("n_layer"));
  MEMEST_ASSIGN_OR_RETURN(s.heads, f.Size("n_head"));
  MEMEST_ASSIGN_OR_RETURN(s.vocab, f.Size("vocab_size"));
  MEMEST_ASSIGN_OR_RETURN(s.positions, f.Size("n_positions", 1024));
  MEMEST_ASSIGN_OR_RETURN(s.ffn, f.Size("n_inner", 0));
  MEMEST_ASSIGN_OR_RETURN(s.tie_embeddings, f.Flag("tie_word_embeddings", true));
  MEMEST_ASSIGN_OR_RETURN(s.activation, ActivationOf(f, "activation_function", "gelu_new"));
  MEMEST_ASSIGN_OR_RETURN(s.embd_dropout, f.Probability("embd_pdrop", 0.1));
  MEMEST_ASSIGN_OR_RETURN(s.attn_dropout, f.Probability("attn_pdrop", 0.1));
  MEMEST_ASSIGN_OR_RETURN(s.resid_dropout, f.Probability("resid_pdrop", 0.1));
  MEMEST_ASSIGN_OR_RETURN(bool scale, f.Flag("scale_attn_weights", true));
  if (!scale) {
    return InvalidArgument(Field("scale_attn_weights") +
                           ": false is not modelled: GPT-2 divides its scores by sqrt(head_dim)");
  }
  MEMEST_RETURN_IF_ERROR(RefuseIfSet(f, "scale_attn_by_inverse_layer_idx",
                                     "the scores' extra division per layer"));
  MEMEST_RETURN_IF_ERROR(RefuseIfSet(f, "reorder_and_upcast_attn",
                                     "the float32 baddbmm of the upcast attention"));
  MEMEST_RETURN_IF_ERROR(RefuseIfSet(f, "add_cross_attention", "the cross-attention layers"));
  return s;
}

constexpr Family kFamilies[] = {
    {"bert", "BertForMaskedLM"},          {"roberta", "RobertaForMaskedLM"},
    {"deepseek_v3", "DeepseekV3ForCausalLM"},
    {"vit", "ViTForImageClassification"}, {"t5", "T5ForConditionalGeneration"},
    {"falcon", "FalconForCausalLM"},      {"gemma", "GemmaForCausalLM"},
    {"gemma2", "Gemma2ForCausalLM"},      {"gemma3_text", "Gemma3ForCausalLM"},
    {"gpt2", "GPT2LMHeadModel"},          {"gpt_neox", "GPTNeoXForCausalLM"},
    {"llama", "LlamaForCausalLM"},        {"mistral", "MistralForCausalLM"},
    {"mixtral", "MixtralForCausalLM"},    {"opt", "OPTForCausalLM"},
    {"phi3", "Phi3ForCausalLM"},          {"qwen2", "Qwen2ForCausalLM"},
    {"qwen2_moe", "Qwen2MoeForCausalLM"}, {"qwen3", "Qwen3ForCausalLM"},
    {"qwen3_moe", "Qwen3MoeForCausalLM"},
};

// Builds the family's model with `layers` layers (0: the config's), errors and all.
StatusOr<Graph> BuildFamily(const Family& family, const Fields& f, int64_t seq, int64_t layers,
                            const BuildContext& context) {
  GraphBuilder b;
  ConfigureBuilder(context, b);
  b.NameSize(context.micro_batch, "config.batch_size");
  b.NameSize(seq, "model.hf_config.seq");
  if (context.autocast != DType::kFloat32) b.EnableAutocast(context.autocast);
  const std::string type = family.model_type;
  if (type == "gpt2") {
    MEMEST_ASSIGN_OR_RETURN(Gpt2Spec s, ReadGpt2(f, seq));
    if (layers > 0) s.layers = layers;
    MEMEST_RETURN_IF_ERROR(BuildGpt2Model(b, context, s, Gpt2Fields()));
  } else if (type == "gpt_neox") {
    MEMEST_ASSIGN_OR_RETURN(NeoxSpec s, ReadNeox(f, seq));
    if (layers > 0) s.layers = layers;
    MEMEST_RETURN_IF_ERROR(BuildNeoxModel(b, context, s, LlamaFields()));
  } else if (type == "falcon") {
    MEMEST_ASSIGN_OR_RETURN(FalconSpec s, ReadFalcon(f, seq));
    if (layers > 0) s.layers = layers;
    MEMEST_RETURN_IF_ERROR(BuildFalconModel(b, context, s, FalconFields()));
  } else if (type == "vit") {
    MEMEST_ASSIGN_OR_RETURN(VitSpec s, ReadVit(f));
    if (layers > 0) s.layers = layers;
    MEMEST_RETURN_IF_ERROR(BuildVitModel(b, context, s, VitFields()));
  } else if (type == "t5") {
    MEMEST_ASSIGN_OR_RETURN(T5Spec s, ReadT5(f, seq));
    if (layers > 0) s.layers = s.decoder_layers = layers;
    MEMEST_RETURN_IF_ERROR(BuildT5Model(b, context, s, T5Fields()));
  } else if (type == "bert" || type == "roberta") {
    MEMEST_ASSIGN_OR_RETURN(BertSpec s, ReadBert(f, type == "roberta", seq));
    if (layers > 0) s.layers = layers;
    MEMEST_RETURN_IF_ERROR(BuildBertModel(b, context, s, BertFields()));
  } else if (type == "opt") {
    MEMEST_ASSIGN_OR_RETURN(OptSpec s, ReadOpt(f, seq));
    if (layers > 0) s.layers = layers;
    MEMEST_RETURN_IF_ERROR(BuildOptModel(b, context, s, OptFields()));
  } else {
    MEMEST_ASSIGN_OR_RETURN(LlamaSpec s, ReadLlama(f, type, seq));
    if (layers > 0) s.layers = layers;
    MEMEST_RETURN_IF_ERROR(BuildLlamaModel(b, context, s, LlamaFields()));
  }
  return b.Finish(context.max_ops);
}

StatusOr<const Family*> FamilyOf(const JsonValue& config) {
  if (config.kind != Kind::kObject) {
    return InvalidArgument("model.hf_config.config: must be the object of a config.json, got " +
                           std::string(KindName(config.kind)));
  }
  const JsonValue* type = config.Find("model_type");
  if (type == nullptr || type->kind == Kind::kNull) {
    return InvalidArgument(Field("model_type") + ": missing; a config.json names its model_type");
  }
  if (type->kind != Kind::kString) return WrongKind("model_type", "a string", *type);
  for (const Family& family : kFamilies) {
    if (type->text == family.model_type) return &family;
  }
  if (type->text == "gemma3") return RefuseMultimodalGemma3();
  if (type->text == "RefinedWebModel" || type->text == "RefinedWeb") {
    // Falcon's remote-code configs, which transformers' AutoConfig does not map;
    // models/falcon/convert_custom_code_checkpoint.py rewrites them as "falcon".
    return InvalidArgument(Field("model_type") + ": " + Quote(type->text) +
                           " is Falcon's remote-code type (RWForCausalLM), which transformers "
                           "does not map; its convert_custom_code_checkpoint.py rewrites the "
                           "config as model_type \"falcon\" (n_head -> num_attention_heads, "
                           "n_layer -> num_hidden_layers, n_head_kv -> num_kv_heads with "
                           "new_decoder_architecture true)");
  }
  std::string known;
  for (const std::string& name : HfModelTypes()) known += (known.empty() ? "" : ", ") + name;
  return InvalidArgument(Field("model_type") + ": " + Quote(type->text) +
                         " is not supported; supported: " + known);
}

template <typename T>
struct Named {
  const char* name;
  T value;
};

// The value `table` names for the first of `keys` the config sets (a later key is not read);
// none when it sets neither; an unknown name is refused, listing the table's.
template <typename T, size_t N>
StatusOr<std::optional<T>> FirstNamed(const Fields& f, std::initializer_list<const char*> keys,
                                      const Named<T> (&table)[N]) {
  for (const char* key : keys) {
    MEMEST_ASSIGN_OR_RETURN(std::string name, f.Text(key, ""));
    if (name.empty()) continue;
    std::string known;
    for (const Named<T>& entry : table) {
      if (name == entry.name) return std::optional<T>(entry.value);
      known += (known.empty() ? "" : ", ") + std::string(entry.name);
    }
    return InvalidArgument(Field(key) + ": unknown " + Quote(name) + "; known: " + known);
  }
  return std::optional<T>();
}

}  // namespace

const std::vector<std::string>& HfModelTypes() {
  static const auto* types = [] {
    auto* v = new std::vector<std::string>();
    for (const Family& family : kFamilies) v->push_back(family.model_type);
    std::sort(v->begin(), v->end());
    return v;
  }();
  return *types;
}

StatusOr<Graph> BuildHfConfig(const HfConfigSpec& spec, const BuildContext& context) {
  MEMEST_ASSIGN_OR_RETURN(const Family* family, FamilyOf(spec.config));
  const Fields f(spec.config, family->model_type);
  MEMEST_RETURN_IF_ERROR(CheckArchitecture(f, family->causal_lm));
  if (f.Get("quantization_config") != nullptr) {  // Estimate and PlanJob resolve it first
    return InvalidArgument(Field("quantization_config") +
                           ": a quantized checkpoint is estimated and planned with its "
                           "quantization (ResolveCheckpointQuantization); this request builds "
                           "the model alone");
  }
  int64_t seq = spec.seq;
  if (std::string(family->model_type) == "vit") {
    // An image model: its tokens are the config's patches and the class token.
    MEMEST_ASSIGN_OR_RETURN(VitSpec vit, ReadVit(f));
    const int64_t tokens = VitTokens(vit);
    if (tokens > kMaxSize) {
      return InvalidArgument(Field("image_size") + ": " + Str(vit.image) + " pixels in patches of " +
                             Str(vit.patch) + " make " + Str(tokens) + " tokens, more than " +
                             Str(kMaxSize));
    }
    if (seq != 0 && seq != tokens) {
      return InvalidArgument("model.hf_config.seq: a vit config's sequence is its patches and "
                             "the class token, " + Str(tokens) + " (image_size / patch_size "
                             "squared, + 1); leave it unset, got " + Str(seq));
    }
    seq = tokens > 0 ? tokens : 1;  // the builder names a patch_size that does not divide
  }
  if (seq <= 0 || seq > kMaxSize) {
    return InvalidArgument("model.hf_config.seq: " +
                           (seq == 0 ? std::string("required: the tokens per sequence")
                                     : "must be from 1 to " + Str(kMaxSize) + ", got " +
                                           Str(seq)));
  }
  MEMEST_RETURN_IF_ERROR(ValidateBuildContext(context));
  const std::string type = family->model_type;
  // The decoders (and T5's decoder) return their keys and values under use_cache, which their
  // configs set by default; encoders return none.
  BuildContext built = context;
  MEMEST_ASSIGN_OR_RETURN(const bool use_cache, f.Flag("use_cache", true));
  built.use_cache = use_cache && type != "bert" && type != "roberta" && type != "vit";
  const char* layers_field = type == "gpt2" ? "n_layer" : type == "t5" ? "num_layers" : "num_hidden_layers";
  MEMEST_ASSIGN_OR_RETURN(int64_t layers, type == "t5" ? f.Size(layers_field, 6) : f.Size(layers_field));
  if (type == "t5") {  // the counted build has as many decoder blocks: the larger stack's count
    MEMEST_ASSIGN_OR_RETURN(const int64_t decoder, f.Size("num_decoder_layers", layers));
    layers = std::max(layers, decoder);
  }
  MEMEST_RETURN_IF_ERROR(CheckLayeredOpCount(
      layers, Field(layers_field), std::string("a ") + family->model_type + " config", built,
      [&](int64_t n, const BuildContext& counting) {
        return BuildFamily(*family, f, seq, n, counting);
      }));
  return BuildFamily(*family, f, seq, 0, built);
}

bool HfConfigRoutesExperts(const JsonValue& config) {
  const JsonValue* type = config.Find("model_type");
  if (type == nullptr || type->kind != Kind::kString || !IsMoeType(type->text)) return false;
  const JsonValue* experts = config.Find(ExpertsKey(type->text));
  return experts == nullptr || experts->kind != Kind::kNumber || experts->number > 0;
}

StatusOr<HfRunHints> HfConfigRunHints(const JsonValue& config, bool dtype, bool attention) {
  HfRunHints hints;
  if (config.kind != Kind::kObject) return hints;
  const Fields f(config, "");
  static constexpr Named<DType> kDTypes[] = {
      {"bfloat16", DType::kBFloat16}, {"float16", DType::kFloat16}, {"float32", DType::kFloat32}};
  static constexpr Named<AttentionImpl> kAttentions[] = {
      {"eager", AttentionImpl::kEager},
      {"flash_attention_2", AttentionImpl::kFlash},
      {"sdpa", AttentionImpl::kSdpa}};
  if (dtype) {
    MEMEST_ASSIGN_OR_RETURN(hints.dtype, FirstNamed(f, {"dtype", "torch_dtype"}, kDTypes));
  }
  if (attention) {
    MEMEST_ASSIGN_OR_RETURN(
        hints.attention,
        FirstNamed(f, {"attn_implementation", "_attn_implementation"}, kAttentions));
  }
  return hints;
}

}  // namespace memest
