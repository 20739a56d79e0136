// vLLM's fused mixture-of-experts op (engine/models/moe_layers.cc builds it for serving).
//
//   fused_experts(x, topk_weights, topk_ids; experts)
//     FusedMoEModularKernel.forward with TritonExperts (vLLM 0.17-0.19,
//     model_executor/layers/fused_moe/modular_kernel.py, fused_moe.py): x [M, K]; the routing's
//     weights and choices [M, top_k]. Its two GEMMs and the activation between them write into
//     the worker's MoE workspace, which the serving pass adds once for the run
//     (engine/passes/fused_moe_workspace.h); the op itself allocates its output, [M, K] in x's
//     dtype (torch.empty_like(hidden_states), which finalize fills), and moe_align_block_size's
//     int32 buffers: the sorted token ids (M * top_k + experts * (BLOCK_SIZE_M - 1)), the block's
//     experts and the padded count (BLOCK_SIZE_M 64, get_default_config's for M > experts; 16
//     otherwise). Inference only.
#include "engine/ir/text.h"
#include "engine/rules/internal.h"

namespace memest::rules {
namespace {

StatusOr<std::vector<OutputSpec>> InferFusedExperts(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(RequireFloating(c, 0));
  MEMEST_RETURN_IF_ERROR(RequireRank(c, 0, 2, 2));
  MEMEST_RETURN_IF_ERROR(RequireRank(c, 1, 2, 2));
  MEMEST_RETURN_IF_ERROR(RequireRank(c, 2, 2, 2));
  MEMEST_ASSIGN_OR_RETURN(int64_t experts, IntAttr(c.op.attrs, "experts", 0, c.field));
  const Shape& x = c.in(0).shape;
  if (c.in(1).shape != c.in(2).shape || c.in(1).shape[0] != x[0]) {
    return InvalidArgument(InputField(c, 1) + ": the routing's weights and choices are [" +
                           std::to_string(x[0]) + ", top_k] both, got " +
                           ShapeToString(c.in(1).shape) + " and " + ShapeToString(c.in(2).shape));
  }
  if (experts < c.in(1).shape[1] || experts > (int64_t{1} << 20)) {
    return InvalidArgument(AttrField(c, "experts") + ": at least top_k " +
                           std::to_string(c.in(1).shape[1]) + " and at most 2^20, got " +
                           std::to_string(experts));
  }
  return std::vector<OutputSpec>{{x, c.in(0).dtype}};
}

void FusedExpertsMemory(const OpCall& c, OpMemory* m) {
  const int64_t tokens = c.in(0).shape[0];
  const int64_t top_k = c.in(1).shape[1];
  StatusOr<int64_t> experts = IntAttr(c.op.attrs, "experts", 1, c.field);
  const int64_t e = experts.ok() ? *experts : 1;
  const int64_t block = tokens > e ? 64 : 16;
  // Within the routing tensors' sizes and 2^20 experts of 64: no overflow.
  const int64_t sorted = tokens * top_k + e * (block - 1);
  m->forward_temps.push_back(Alloc{4 * sorted, "moe_align_block_size's sorted token ids"});
  m->forward_temps.push_back(Alloc{4 * CeilDiv(sorted, block), "its experts per block"});
  m->forward_temps.push_back(Alloc{4, "its padded token count"});
  m->grad_flow.assign(c.inputs.size(), GradFlow::kNone);
}

}  // namespace

void RegisterFusedMoeRules(std::vector<OpRule>* r) {
  r->push_back({"fused_experts", 3, 3, InferFusedExperts, FusedExpertsMemory});
}

}  // namespace memest::rules
