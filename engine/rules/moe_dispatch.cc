// Rules for Megatron-LM's mixture-of-experts layer (engine/models/megatron_moe.cc builds it):
// its token permutation, its all-to-all token dispatcher and its fused SwiGLU. As
// megatron/core/transformer/moe/{token_dispatcher,moe_utils}.py, tensor_parallel/mappings.py and
// fusions/fused_bias_swiglu.py run them (NVIDIA/Megatron-LM d98e8a64); derivatives.yaml for
// the aten ops.
//
//   ep_all_to_all(x; ep, rows, experts, top_k, role)   _AllToAll over the expert-parallel group:
//       x [n, ...] is what this rank sends; the output [rows, ...] what it receives, a new tensor
//       (`torch.empty`, then all_to_all_single). With ep 1 Megatron returns x itself: a view.
//       Backward runs the all-to-all the other way into a new tensor of x's shape. experts,
//       top_k and role ("dispatch", "combine") say which layer and which direction, for the
//       expert-parallel pass (engine/passes/expert_parallel.h).
//   index_select(x, idx; dim)   x.index_select(dim, idx), a new tensor; backward is
//       zeros(x).index_add_(dim, idx, grad): a fresh gradient, idx kept.
//   scatter(x, idx, src?; dim, value)   out of place: a new tensor of x's shape with src's (or
//       value's) elements at idx. Backward: x's gradient grad.scatter(dim, idx, 0) and src's
//       grad.gather(dim, idx), both fresh; idx kept.
//   scatter_add_(x, idx, src; dim)   in place; x's gradient is grad itself, src's
//       grad.gather(dim, idx), fresh; idx kept (an expanded view keeps its storage).
//   remainder(x; other)   x % other, elementwise, x's dtype; integer positions here.
//   megatron_swiglu(x[.., 2f], w[.., 1]?)   SwiGLUFunction / WeightedSwiGLUFunction: silu of
//       the first half times the second (times the per-token weights w): [.., f] in x's dtype,
//       one fused kernel; keeps x (and w). Backward (swiglu_back, weighted_swiglu_back under
//       jit_fuser): fresh gradients of x and w, fused on CUDA, no scratch counted; op by op on
//       1.13's CPU, with the halves of x's gradient (and g * w) as scratch (SwigluMemory).
#include <string>

#include "engine/rules/internal.h"

