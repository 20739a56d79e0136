// What serving (engine/report/serving.h) asks of a model description: the context it was made
// for, and the description again for sequences of another length. Only decoder language models
// are served: a GPT-2 or Llama preset, or a Hugging Face config.
#ifndef MEMEST_ENGINE_MODELS_SERVED_MODEL_H_
#define MEMEST_ENGINE_MODELS_SERVED_MODEL_H_

#include <cstdint>

#include "engine/ir/status.h"
#include "engine/models/model.h"

namespace memest {

// The model's context as vLLM derives its default max_model_len (config/model.py,
// _get_and_verify_max_len, 0.11): for a config, the least of max_position_embeddings,
// n_positions, max_seq_len, seq_length, model_max_length, max_target_positions,
// max_sequence_length, max_seq_length and seq_len that it gives (its transformers class's
// default max_position_embeddings when it gives none), times rope_scaling's factor unless the
// rope_type is llama3, longrope or su (yarn scales original_max_position_embeddings); for a
// preset, its "seq" (Llama-2's 4096, GPT-2's 1024). Errors name the field (a value of the wrong
// type) or "model" (a description that is not a decoder language model).
StatusOr<int64_t> ServedContextLength(const ModelSpec& model);

// The rows of vLLM's rotary caches (get_rope): the model's `context` (ServedContextLength's),
// except Gemma 3's global layers, whose linear rope scaling (rope_scaling, or transformers 5's
// rope_parameters.full_attention) multiplies them (LinearScalingRotaryEmbedding caches
// max_position * factor positions); `local` is the sliding-window layers' table.
struct ServedRotary {
  int64_t global = 0;
  int64_t local = 0;
};
StatusOr<ServedRotary> ServedRotaryRows(const ModelSpec& model, int64_t context);

// What vLLM's LoRA manager wraps in `model` beyond its linears (engine/passes/served_lora.h),
// from the model class vLLM 0.19 runs it with: embed_tokens and lm_head where the class lists
// embedding_modules (LlamaForCausalLM, Phi3ForCausalLM, Qwen3ForCausalLM; MistralForCausalLM
// empties the list), linears only for Mistral, Qwen2, Gemma 1-3 and OPT. INVALID_ARGUMENT naming
// config.lora: a class without SupportsLoRA (GPT-2, GPT-NeoX, Falcon), or mixture-of-experts
// layers (FusedMoEWithLoRA's slots are not modelled).
StatusOr<ServedLoraLayout> ServedLoraModules(const ModelSpec& model);

// `model` for sequences of `seq` tokens: a preset's "seq" parameter, or the config's seq.
StatusOr<ModelSpec> WithSequence(const ModelSpec& model, int64_t seq);

}  // namespace memest

#endif  // MEMEST_ENGINE_MODELS_SERVED_MODEL_H_
