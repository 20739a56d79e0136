// Gemma 2 and Gemma 3 fields of a config.json (engine/models/hf_gemma.h). Defaults are those of
// transformers' Gemma2Config (4.47.1, 5.17.0) and Gemma3TextConfig (5.17.0).
#include "engine/models/hf_gemma.h"

#include <cmath>
#include <string>
#include <vector>

#include "engine/ir/text.h"

namespace memest::hf {

bool IsGemmaType(const std::string& type) {
  return type == "gemma" || type == "gemma2" || type == "gemma3_text";
}

namespace {

std::string Str(int64_t v) { return std::to_string(v); }

// A soft-capping value: null is none (0), left out the class's `fallback`.
StatusOr<double> Softcap(const Fields& f, const char* key, double fallback) {
  if (f.Present(key) && f.Get(key) == nullptr) return 0.0;
  return f.Positive(key, fallback);
}

// Which of the `layers` layers attend within the window: layer_types where the config gives them
// (transformers 5; transformers 4.47's Gemma2 ignores them and windows the even layers), else
// Gemma2Config's default ("sliding_attention" if bool((i + 1) % 2)) or Gemma3TextConfig's
// (bool((i + 1) % sliding_window_pattern), the pattern 6 when left out).
StatusOr<std::vector<bool>> WindowedLayers(const Fields& f, bool gemma2, int64_t layers) {
  std::vector<bool> windowed(static_cast<size_t>(layers));
  const JsonValue* types = f.Get("layer_types");
  if (types != nullptr) {
    if (types->kind != Kind::kList) return WrongKind("layer_types", "a list of layer types", *types);
    if (static_cast<int64_t>(types->items.size()) != layers) {
      return InvalidArgument(Field("layer_types") + ": must give one type for each of the " +
                             Str(layers) + " layers (num_hidden_layers), got " +
                             Str(static_cast<int64_t>(types->items.size())));
    }
    for (size_t i = 0; i < types->items.size(); ++i) {
      const JsonValue& type = types->items[i];
      const std::string key = "layer_types[" + Str(static_cast<int64_t>(i)) + "]";
      if (type.kind != Kind::kString) return WrongKind(key, "a layer type", type);
      if (type.text != "sliding_attention" && type.text != "full_attention") {
        return InvalidArgument(Field(key) + ": " + Quote(type.text) +
                               " is not a Gemma layer type; known: full_attention, "
                               "sliding_attention");
      }
      windowed[i] = type.text == "sliding_attention";
    }
    return windowed;
  }
  int64_t pattern = 2;
  if (!gemma2) {
    MEMEST_ASSIGN_OR_RETURN(pattern, f.Size("sliding_window_pattern", 6));
  }
  for (int64_t i = 0; i < layers; ++i) windowed[static_cast<size_t>(i)] = (i + 1) % pattern != 0;
  return windowed;
}

}  // namespace

Status ReadGemma2(const Fields& f, const std::string& type, LlamaSpec* s) {
  const bool gemma2 = type == "gemma2";
  if (!gemma2 && type != "gemma3_text") return Status::Ok();
  // Gemma2Config and Gemma3TextConfig's validate_architecture (5.17), Gemma2Attention (4.47):
  // whatever head_dim says.
  if (s->d_model % s->heads != 0) {
    return InvalidArgument(Field("num_attention_heads") + ": must divide hidden_size " +
                           Str(s->d_model) + ", got " + Str(s->heads) +
                           " (the Config class refuses it whatever head_dim says)");
  }
  s->sandwich_norms = true;
  MEMEST_ASSIGN_OR_RETURN(double scalar, f.Positive("query_pre_attn_scalar", 256.0));
  s->attn_scaling = std::pow(scalar, -0.5);  // self.scaling = query_pre_attn_scalar**-0.5
  MEMEST_ASSIGN_OR_RETURN(s->final_softcap,
                          Softcap(f, "final_logit_softcapping", gemma2 ? 30.0 : 0.0));
  // Gemma3Attention never passes attn_logit_softcapping to its attention function: read (so that
  // a bad value is refused) and not applied.
  MEMEST_ASSIGN_OR_RETURN(double attn_softcap,
                          Softcap(f, "attn_logit_softcapping", gemma2 ? 50.0 : 0.0));
  if (gemma2) s->attn_softcap = attn_softcap;
  // transformers 5 builds a sliding-window mask in every forward (create_sliding_window_causal_mask
  // refuses a null window), and 4.47's Gemma 2 windows its even layers whatever the config says.
  if (f.Present("sliding_window") && f.Get("sliding_window") == nullptr) {
    return InvalidArgument(Field("sliding_window") +
                           ": null is refused by transformers, which builds the windowed "
                           "layers' mask from it in every forward");
  }
  MEMEST_ASSIGN_OR_RETURN(s->sliding_window, f.Size("sliding_window", 4096));
  MEMEST_ASSIGN_OR_RETURN(s->windowed_layers, WindowedLayers(f, gemma2, s->layers));
  if (!gemma2) {
    s->qk_norm = true;       // Gemma3Attention's q_norm and k_norm (GemmaRMSNorm over head_dim)
    s->local_rotary = true;  // the windowed layers' tables (rope_local_base_freq)
  }
  return Status::Ok();
}

Status RefuseMultimodalGemma3() {
  return InvalidArgument(
      Field("model_type") +
      ": 'gemma3' is Gemma3ForConditionalGeneration, the multimodal model (a SigLIP vision "
      "tower and a projector beside the language model), which is not built; its text_config "
      "given as the config (model_type gemma3_text) builds the language model alone, "
      "Gemma3ForCausalLM");
}

}  // namespace memest::hf