namespace memest::rules {
namespace {

StatusOr<std::vector<OutputSpec>> InferAllToAll(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(RequireRank(c, 0, 1, static_cast<int>(kMaxRank)));
  MEMEST_ASSIGN_OR_RETURN(int64_t ep, IntAttr(c.op.attrs, "ep", 0, c.field));
  MEMEST_ASSIGN_OR_RETURN(int64_t rows, IntAttr(c.op.attrs, "rows", -1, c.field));
  MEMEST_ASSIGN_OR_RETURN(int64_t experts, IntAttr(c.op.attrs, "experts", 0, c.field));
  MEMEST_ASSIGN_OR_RETURN(int64_t top_k, IntAttr(c.op.attrs, "top_k", 0, c.field));
  MEMEST_ASSIGN_OR_RETURN(std::string role, StringAttr(c.op.attrs, "role", "", c.field));
  if (ep < 1 || ep > (int64_t{1} << 20)) {
    return InvalidArgument(AttrField(c, "ep") + ": the expert-parallel group size, in [1, 2^20], "
                           "got " + std::to_string(ep));
  }
  if (experts < 1 || experts > (int64_t{1} << 16) || experts % ep != 0 || top_k < 1 ||
      top_k > experts) {
    return InvalidArgument(AttrField(c, "experts") + ": " + std::to_string(experts) +
                           " experts, at most 2^16, must split evenly over " +
                           std::to_string(ep) + " ranks, top_k " + std::to_string(top_k) +
                           " in [1, experts]");
  }
  if (role != "dispatch" && role != "combine") {
    return InvalidArgument(AttrField(c, "role") + ": dispatch or combine, got '" + role + "'");
  }
  const Shape& x = c.in(0).shape;
  if (rows < 0 || (ep == 1 && rows != x[0])) {
    return InvalidArgument(AttrField(c, "rows") + ": the rows this rank receives" +
                           (ep == 1 ? ", " + std::to_string(x[0]) + " with one rank" : "") +
                           ", got " + std::to_string(rows));
  }
  if (ep == 1) return std::vector<OutputSpec>{ViewOf(0, x, c.in(0).dtype, c.in(0).strides)};
  Shape out = x;
  out[0] = rows;
  return std::vector<OutputSpec>{{out, c.in(0).dtype}};
}

void AllToAllMemory(const OpCall& c, OpMemory* m) {
  StatusOr<int64_t> ep = IntAttr(c.op.attrs, "ep", 1, c.field);
  if (ep.ok() && *ep == 1) {
    m->grad_flow = {GradFlow::kPassThrough};
    return;
  }
  // _AllToAll.forward: input = input.contiguous()
  if (!IsContiguous(c.in(0).shape, c.in(0).strides)) {
    m->forward_temps.push_back(Alloc{BytesOf(c.in(0)), "all-to-all input made contiguous"});
  }
}

StatusOr<int> IndexDim(const OpCall& c) {
  MEMEST_ASSIGN_OR_RETURN(int64_t dim, IntAttr(c.op.attrs, "dim", 0, c.field));
  return NormalizeDim(dim, static_cast<int>(c.in(0).shape.size()), AttrField(c, "dim"));
}

StatusOr<std::vector<OutputSpec>> InferIndexSelect(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(RequireRank(c, 0, 1, static_cast<int>(kMaxRank)));
  MEMEST_RETURN_IF_ERROR(RequireIntegerIndex(c, 1));
  MEMEST_RETURN_IF_ERROR(RequireRank(c, 1, 1, 1));
  MEMEST_ASSIGN_OR_RETURN(int d, IndexDim(c));
  Shape out = c.in(0).shape;
  out[d] = c.in(1).shape[0];
  return std::vector<OutputSpec>{{out, c.in(0).dtype}};
}

void IndexSelectMemory(const OpCall& c, OpMemory* m) {
  m->grad_flow = {GradFlow::kFresh, GradFlow::kNone};
  if (c.needs_grad(0)) m->saved_inputs = {1};
}

// idx: the rank of `into` and no larger in any dim (and, with a source, no larger than it).
Status CheckScatterIndex(const OpCall& c, size_t into) {
  MEMEST_RETURN_IF_ERROR(RequireIntegerIndex(c, 1));
  MEMEST_RETURN_IF_ERROR(IndexDim(c).status());
  const Shape& idx = c.in(1).shape;
  bool fits = idx.size() == c.in(into).shape.size() && idx.size() == c.in(0).shape.size();
  for (size_t i = 0; fits && i < idx.size(); ++i) {
    fits = idx[i] <= c.in(into).shape[i] && (static_cast<int>(i) == *IndexDim(c) ||
                                             idx[i] <= c.in(0).shape[i]);
  }
  if (!fits) {
    return InvalidArgument(InputField(c, 1) + ": index " + ShapeToString(idx) +
                           " must have the rank of " + ShapeToString(c.in(0).shape) +
                           " and be no larger than " + ShapeToString(c.in(into).shape));
  }
  if (c.inputs.size() == 3 && c.in(2).dtype != c.in(0).dtype) {
    return InvalidArgument(InputField(c, 2) + ": src is " + std::string(DTypeName(c.in(2).dtype)) +
                           ", self " + std::string(DTypeName(c.in(0).dtype)) + ": one dtype");
  }
  return Status::Ok();
}

StatusOr<std::vector<OutputSpec>> InferScatterOutOfPlace(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(CheckScatterIndex(c, c.inputs.size() == 3 ? 2 : 0));
  if (c.inputs.size() == 2) {
    MEMEST_RETURN_IF_ERROR(FloatAttr(c.op.attrs, "value", 0, c.field).status());
  }
  const Tensor& x = c.in(0);
  return std::vector<OutputSpec>{{x.shape, x.dtype, {}, -1, IsFloating(x.dtype)}};
}

void ScatterOutOfPlaceMemory(const OpCall& c, OpMemory* m) {
  m->grad_flow = {GradFlow::kFresh, GradFlow::kNone};
  if (c.inputs.size() == 3) m->grad_flow.push_back(GradFlow::kFresh);
  if (c.needs_grad(0) || (c.inputs.size() == 3 && c.needs_grad(2))) m->saved_inputs = {1};
}

StatusOr<std::vector<OutputSpec>> InferScatterAdd(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(CheckScatterIndex(c, 2));
  const Tensor& x = c.in(0);
  return std::vector<OutputSpec>{ViewOf(0, x.shape, x.dtype, x.strides)};
}

void ScatterAddMemory(const OpCall& c, OpMemory* m) {
  m->grad_flow = {GradFlow::kPassThrough, GradFlow::kNone, GradFlow::kFresh};
  if (c.needs_grad(2)) m->saved_inputs = {1};
}

StatusOr<std::vector<OutputSpec>> InferRemainder(const OpCall& c) {
  MEMEST_ASSIGN_OR_RETURN(double other, FloatAttr(c.op.attrs, "other", 0, c.field));
  if (other == 0 && !IsFloating(c.in(0).dtype)) {
    return InvalidArgument(AttrField(c, "other") + ": integer remainder by zero");
  }
  const Tensor& x = c.in(0);
  return std::vector<OutputSpec>{{x.shape, x.dtype, {}, -1, IsFloating(x.dtype)}};
}

void RemainderMemory(const OpCall& c, OpMemory* m) {}  // remainder.Scalar: self's grad is grad

StatusOr<std::vector<OutputSpec>> InferSwiglu(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(RequireFloating(c, 0));
  MEMEST_RETURN_IF_ERROR(RequireRank(c, 0, 1, static_cast<int>(kMaxRank)));
  Shape out = c.in(0).shape;
  if (out.back() % 2 != 0) {
    return InvalidArgument(InputField(c, 0) + ": the gated halves of " + ShapeToString(out) +
                           " need an even last dim");
  }
  out.back() /= 2;
  if (c.inputs.size() == 2) {
    MEMEST_RETURN_IF_ERROR(RequireFloating(c, 1));
    Shape weights = out;
    weights.back() = 1;
    if (c.in(1).shape != weights) {
      return InvalidArgument(InputField(c, 1) + ": per-token weights " + ShapeToString(weights) +
                             ", got " + ShapeToString(c.in(1).shape));
    }
  }
  return std::vector<OutputSpec>{{out, c.in(0).dtype}};
}

// ctx.save_for_backward(input, weights) whenever either takes a gradient. On CUDA the
// backward is one fused kernel (nvFuser under torch.jit.script, Inductor under torch.compile):
// the gradients only. On PyTorch 1.13's CPU (cpu-1.13) jit_fuser is torch.jit.script, which
// fuses nothing there: swiglu_back runs op by op, and when its torch.cat runs it holds both
// halves of the input's gradient ([.., f] each) besides the cat's result; weighted_swiglu_back
// also its argument g * weights ([.., f]). The weights' gradient comes after (swiglu(y) * g,
// summed: two [.., f] at a time, below that peak). Measured on 1.13's CPU, float32
// (tests/conformance/cases_megatron_moe.py, megatron_swiglu[_weighted]; the same peaks with
// Megatron's functions under torch.jit.script as eager): 2 and 3 [.., f] over the gradients,
// all in x's dtype (weights of a wider dtype would promote them; not measured).
void SwigluMemory(const OpCall& c, OpMemory* m) {
  const bool weighted = c.inputs.size() == 2;
  if (!c.needs_grad(0) && !(weighted && c.needs_grad(1))) return;
  for (size_t i = 0; i < c.inputs.size(); ++i) m->saved_inputs.push_back(static_cast<int>(i));
  if (c.runtime != Runtime::kCpuTorch113) return;
  const int64_t half = BytesOf(c.out(0));
  m->backward_temps.push_back(Alloc{2 * half, "swiglu_back: both halves before torch.cat"});
  if (weighted) m->backward_temps.push_back(Alloc{half, "weighted_swiglu_back: g * weights"});
}

}  // namespace

void RegisterMoeDispatchRules(std::vector<OpRule>* r) {
  r->push_back({"ep_all_to_all", 1, 1, InferAllToAll, AllToAllMemory});
  r->push_back({"index_select", 2, 2, InferIndexSelect, IndexSelectMemory});
  r->push_back({"scatter", 2, 3, InferScatterOutOfPlace, ScatterOutOfPlaceMemory});
  r->push_back({"scatter_add_", 3, 3, InferScatterAdd, ScatterAddMemory});
  r->push_back({"remainder", 1, 1, InferRemainder, RemainderMemory});
  r->push_back({"megatron_swiglu", 1, 2, InferSwiglu, SwigluMemory});
}

}  // namespace memest::rules
