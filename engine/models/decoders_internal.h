// Helpers the decoder files share (decoders.cc and the decoders beside it): the step's
// mode, the KV cache's length, errors naming a spec field and the LM head.
#ifndef MEMEST_ENGINE_MODELS_DECODERS_INTERNAL_H_
#define MEMEST_ENGINE_MODELS_DECODERS_INTERNAL_H_

#include <cstdint>
#include <functional>
#include <string>

#include "engine/models/decoders.h"
#include "engine/models/layers.h"
#include "engine/models/repeat_blocks.h"

namespace memest {
namespace decoders_internal {

inline std::string Str(int64_t v) { return std::to_string(v); }

inline bool Training(const BuildContext& ctx) { return ctx.mode == Mode::kTraining; }

// The KV cache the graph allocates: none in training, nor in vLLM's profile run (its paged pool
// comes after); in inference the generated tokens' room beside the prompt's keys and values,
// which the forward returns (Graph::cache), or, without use_cache, room for both.
inline int64_t KvCacheLength(const BuildContext& ctx, int64_t seq) {
  if (Training(ctx) || ctx.serving) return 0;
  return ReturnsCache(ctx) ? ctx.generate_tokens : seq + ctx.generate_tokens;
}

// A spec field's own name where it came from: "d_model" for a preset, "hidden_size" for a config.
std::string Name(const FieldOf& field, const char* name);

Status FieldError(const FieldOf& field, const char* name, const std::string& message);

// The LM head over the model's last hidden state: lm_head (tied to `embed` or its own weight)
// on the positions it computes (in training all of them; in inference the last one, as HF's
// generate() asks with logits_to_keep=1, or all of them with `every_position`, for a model
// whose forward takes no logits_to_keep, such as OPT's in transformers 4.47), soft-capped by
// `softcap` (Gemma 2's final_logit_softcapping; 0: none), and in training HF's ForCausalLMLoss
// (logits.float(), then cross_entropy over the shifted labels). The model's output and the
// logits are held until the LM's forward returns, after the loss it computes: `logits` is its
// local (a bfloat16 model's logits beside their float32 copy while cross_entropy runs, with the
// loop dropping its outputs too).
struct LmHeadOptions {
  const char* name = "lm_head";
  int embed = -1;  // the input embedding's weight, which a tied head uses
  bool tied = false;
  int64_t vocab = 0;
  double softcap = 0.0;
  bool every_position = false;
  std::function<int(int)> aux_loss;  // the loss's addition (an MoE router's), or none
};
void LanguageModelHead(GraphBuilder& b, const BuildContext& ctx, const LayerContext& c,
                       int last_hidden_state, const LmHeadOptions& o);

// Whole heads: the hidden size splits into `heads` of the same width.
Status CheckHeadsDivide(const FieldOf& field, int64_t d_model, int64_t heads);

}  // namespace decoders_internal
}  // namespace memest

#endif  // MEMEST_ENGINE_MODELS_DECODERS_INTERNAL_H_
