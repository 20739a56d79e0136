// A served model's context length and its description at another sequence length
// (engine/models/served_model.h).
#include "engine/models/served_model.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "engine/ir/text.h"
#include "engine/models/hf_fields.h"
#include "engine/models/presets.h"

namespace memest {
namespace {

using hf::Field;
using hf::Kind;
using hf::WrongKind;

Status NotServed(const char* what) {
  return InvalidArgument(std::string("model: ") + what +
                         " is not served here; serving takes a decoder language model: a GPT-2 "
                         "or Llama preset, or a Hugging Face config (model.hf_config)");
}

const PresetInfo* FindPresetInfo(const std::string& name) {
  for (const PresetInfo& p : ListPresets()) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

StatusOr<int64_t> PresetContext(const PresetSpec& spec) {
  const PresetInfo* info = FindPresetInfo(spec.name);
  if (info == nullptr) return NotFound("model.preset.name: unknown preset '" + spec.name + "'");
  if (info->family != "gpt2" && info->family != "llama") return NotServed("this preset");
  const auto given = spec.params.find("seq");
  if (given != spec.params.end()) {
    if (given->second < 1 || given->second > kMaxServingTokens) {
      return InvalidArgument("model.preset.params.seq: the context a served preset was made for, "
                             "from 1 to " + std::to_string(kMaxServingTokens) + ", got " +
                             std::to_string(given->second));
    }
    return given->second;
  }
  for (const PresetParam& p : info->params) {
    if (p.name == "seq") return p.default_value;
  }
  return NotServed("this preset");
}

// The max_position_embeddings of a transformers Config class, for a config that leaves it out.
int64_t ClassPositions(const std::string& type) {
  if (type == "mistral" || type == "mixtral") return 4096 * 32;
  if (type == "qwen2" || type == "qwen2_moe" || type == "qwen3" || type == "qwen3_moe") {
    return 32768;
  }
  if (type == "gemma" || type == "gemma2") return 8192;
  if (type == "gemma3_text") return 131072;
  if (type == "phi3") return 4096;
  if (type == "gpt2") return 1024;  // n_positions
  return 2048;                      // LlamaConfig, GPTNeoXConfig; vLLM's own fallback
}

StatusOr<double> Number(const JsonValue& scaling, const std::string& field, const char* key) {
  const JsonValue* v = scaling.Find(key);
  if (v == nullptr || v->kind == Kind::kNull) return 0.0;
  if (v->kind != Kind::kNumber || !(v->number > 0) || !std::isfinite(v->number)) {
    return InvalidArgument(Field(field + "." + key) + ": must be a positive number");
  }
  return v->number;
}

// A rope_scaling object's type as vLLM reads it (patch_rope_scaling_dict: "rope_type", else
// "type"); "" when it names none.
std::string VllmRopeType(const JsonValue& scaling) {
  const JsonValue* rope = scaling.Find("rope_type");
  if (rope == nullptr || rope->kind != Kind::kString) rope = scaling.Find("type");
  return rope != nullptr && rope->kind == Kind::kString ? rope->text : "";
}

StatusOr<int64_t> ConfigContext(const HfConfigSpec& spec) {
  const JsonValue& config = spec.config;
  const JsonValue* type_value = config.Find("model_type");
  const std::string type =
      type_value != nullptr && type_value->kind == Kind::kString ? type_value->text : "";
  static const char* const kKeys[] = {
      "max_position_embeddings", "n_positions",         "max_seq_len",
      "seq_length",              "model_max_length",    "max_target_positions",
      "max_sequence_length",     "max_seq_length",      "seq_len"};
  const hf::Fields f(config, type);
  double derived = 0;
  for (const char* key : kKeys) {
    MEMEST_ASSIGN_OR_RETURN(int64_t v, f.Size(key, 0));
    if (v > 0) derived = derived == 0 ? v : std::min<double>(derived, v);
  }
  if (derived == 0) derived = static_cast<double>(ClassPositions(type));
  for (const char* field : {"rope_scaling", "rope_parameters"}) {
    const JsonValue* scaling = f.Get(field);
    if (scaling == nullptr) continue;
    if (scaling->kind != Kind::kObject) return WrongKind(field, "an object", *scaling);
    const std::string rope_type = VllmRopeType(*scaling);
    // vLLM leaves these, and Gemma 3 (whose rope_scaling is its global layers' own), unscaled.
    if (rope_type == "llama3" || rope_type == "longrope" || rope_type == "su" ||
        type == "gemma3" || type == "gemma3_text") {
      break;
    }
    MEMEST_ASSIGN_OR_RETURN(double factor, Number(*scaling, field, "factor"));
    if (factor == 0) break;
    if (rope_type == "yarn") {
      MEMEST_ASSIGN_OR_RETURN(double original,
                              Number(*scaling, field, "original_max_position_embeddings"));
      if (original > 0) derived = original;
    }
    derived *= factor;
    break;
  }
  if (!(derived >= 1 && derived <= static_cast<double>(kMaxServingTokens))) {
    return InvalidArgument(Field("max_position_embeddings") + ": the context it gives (" +
                           std::to_string(derived) + " tokens) is beyond " +
                           std::to_string(kMaxServingTokens));
  }
  return static_cast<int64_t>(derived);
}

}  // namespace

StatusOr<int64_t> ServedContextLength(const ModelSpec& model) {
  if (const auto* preset = std::get_if<PresetSpec>(&model.source)) return PresetContext(*preset);
  if (const auto* hf = std::get_if<HfConfigSpec>(&model.source)) return ConfigContext(*hf);
  if (std::holds_alternative<LayerModelSpec>(model.source)) return NotServed("a layer list");
  return NotServed("an op graph");
}

StatusOr<ServedRotary> ServedRotaryRows(const ModelSpec& model, int64_t context) {
  ServedRotary rows{context, context};
  const auto* hf = std::get_if<HfConfigSpec>(&model.source);
  const JsonValue* type = hf != nullptr ? hf->config.Find("model_type") : nullptr;
  if (type == nullptr || type->kind != Kind::kString ||
      (type->text != "gemma3" && type->text != "gemma3_text")) {
    return rows;
  }
  const hf::Fields f(hf->config, type->text);
  const JsonValue* scaling = f.Get("rope_scaling");
  std::string field = "rope_scaling";
  if (scaling == nullptr) {
    const JsonValue* parameters = f.Get("rope_parameters");
    if (parameters != nullptr && parameters->kind == Kind::kObject) {
      scaling = parameters->Find("full_attention");
      field = "rope_parameters.full_attention";
    }
  }
  if (scaling == nullptr || scaling->kind != Kind::kObject) return rows;
  if (VllmRopeType(*scaling) != "linear") return rows;
  MEMEST_ASSIGN_OR_RETURN(double factor, Number(*scaling, field, "factor"));
  const double global = static_cast<double>(context) * std::max(factor, 1.0);
  if (global > static_cast<double>(kMaxServingTokens)) {
    return InvalidArgument(Field(field + ".factor") + ": the global layers' rotary cache (" +
                           std::to_string(global) + " positions) is beyond " +
                           std::to_string(kMaxServingTokens));
  }
  rows.global = static_cast<int64_t>(global);
  return rows;
}

StatusOr<ServedLoraLayout> ServedLoraModules(const ModelSpec& model) {
  std::string type;
  const JsonValue* config = nullptr;
  if (const auto* preset = std::get_if<PresetSpec>(&model.source)) {
    const PresetInfo* info = FindPresetInfo(preset->name);
    type = info != nullptr ? info->family : "";
  } else if (const auto* hf = std::get_if<HfConfigSpec>(&model.source)) {
    config = &hf->config;
    const JsonValue* t = config->Find("model_type");
    type = t != nullptr && t->kind == Kind::kString ? t->text : "";
  }
  ServedLoraLayout layout;
  if (type == "llama" || type == "phi3" || type == "qwen3") {
    layout.embeddings = true;
    if (type == "qwen3" && config != nullptr) {  // lm_head = model.embed_tokens when tied
      MEMEST_ASSIGN_OR_RETURN(layout.head_is_embedding,
                              hf::Fields(*config, type).Flag("tie_word_embeddings", false));
    }
    return layout;
  }
  if (type == "mistral" || type == "qwen2" || type == "gemma" || type == "gemma2" ||
      type == "gemma3" || type == "gemma3_text" || type == "opt") {
    return layout;
  }
  if (type == "mixtral" || type == "qwen2_moe" || type == "qwen3_moe") {
    return InvalidArgument("config.lora: LoRA on vLLM's fused experts (FusedMoEWithLoRA, its "
                           "slots per expert) is not modelled; " + type +
                           " is a mixture-of-experts model");
  }
  return InvalidArgument("config.lora: vLLM serves " + (type.empty() ? std::string("this model")
                                                                     : Quote(type)) +
                         " without LoRA (its model class does not implement SupportsLoRA)");
}

StatusOr<ModelSpec> WithSequence(const ModelSpec& model, int64_t seq) {
  ModelSpec out = model;
  if (auto* preset = std::get_if<PresetSpec>(&out.source)) {
    MEMEST_RETURN_IF_ERROR(PresetContext(*preset).status());
    preset->params["seq"] = seq;
    return out;
  }
  if (auto* hf = std::get_if<HfConfigSpec>(&out.source)) {
    hf->seq = seq;
    return out;
  }
  return ServedContextLength(model).status();
}

}  // namespace memest
