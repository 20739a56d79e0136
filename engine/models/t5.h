// T5 (T5ForConditionalGeneration, model_type t5; engine/models/t5.cc) as transformers 4.47's
// modeling_t5.py runs it, eagerly (T5 has no SDPA path there): the shared embedding; an encoder
// stack of pre-norm blocks (T5LayerNorm, a root-mean-square norm without mean or bias; the
// self-attention without score scaling, whose scores take a position bias added in place: the
// first block's relative_attention_bias looked up by bucket ([T, S, heads] -> [1, heads, T, S])
// plus the attention mask, made once and reused by every block; the feed-forward DenseReluDense
// or, with a gated feed_forward_proj, wi_0 and wi_1), a final norm; a decoder stack of the same
// blocks with a causal mask and, between self-attention and feed-forward, the cross-attention
// over the encoder's output (its position bias zeros plus the encoder mask); the decoder's output
// scaled by d_model ** -0.5 when the head is tied to the embedding; the lm_head and, in
// training, cross_entropy over the vocabulary. The decoder reads decoder_input_ids of the
// encoder's length.
#ifndef MEMEST_ENGINE_MODELS_T5_H_
#define MEMEST_ENGINE_MODELS_T5_H_

#include <cstdint>

#include "engine/ir/graph.h"
#include "engine/ir/status.h"
#include "engine/models/decoders.h"
#include "engine/models/layers.h"
#include "engine/models/model.h"

namespace memest {

struct T5Spec {
  int64_t seq = 0;                // tokens of input_ids and of decoder_input_ids
  int64_t d_model = 512;
  int64_t d_kv = 64;              // each head's width (heads x d_kv need not be d_model)
  int64_t d_ff = 2048;
  int64_t layers = 6;             // num_layers (the encoder's)
  int64_t decoder_layers = 6;     // num_decoder_layers
  int64_t heads = 8;
  int64_t vocab = 32128;
  int64_t buckets = 32;           // relative_attention_num_buckets
  double dropout = 0.1;           // dropout_rate
  double eps = 1e-6;              // layer_norm_epsilon
  bool gated = false;             // feed_forward_proj "gated-<act>": wi_0, wi_1
  Activation activation = Activation::kRelu;
  bool tie_embeddings = true;     // tie_word_embeddings
};

Status BuildT5Model(GraphBuilder& b, const BuildContext& ctx, const T5Spec& spec,
                    const FieldOf& field);

}  // namespace memest

#endif  // MEMEST_ENGINE_MODELS_T5_H_
