// Hugging Face config.json into the decoders (engine/models/hf_config.h). Defaults are those of
// transformers' Config classes (LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config,
// GemmaConfig, Phi3Config, GPT2Config; docs/hf-config.md cites them).
#include "engine/models/hf_config.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>

#include "engine/ir/text.h"
#include "engine/models/decoders.h"
#include "engine/models/op_count.h"

namespace memest {
namespace {

using Kind = JsonValue::Kind;

// The largest size a config may give: far beyond any real model's, and small enough that
// products of a few sizes cannot overflow (as kMaxParamValue for the presets).
constexpr int64_t kMaxSize = int64_t{1} << 24;

std::string Str(int64_t v) { return std::to_string(v); }
std::string Field(std::string_view key) { return "model.hf_config.config." + std::string(key); }

const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::kNull: return "null";
    case Kind::kBool: return "a boolean";
    case Kind::kNumber: return "a number";
    case Kind::kString: return "a string";
    case Kind::kList: return "a list";
    case Kind::kObject: return "an object";
  }
  return "a value";
}

Status WrongKind(std::string_view key, const char* expected, const JsonValue& got) {
  return InvalidArgument(Field(key) + ": must be " + expected + ", got " + KindName(got.kind));
}

// Reads a config's fields; a field absent or null takes the caller's fallback.
class Fields {
 public:
  Fields(const JsonValue& config, std::string model_type)
      : config_(config), model_type_(std::move(model_type)) {}

  bool Present(std::string_view key) const { return config_.Find(key) != nullptr; }

  const JsonValue* Get(std::string_view key) const {
    const JsonValue* v = config_.Find(key);
    return v == nullptr || v->kind == Kind::kNull ? nullptr : v;
  }

  // A positive integer of at most kMaxSize, which the config must give.
  StatusOr<int64_t> Size(std::string_view key) const {
    if (Get(key) == nullptr) {
      return InvalidArgument(Field(key) + ": missing; a " + model_type_ +
                             " config must give it");
    }
    return Size(key, 0);
  }
  StatusOr<int64_t> Size(std::string_view key, int64_t fallback) const {
    const JsonValue* v = Get(key);
    if (v == nullptr) return fallback;
    if (v->kind != Kind::kNumber) return WrongKind(key, "a positive integer", *v);
    if (!(v->number >= 1 && v->number <= static_cast<double>(kMaxSize)) ||
        v->number != std::floor(v->number)) {
      return InvalidArgument(Field(key) + ": must be an integer from 1 to " + Str(kMaxSize) +
                             ", got " + JsonNumber(v->number));
    }
    return static_cast<int64_t>(v->number);
  }
  StatusOr<bool> Flag(std::string_view key, bool fallback) const {
    const JsonValue* v = Get(key);
    if (v == nullptr) return fallback;
    if (v->kind != Kind::kBool) return WrongKind(key, "true or false", *v);
    return v->boolean;
  }
  // A fraction in (0, 1].
  StatusOr<double> Fraction(std::string_view key, double fallback) const {
    const JsonValue* v = Get(key);
    if (v == nullptr) return fallback;
    if (v->kind != Kind::kNumber) return WrongKind(key, "a fraction", *v);
    if (!(v->number > 0 && v->number <= 1)) {
      return InvalidArgument(Field(key) + ": must be in (0, 1], got " + JsonNumber(v->number));
    }
    return v->number;
  }
  // A dropout probability in [0, 1).
  StatusOr<double> Probability(std::string_view key, double fallback) const {
    const JsonValue* v = Get(key);
    if (v == nullptr) return fallback;
    if (v->kind != Kind::kNumber) return WrongKind(key, "a probability", *v);
    if (!(v->number >= 0 && v->number < 1)) {
      return InvalidArgument(Field(key) + ": must be a probability in [0, 1), got " +
                             JsonNumber(v->number));
    }
    return v->number;
  }
  StatusOr<std::string> Text(std::string_view key, const std::string& fallback) const {
    const JsonValue* v = Get(key);
    if (v == nullptr) return fallback;
    if (v->kind != Kind::kString) return WrongKind(key, "a string", *v);
    return v->text;
  }

  static std::string JsonNumber(double x) {
    if (!std::isfinite(x)) return "a non-finite number";
    char text[32];
    std::snprintf(text, sizeof(text), "%.17g", x);
    return text;
  }

