// The fields of Gemma 2 and Gemma 3 configs beyond the Llama family's (engine/models/hf_config.cc's
// reader calls it; docs/hf-config.md): model_type gemma2 (Gemma2ForCausalLM) and gemma3_text
// (Gemma3ForCausalLM). Defaults are those of transformers' Gemma2Config (4.47.1 and 5.17.0) and
// Gemma3TextConfig (5.17.0).
#ifndef MEMEST_ENGINE_MODELS_HF_GEMMA_H_
#define MEMEST_ENGINE_MODELS_HF_GEMMA_H_

#include <string>

#include "engine/ir/status.h"
#include "engine/models/decoders.h"
#include "engine/models/hf_fields.h"

namespace memest::hf {

// Whether `type` is a Gemma model type (gemma, gemma2, gemma3_text): the embeddings scaled by
// sqrt(hidden_size), GemmaRMSNorm, head_dim 256 and tied embeddings by default.
bool IsGemmaType(const std::string& type);

// For gemma2 and gemma3_text (nothing for another type): fills spec's sandwich norms, the
// scores' scaling (query_pre_attn_scalar ** -0.5), the soft-capping of the scores and the logits
// (attn_logit_softcapping: Gemma 2 only, as transformers 5's Gemma3Attention never passes it;
// final_logit_softcapping), sliding_window and which layers it applies to (layer_types, else
// every other layer from the first for Gemma 2 and Gemma 3's sliding_window_pattern), Gemma 3's
// local rotary tables and q_norm/k_norm. Refuses a head count that does not divide hidden_size
// (both Config classes do), a window of null where a layer is windowed, a layer type other than
// sliding_attention and full_attention, layer_types of another length than the layers, and
// use_bidirectional_attention. Errors name the field.
Status ReadGemma2(const Fields& f, const std::string& type, LlamaSpec* spec);

// The refusal of a "gemma3" config (Gemma3ForConditionalGeneration, the multimodal model),
// naming model_type and saying what its text_config builds.
Status RefuseMultimodalGemma3();

}  // namespace memest::hf

#endif  // MEMEST_ENGINE_MODELS_HF_GEMMA_H_
