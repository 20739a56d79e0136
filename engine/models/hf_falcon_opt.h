// The fields of Falcon and OPT configs (engine/models/hf_config.cc dispatches to them;
// docs/hf-config.md): model_type falcon (FalconForCausalLM) and opt (OPTForCausalLM). Defaults
// are those of transformers 4.47.1's FalconConfig and OPTConfig.
#ifndef MEMEST_ENGINE_MODELS_HF_FALCON_OPT_H_
#define MEMEST_ENGINE_MODELS_HF_FALCON_OPT_H_

#include <cstdint>

#include "engine/ir/status.h"
#include "engine/models/decoders.h"
#include "engine/models/hf_fields.h"

namespace memest::hf {

// A falcon config: hidden_size (or n_embed, the Config class's older name), num_hidden_layers,
// num_attention_heads and vocab_size must be given; ffn_hidden_size is 4 * hidden_size when
// left out, num_kv_heads the heads' count. Refuses alibi true (ALiBi's biases are not
// modelled), new_decoder_architecture with parallel_attn false and num_ln_in_parallel_attn 2
// without new_decoder_architecture (FalconDecoderLayer cannot run either), a num_kv_heads other
// than the heads' where every head has its own k and v, and num_ln_in_parallel_attn other than
// 1 or 2. Errors name the field.
StatusOr<FalconSpec> ReadFalcon(const Fields& f, int64_t seq);

// An opt config: hidden_size, num_hidden_layers, num_attention_heads, ffn_dim and vocab_size
// must be given. layerdrop is read but every layer is built (the most a step can hold).
StatusOr<OptSpec> ReadOpt(const Fields& f, int64_t seq);

// What FalconSpec's and OptSpec's fields are called in these configs, for the decoders' errors.
FieldOf FalconFields();
FieldOf OptFields();

}  // namespace memest::hf

#endif  // MEMEST_ENGINE_MODELS_HF_FALCON_OPT_H_
