// Transformer encoders with a masked-LM head, as Hugging Face runs them: BERT
// (BertForMaskedLM) and RoBERTa (RobertaForMaskedLM), the bert-base preset and the bert and
// roberta model_types of an HF config (engine/models/hf_encoders.cc) building the same graph
// (engine/models/bert.cc).
#ifndef MEMEST_ENGINE_MODELS_ENCODERS_H_
#define MEMEST_ENGINE_MODELS_ENCODERS_H_

#include <cstdint>

#include "engine/ir/graph.h"
#include "engine/ir/status.h"
#include "engine/models/decoders.h"
#include "engine/models/layers.h"
#include "engine/models/model.h"

namespace memest {

// BertForMaskedLM / RobertaForMaskedLM (transformers' modeling_bert.py, modeling_roberta.py):
// word, token-type and absolute position embeddings summed (the positions added in place),
// LayerNorm and dropout; post-LN encoder layers (self-attention with separate query, key and
// value, its output dense, dropout and LayerNorm over the residual; the intermediate dense and
// activation; the output dense, dropout and LayerNorm); then the masked-LM head (a dense, the
// activation, LayerNorm, and the decoder tied to the word embeddings with its own bias) and, in
// training, cross_entropy over the vocabulary at every position. RoBERTa numbers its positions
// from the input ids (create_position_ids_from_input_ids: padding_idx + 1 on), so its table has
// padding_idx + 1 more rows than the longest sequence, and its head's activation is always
// GELU (RobertaLMHead calls gelu).
struct BertSpec {
  int64_t seq = 0;
  int64_t layers = 0;
  int64_t d_model = 0;
  int64_t heads = 0;
  int64_t ffn = 0;               // intermediate_size
  int64_t vocab = 0;
  int64_t positions = 512;       // max_position_embeddings
  int64_t type_vocab = 2;        // type_vocab_size
  Activation activation = Activation::kGelu;  // hidden_act
  double hidden_dropout = 0.1;   // hidden_dropout_prob
  double attn_dropout = 0.1;     // attention_probs_dropout_prob
  bool roberta = false;
  int64_t padding_idx = 1;       // RoBERTa's pad_token_id
  bool tie_embeddings = true;    // the decoder reads the word embeddings
};

// The encoder's graph for ctx.micro_batch sequences of spec.seq tokens; errors name
// `field(...)` of the spec field at fault.
Status BuildBertModel(GraphBuilder& b, const BuildContext& ctx, const BertSpec& spec,
                      const FieldOf& field);

}  // namespace memest

#endif  // MEMEST_ENGINE_MODELS_ENCODERS_H_
