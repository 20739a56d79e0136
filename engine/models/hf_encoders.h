// The fields of BERT, RoBERTa, ViT and T5 configs (engine/models/hf_config.cc dispatches to
// them; docs/hf-config.md): model_type bert (BertForMaskedLM), roberta (RobertaForMaskedLM), vit
// (ViTForImageClassification) and t5 (T5ForConditionalGeneration), with the defaults of
// transformers' BertConfig, RobertaConfig, ViTConfig and T5Config.
#ifndef MEMEST_ENGINE_MODELS_HF_ENCODERS_H_
#define MEMEST_ENGINE_MODELS_HF_ENCODERS_H_

#include <cstdint>

#include "engine/ir/status.h"
#include "engine/models/encoders.h"
#include "engine/models/hf_fields.h"
#include "engine/models/t5.h"

namespace memest::hf {

// A bert or roberta config. Refuses position_embedding_type other than absolute (the relative
// position scores are not modelled), is_decoder and add_cross_attention (a BERT decoder is
// another model) and chunk_size_feed_forward (the chunked FFN). Errors name the field.
StatusOr<BertSpec> ReadBert(const Fields& f, bool roberta, int64_t seq);

// What BertSpec's fields are called in these configs, for the builder's errors.
FieldOf BertFields();

// A vit config (ViTForImageClassification), with ViTConfig's defaults; the labels are
// id2label's when given, else num_labels, else 2. Refuses problem_type other than
// single_label_classification, one label (regression) and an empty id2label. Errors name the
// field.
StatusOr<VitSpec> ReadVit(const Fields& f);
FieldOf VitFields();

// A t5 config (T5ForConditionalGeneration), with T5Config's defaults: feed_forward_proj "relu"
// or "gated-<act>" ("gated-gelu" is gelu_new, T5 v1.1 and FLAN-T5), num_decoder_layers null
// as num_layers. Refuses is_encoder_decoder false and is_decoder (a decoder alone), an
// activation it does not model. Errors name the field.
StatusOr<T5Spec> ReadT5(const Fields& f, int64_t seq);
FieldOf T5Fields();

}  // namespace memest::hf

#endif  // MEMEST_ENGINE_MODELS_HF_ENCODERS_H_
