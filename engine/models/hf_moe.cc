// Mixture-of-experts fields of a config.json (engine/models/hf_moe.h). Defaults are those of
// transformers' MixtralConfig, Qwen2MoeConfig (4.47.1) and Qwen3MoeConfig (5.17.0).
#include "engine/models/hf_moe.h"

#include <cmath>
#include <string>

namespace memest::hf {

bool IsMoeType(const std::string& type) {
  return type == "mixtral" || type == "qwen2_moe" || type == "qwen3_moe" || type == "deepseek_v3";
}

const char* ExpertsKey(const std::string& type) {
  return type == "mixtral" ? "num_local_experts"
         : type == "deepseek_v3" ? "n_routed_experts"
                                 : "num_experts";
}

namespace {

// Qwen's mlp_only_layers: layer indices in [0, layers), each a dense MLP.
Status ReadDenseLayers(const Fields& f, int64_t layers, std::vector<int64_t>* out) {
  const JsonValue* v = f.Get("mlp_only_layers");
  if (v == nullptr) return Status::Ok();
  if (v->kind != Kind::kList) return WrongKind("mlp_only_layers", "a list of layer indices", *v);
  for (size_t i = 0; i < v->items.size(); ++i) {
    const JsonValue& item = v->items[i];
    const std::string at = "mlp_only_layers[" + std::to_string(i) + "]";
    if (item.kind != Kind::kNumber || item.number != std::floor(item.number) || item.number < 0 ||
        item.number >= static_cast<double>(layers)) {
      return InvalidArgument(Field(at) + ": must be a layer index from 0 to " +
                             std::to_string(layers - 1) + ", got " +
                             (item.kind == Kind::kNumber ? Fields::JsonNumber(item.number)
                                                         : std::string(KindName(item.kind))));
    }
    out->push_back(static_cast<int64_t>(item.number));
  }
  return Status::Ok();
}

}  // namespace

Status ReadMoe(const Fields& f, const std::string& type, LlamaSpec* s) {
  if (!IsMoeType(type) || type == "deepseek_v3") return Status::Ok();  // hf_deepseek.cc
  MoeOptions& moe = s->moe;
  moe.activation = s->activation;
  if (type == "mixtral") {
    // MixtralSparseMoeBlock: block_sparse_moe, experts.<e>.w1 / w3 / w2 of intermediate_size,
    // the top-k always renormalised.
    MEMEST_ASSIGN_OR_RETURN(moe.experts, f.Size(ExpertsKey(type), 8));
    MEMEST_ASSIGN_OR_RETURN(moe.top_k, f.Size("num_experts_per_tok", 2));
    moe.expert_ffn = s->ffn;
    moe.norm_topk_prob = true;
    moe.names = {"w1", "w3", "w2"};
    s->moe_name = "block_sparse_moe";
    MEMEST_ASSIGN_OR_RETURN(double jitter, f.Probability("router_jitter_noise", 0.0));
    if (jitter > 0) {
      return InvalidArgument(Field("router_jitter_noise") +
                             ": the router's multiplicative noise in training is not modelled; "
                             "leave it 0 (Mixtral's release config)");
    }
  } else {
    const bool qwen2 = type == "qwen2_moe";
    MEMEST_ASSIGN_OR_RETURN(moe.experts, f.Size(ExpertsKey(type), qwen2 ? 60 : 128));
    MEMEST_ASSIGN_OR_RETURN(moe.top_k, f.Size("num_experts_per_tok", qwen2 ? 4 : 8));
    MEMEST_ASSIGN_OR_RETURN(moe.expert_ffn, f.Size("moe_intermediate_size", qwen2 ? 1408 : 768));
    MEMEST_ASSIGN_OR_RETURN(moe.norm_topk_prob, f.Flag("norm_topk_prob", false));
    if (qwen2) {
      MEMEST_ASSIGN_OR_RETURN(moe.shared_expert_ffn,
                              f.Size("shared_expert_intermediate_size", 5632));
    }
    MEMEST_ASSIGN_OR_RETURN(s->moe_every, f.Size("decoder_sparse_step", 1));
    MEMEST_RETURN_IF_ERROR(ReadDenseLayers(f, s->layers, &s->dense_layers));
  }
  if (moe.top_k > moe.experts) {
    return InvalidArgument(Field("num_experts_per_tok") + ": must be at most the " +
                           std::to_string(moe.experts) + " experts, got " +
                           std::to_string(moe.top_k));
  }
  MEMEST_ASSIGN_OR_RETURN(s->router_aux_loss, f.Flag("output_router_logits", false));
  const JsonValue* coef = f.Get("router_aux_loss_coef");
  if (coef != nullptr) {
    if (coef->kind != Kind::kNumber) return WrongKind("router_aux_loss_coef", "a number", *coef);
    if (!std::isfinite(coef->number) || coef->number < 0) {
      return InvalidArgument(Field("router_aux_loss_coef") + ": must be a finite number >= 0, got " +
                             Fields::JsonNumber(coef->number));
    }
    s->router_aux_loss_coef = coef->number;
  }
  return Status::Ok();
}

}  // namespace memest::hf