 private:
  const JsonValue& config_;
  std::string model_type_;
};

// HF's ACT2FN names of the activations the decoders run.
StatusOr<Activation> ActivationOf(const Fields& f, std::string_view key,
                                  const std::string& fallback) {
  MEMEST_ASSIGN_OR_RETURN(std::string name, f.Text(key, fallback));
  if (name == "silu" || name == "swish") return Activation::kSilu;
  if (name == "gelu") return Activation::kGelu;
  if (name == "gelu_new") return Activation::kGeluNew;
  if (name == "gelu_pytorch_tanh") return Activation::kGeluTanh;
  if (name == "relu") return Activation::kRelu;
  return InvalidArgument(Field(key) + ": unknown activation " + Quote(name) +
                         "; known: gelu, gelu_new, gelu_pytorch_tanh, relu, silu, swish");
}

// The causal-LM class a model type builds; a config naming another architecture (a
// classification head, an encoder) is refused rather than built as something else.
Status CheckArchitecture(const Fields& f, const std::string& causal_lm) {
  const JsonValue* list = f.Get("architectures");
  if (list == nullptr) return Status::Ok();
  if (list->kind != Kind::kList) return WrongKind("architectures", "a list of class names", *list);
  for (size_t i = 0; i < list->items.size(); ++i) {
    const JsonValue& name = list->items[i];
    const std::string field = "architectures[" + Str(static_cast<int64_t>(i)) + "]";
    if (name.kind != Kind::kString) return WrongKind(field, "a class name", name);
    if (name.text != causal_lm) {
      return InvalidArgument(Field(field) + ": " + Quote(name.text) +
                             " is not built; a config of this model_type builds " + causal_lm);
    }
  }
  return Status::Ok();
}

// rope_scaling (rope_parameters since transformers 5) changes how the rotary tables are
// computed, not their size: any type transformers knows is accepted, an unknown one refused.
// As transformers 4.x reads it, "type" wins over "rope_type" (configuration_llama.py copies it).
Status CheckRope(const Fields& f, const char* field) {
  const JsonValue* scaling = f.Get(field);
  if (scaling == nullptr) return Status::Ok();
  if (scaling->kind != Kind::kObject) return WrongKind(field, "an object", *scaling);
  std::string key = std::string(field) + ".type";
  const JsonValue* type = scaling->Find("type");
  if (type == nullptr || type->kind == Kind::kNull) {
    type = scaling->Find("rope_type");
    key = std::string(field) + ".rope_type";
  }
  if (type == nullptr || type->kind == Kind::kNull) {
    return InvalidArgument(Field(field) + ": must name its rope_type");
  }
  if (type->kind != Kind::kString) return WrongKind(key, "a string", *type);
  static const char* const kKnown[] = {"default", "linear",  "dynamic",      "yarn",
                                       "longrope", "llama3", "proportional", "su"};
  for (const char* known : kKnown) {
    if (type->text == known) return Status::Ok();
  }
  return InvalidArgument(Field(key) + ": unknown " + Quote(type->text) +
                         "; known: default, dynamic, linear, llama3, longrope, proportional, "
                         "su, yarn");
}

// A setting that changes the model in a way not modelled: refused when true.
Status RefuseIfSet(const Fields& f, std::string_view key, const char* why) {
  MEMEST_ASSIGN_OR_RETURN(bool set, f.Flag(key, false));
  if (set) return InvalidArgument(Field(key) + ": true is not modelled: " + why);
  return Status::Ok();
}

// What `spec` fields are called in a config, for the decoders' errors.
FieldOf LlamaFields() {
  return [](const char* name) {
    const std::string n = name;
    if (n == "seq") return std::string("model.hf_config.seq");
    if (n == "heads") return Field("num_attention_heads");
    if (n == "kv_heads") return Field("num_key_value_heads");
    return Field(n);
  };
}

FieldOf Gpt2Fields() {
  return [](const char* name) {
    const std::string n = name;
    if (n == "seq") return std::string("model.hf_config.seq");
    if (n == "heads") return Field("n_head");
    return Field(n);
  };
}

struct Family {
  const char* model_type;
  const char* causal_lm;
};

