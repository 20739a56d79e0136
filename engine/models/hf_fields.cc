#include "engine/models/hf_fields.h"

#include <string>

#include "engine/ir/text.h"

namespace memest::hf {
namespace {

std::string Str(int64_t v) { return std::to_string(v); }

}  // namespace

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

namespace {

// One rope_scaling (or rope_parameters) object at `field`: a type transformers knows.
Status CheckRopeObject(const JsonValue& scaling, const std::string& field) {
  if (scaling.kind != Kind::kObject) return WrongKind(field, "an object", scaling);
  std::string key = field + ".type";
  const JsonValue* type = scaling.Find("type");
  if (type == nullptr || type->kind == Kind::kNull) {
    type = scaling.Find("rope_type");
    key = field + ".rope_type";
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

}  // namespace

// rope_scaling (rope_parameters since transformers 5) changes how the rotary tables are
// computed, not their size: any type transformers knows is accepted, an unknown one refused.
// As transformers 4.x reads it, "type" wins over "rope_type" (configuration_llama.py copies it).
// transformers 5 keys the parameters of a model with layer types by type (Gemma 3's
// rope_parameters: {"full_attention": {...}, "sliding_attention": {...}}): each is checked.
Status CheckRope(const Fields& f, const char* field) {
  const JsonValue* scaling = f.Get(field);
  if (scaling == nullptr) return Status::Ok();
  if (scaling->kind == Kind::kObject && scaling->Find("type") == nullptr &&
      scaling->Find("rope_type") == nullptr) {
    bool per_type = false;
    for (const char* layer_type : {"full_attention", "sliding_attention"}) {
      const JsonValue* params = scaling->Find(layer_type);
      if (params == nullptr || params->kind == Kind::kNull) continue;
      per_type = true;
      MEMEST_RETURN_IF_ERROR(
          CheckRopeObject(*params, std::string(field) + "." + layer_type));
    }
    if (per_type) return Status::Ok();
  }
  return CheckRopeObject(*scaling, field);
}

// A setting that changes the model in a way not modelled: refused when true.
Status RefuseIfSet(const Fields& f, std::string_view key, const char* why) {
  MEMEST_ASSIGN_OR_RETURN(bool set, f.Flag(key, false));
  if (set) return InvalidArgument(Field(key) + ": true is not modelled: " + why);
  return Status::Ok();
}

}  // namespace memest::hf
