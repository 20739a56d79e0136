// Transformer encoders as Hugging Face runs them: BERT (BertForMaskedLM) and RoBERTa
// (RobertaForMaskedLM), the bert-base preset and the bert and roberta model_types of an HF config
// (engine/models/hf_encoders.cc) building the same graph (engine/models/bert.cc); and ViT
// (ViTForImageClassification, model_type vit; engine/models/vit.cc).
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

// ViTForImageClassification (transformers' modeling_vit.py; engine/models/vit.cc): the patch
// embedding (a conv of kernel and stride patch, flattened and transposed), the class token
// concatenated in front, the position embeddings added, dropout; pre-LN layers
// (layernorm_before, self-attention with separate query, key and value, its output dense and
// dropout, the residual; layernorm_after, the intermediate dense and activation, the output
// dense, dropout and the residual); the final layernorm; the classifier on the class token and,
// in training, cross_entropy over the labels. (The vit-b16 preset is torchvision's vit_b_16,
// whose attention is nn.MultiheadAttention's fused projection.)
struct VitSpec {
  int64_t image = 224;           // image_size
  int64_t patch = 16;            // patch_size
  int64_t channels = 3;          // num_channels
  int64_t layers = 12;
  int64_t d_model = 768;         // hidden_size
  int64_t heads = 12;
  int64_t ffn = 3072;            // intermediate_size
  int64_t classes = 2;           // num_labels (id2label's length)
  Activation activation = Activation::kGelu;
  double hidden_dropout = 0.0;   // hidden_dropout_prob
  double attn_dropout = 0.0;     // attention_probs_dropout_prob
  bool qkv_bias = true;
};

// The classifier's graph for ctx.micro_batch images.
Status BuildVitModel(GraphBuilder& b, const BuildContext& ctx, const VitSpec& spec,
                     const FieldOf& field);

// (image / patch)^2 + 1: the tokens a ViT's encoder runs on (0 when patch does not divide image).
int64_t VitTokens(const VitSpec& spec);

}  // namespace memest

#endif  // MEMEST_ENGINE_MODELS_ENCODERS_H_