// The Llama family: which defaults and variants a model type has.
StatusOr<LlamaSpec> ReadLlama(const Fields& f, const std::string& type, int64_t seq) {
  LlamaSpec s;
  s.seq = seq;
  MEMEST_ASSIGN_OR_RETURN(s.d_model, f.Size("hidden_size"));
  MEMEST_ASSIGN_OR_RETURN(s.layers, f.Size("num_hidden_layers"));
  MEMEST_ASSIGN_OR_RETURN(s.heads, f.Size("num_attention_heads"));
  MEMEST_ASSIGN_OR_RETURN(s.ffn, f.Size("intermediate_size"));
  MEMEST_ASSIGN_OR_RETURN(s.vocab, f.Size("vocab_size"));
  // num_key_value_heads null is the heads' count in the Llama, Mistral and Qwen Config classes
  // (GemmaConfig keeps the null, which its model cannot build: refused below); left out, it is
  // that for Llama and Phi-3, 8 for Mistral, 16 for Gemma and 32 for Qwen2 and Qwen3 (their
  // classes' defaults).
  const bool heads_default = type == "llama" || type == "phi3";
  const int64_t kv_default = heads_default || f.Present("num_key_value_heads") ? s.heads
                             : type == "mistral"                                ? 8
                             : type == "gemma"                                  ? 16
                                                                                : 32;
  MEMEST_ASSIGN_OR_RETURN(s.kv_heads, f.Size("num_key_value_heads", kv_default));
  const bool gemma = type == "gemma";
  if (gemma && f.Present("num_key_value_heads") && f.Get("num_key_value_heads") == nullptr) {
    return InvalidArgument(Field("num_key_value_heads") +
                           ": null is not a count: GemmaConfig keeps it, and GemmaAttention "
                           "cannot be built with it");
  }
  MEMEST_ASSIGN_OR_RETURN(s.head_dim, f.Size("head_dim", type == "qwen3" ? 128 : gemma ? 256 : 0));
  MEMEST_ASSIGN_OR_RETURN(s.tie_embeddings, f.Flag("tie_word_embeddings", gemma));
  MEMEST_ASSIGN_OR_RETURN(s.activation,
                          ActivationOf(f, "hidden_act", gemma ? "gelu_pytorch_tanh" : "silu"));
  s.gemma = gemma;
  if (gemma) {
    MEMEST_RETURN_IF_ERROR(RefuseIfSet(f, "use_bidirectional_attention",
                                       "attention without the causal mask (transformers 5)"));
  }
  MEMEST_ASSIGN_OR_RETURN(s.attn_dropout, f.Probability("attention_dropout", 0.0));
  MEMEST_RETURN_IF_ERROR(CheckRope(f, "rope_scaling"));
  MEMEST_RETURN_IF_ERROR(CheckRope(f, "rope_parameters"));
  if (type == "qwen2") {
    s.qkv_bias = true;  // Qwen2Attention: q_proj, k_proj, v_proj bias=True; o_proj bias=False
  } else if (type != "mistral") {
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
    double factor = 1.0;
    const JsonValue* rope = f.Get("rope_parameters");
    const JsonValue* in_rope = rope != nullptr ? rope->Find("partial_rotary_factor") : nullptr;
    if (in_rope != nullptr && in_rope->kind == Kind::kNumber) {
      factor = in_rope->number;
    } else {
      MEMEST_ASSIGN_OR_RETURN(factor, f.Fraction("partial_rotary_factor", 1.0));
    }
    const int64_t head_dim = s.head_dim > 0 ? s.head_dim : s.d_model / s.heads;
    // Phi3RotaryEmbedding: dim = int(head_dim * partial_rotary_factor)
    s.rotary_dim = static_cast<int64_t>(static_cast<double>(head_dim) * factor);
  }
  s.qk_norm = type == "qwen3";
  if (type == "mistral") {
    // MistralConfig's default is 4096; "sliding_window": null is full attention (Mistral v0.2
    // and later).
    MEMEST_ASSIGN_OR_RETURN(s.sliding_window,
                            f.Size("sliding_window", f.Present("sliding_window") ? 0 : 4096));
  } else if (type == "phi3") {
    // Phi3Config: sliding_window None (full attention) unless the config gives one.
    MEMEST_ASSIGN_OR_RETURN(s.sliding_window, f.Size("sliding_window", 0));
  } else if (type == "qwen2" || type == "qwen3") {
    MEMEST_RETURN_IF_ERROR(RefuseIfSet(
        f, "use_sliding_window",
        "the windowed layers above max_window_layers; leave it false for full attention in "
        "every layer, which holds at least as much"));
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
    {"gemma", "GemmaForCausalLM"},     {"gpt2", "GPT2LMHeadModel"},
    {"llama", "LlamaForCausalLM"},     {"mistral", "MistralForCausalLM"},
    {"phi3", "Phi3ForCausalLM"},       {"qwen2", "Qwen2ForCausalLM"},
    {"qwen3", "Qwen3ForCausalLM"},
};

// Builds the family's model with `layers` layers (0: the config's), errors and all.
StatusOr<Graph> BuildFamily(const Family& family, const Fields& f, int64_t seq, int64_t layers,
                            const BuildContext& context) {
  GraphBuilder b;
  b.SetMaxOps(context.max_ops);
  b.SetBudget(context.budget);
  b.NameSize(context.micro_batch, "config.batch_size");
  b.NameSize(seq, "model.hf_config.seq");
  if (context.autocast != DType::kFloat32) b.EnableAutocast(context.autocast);
  const std::string type = family.model_type;
  if (type == "gpt2") {
    MEMEST_ASSIGN_OR_RETURN(Gpt2Spec s, ReadGpt2(f, seq));
    if (layers > 0) s.layers = layers;
    MEMEST_RETURN_IF_ERROR(BuildGpt2Model(b, context, s, Gpt2Fields()));
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
  std::string known;
  for (const std::string& name : HfModelTypes()) known += (known.empty() ? "" : ", ") + name;
  return InvalidArgument(Field("model_type") + ": " + Quote(type->text) +
                         " is not supported; supported: " + known);
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
  if (f.Get("quantization_config") != nullptr) {
    return InvalidArgument(Field("quantization_config") +
                           ": quantized weights (bitsandbytes, GPTQ, AWQ, fp8) are not modelled "
                           "yet; without it the config estimates the unquantized model");
  }
  if (spec.seq <= 0 || spec.seq > kMaxSize) {
    return InvalidArgument("model.hf_config.seq: " +
                           (spec.seq == 0 ? std::string("required: the tokens per sequence")
                                          : "must be from 1 to " + Str(kMaxSize) + ", got " +
                                                Str(spec.seq)));
  }
  MEMEST_RETURN_IF_ERROR(ValidateBuildContext(context));
  MEMEST_ASSIGN_OR_RETURN(
      int64_t layers,
      f.Size(std::string(family->model_type) == "gpt2" ? "n_layer" : "num_hidden_layers"));
  MEMEST_RETURN_IF_ERROR(CheckLayeredOpCount(
      layers,
      Field(std::string(family->model_type) == "gpt2" ? "n_layer" : "num_hidden_layers"),
      std::string("a ") + family->model_type + " config", context,
      [&](int64_t n, const BuildContext& counting) {
        return BuildFamily(*family, f, spec.seq, n, counting);
      }));
  return BuildFamily(*family, f, spec.seq, 0, context);
}

StatusOr<HfRunHints> HfConfigRunHints(const JsonValue& config, bool dtype, bool attention) {
  HfRunHints hints;
  if (config.kind != Kind::kObject) return hints;
  const Fields f(config, "");
  for (const char* key : {"dtype", "torch_dtype"}) {
    if (!dtype) break;
    MEMEST_ASSIGN_OR_RETURN(std::string name, f.Text(key, ""));
    if (name.empty() || hints.dtype) continue;
    if (name == "float32") hints.dtype = DType::kFloat32;
    else if (name == "bfloat16") hints.dtype = DType::kBFloat16;
    else if (name == "float16") hints.dtype = DType::kFloat16;
    else return InvalidArgument(Field(key) + ": unknown " + Quote(name) +
                                "; known: bfloat16, float16, float32");
  }
  for (const char* key : {"attn_implementation", "_attn_implementation"}) {
    if (!attention) break;
    MEMEST_ASSIGN_OR_RETURN(std::string name, f.Text(key, ""));
    if (name.empty() || hints.attention) continue;
    if (name == "eager") hints.attention = AttentionImpl::kEager;
    else if (name == "sdpa") hints.attention = AttentionImpl::kSdpa;
    else if (name == "flash_attention_2") hints.attention = AttentionImpl::kFlash;
    else return InvalidArgument(Field(key) + ": unknown " + Quote(name) +
                                "; known: eager, flash_attention_2, sdpa");
  }
  return hints;
}

}  // namespace memest
