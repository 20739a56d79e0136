// vLLM's latent attention in its profile run (engine/models/mla_attention.cc builds it for
// serving).
//
//   mla_profile_attention(q, kv_c_normed, k_pe; workspace_rows, v_head_dim, kv_head_dim)
//     MLAAttention.forward with no attention metadata (vLLM 0.19,
//     model_executor/layers/attention/mla_attention.py, forward_impl): q [N, T, H, qk_head_dim]
//     (a rank's heads), the normed latent and the rotary key, which the run reads no further.
//     Its output [N, T, H, v_head_dim] in q's dtype (torch.empty, then fill_(0)); while it runs,
//     the placeholder the profile takes for the chunked prefill's up-projected context,
//     `torch.empty((workspace_rows, H, qk_nope_head_dim + v_head_dim))` in the latent's dtype.
//     Inference only.
#include "engine/rules/internal.h"

namespace memest::rules {
namespace {

StatusOr<std::vector<OutputSpec>> InferMlaProfile(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(RequireFloating(c, 0));
  MEMEST_RETURN_IF_ERROR(RequireRank(c, 0, 4, 4));
  MEMEST_RETURN_IF_ERROR(RequireFloating(c, 1));
  for (const char* name : {"workspace_rows", "v_head_dim", "kv_head_dim"}) {
    MEMEST_ASSIGN_OR_RETURN(int64_t v, IntAttr(c.op.attrs, name, 0, c.field));
    if (v <= 0 || v > (int64_t{1} << 24)) {
      return InvalidArgument(AttrField(c, name) + ": must be from 1 to 2^24, got " +
                             std::to_string(v));
    }
  }
  MEMEST_ASSIGN_OR_RETURN(int64_t v_head_dim, IntAttr(c.op.attrs, "v_head_dim", 0, c.field));
  MEMEST_ASSIGN_OR_RETURN(int64_t rows, IntAttr(c.op.attrs, "workspace_rows", 0, c.field));
  MEMEST_ASSIGN_OR_RETURN(int64_t width, IntAttr(c.op.attrs, "kv_head_dim", 0, c.field));
  MEMEST_RETURN_IF_ERROR(
      CheckedBytes({rows, c.in(0).shape[2], width}, c.in(1).dtype, AttrField(c, "workspace_rows"))
          .status());
  Shape out = c.in(0).shape;
  out[3] = v_head_dim;
  return std::vector<OutputSpec>{{out, c.in(0).dtype}};
}

void MlaProfileMemory(const OpCall& c, OpMemory* m) {
  m->grad_flow.assign(c.inputs.size(), GradFlow::kNone);
  StatusOr<int64_t> rows = IntAttr(c.op.attrs, "workspace_rows", 1, c.field);
  StatusOr<int64_t> width = IntAttr(c.op.attrs, "kv_head_dim", 1, c.field);
  const Shape placeholder = {rows.ok() ? *rows : 1, c.in(0).shape[2], width.ok() ? *width : 1};
  m->forward_temps.push_back(
      AllocOf(placeholder, c.in(1).dtype, "the profile's stand-in for the prefill's context"));
}

}  // namespace

void RegisterServedMlaRules(std::vector<OpRule>* r) {
  r->push_back({"mla_profile_attention", 3, 3, InferMlaProfile, MlaProfileMemory});
}

}  // namespace memest::rules
