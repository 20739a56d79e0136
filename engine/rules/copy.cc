// Rules for ops that copy a tensor, into a new arrangement or as it is, or fill it: pad
// (constant_pad_nd), roll, clone, fill_, copy_ and bmm_into.
//
// derivatives.yaml: constant_pad_nd keeps only its pads (its backward is constant_pad_nd of
// the gradient with the pads negated: a new input-sized tensor); roll keeps only its shifts
// and dims (its backward rolls the gradient back). Rolling over k dims runs roll_common
// (TensorTransformations.cpp, CPU and CUDA alike): one dim at a time, each into a new tensor,
// the k - 1 intermediates freed as the recursion returns, in forward and in backward alike
// (measured on 1.13's CPU: [y1, y2, -y1] for two dims).
#include "engine/rules/internal.h"

namespace memest {
namespace rules {
namespace {

// pad(x; pad=[left, right, ...] from the last dim backwards, value=0): constant padding; a
// negative pad crops.
StatusOr<std::vector<OutputSpec>> InferPad(const OpCall& c) {
  MEMEST_ASSIGN_OR_RETURN(std::vector<int64_t> pad, IntsAttr(c.op.attrs, "pad", {}, c.field));
  MEMEST_RETURN_IF_ERROR(FloatAttr(c.op.attrs, "value", 0.0, c.field).status());
  Shape out = c.in(0).shape;
  if (pad.size() % 2 != 0 || pad.size() > 2 * out.size()) {
    return InvalidArgument(AttrField(c, "pad") + ": needs a (left, right) pair per padded dim, " +
                           "at most " + std::to_string(out.size()) + " pairs, got " +
                           std::to_string(pad.size()) + " values");
  }
  for (size_t k = 0; k < pad.size() / 2; ++k) {
    int64_t& d = out[out.size() - 1 - k];
    int64_t sum = d;
    if (!AddBytes(&sum, pad[2 * k]) || !AddBytes(&sum, pad[2 * k + 1]) || sum < 0) {
      return InvalidArgument(AttrField(c, "pad") + ": pads " + std::to_string(pad[2 * k]) +
                             " and " + std::to_string(pad[2 * k + 1]) + " leave dim " +
                             std::to_string(out.size() - 1 - k) + " of " +
                             ShapeToString(c.in(0).shape) + " out of range");
    }
    d = sum;
  }
  return std::vector<OutputSpec>{{out, c.in(0).dtype}};
}

void NoSaves(const OpCall& c, OpMemory* m) {}

// roll(x; shifts=[...], dims=[...]): dims empty rolls the flattened tensor.
StatusOr<std::vector<OutputSpec>> InferRoll(const OpCall& c) {
  MEMEST_ASSIGN_OR_RETURN(std::vector<int64_t> shifts, IntsAttr(c.op.attrs, "shifts", {}, c.field));
  MEMEST_ASSIGN_OR_RETURN(std::vector<int64_t> dims, IntsAttr(c.op.attrs, "dims", {}, c.field));
  if (shifts.empty() || (!dims.empty() && dims.size() != shifts.size()) ||
      (dims.empty() && shifts.size() != 1)) {
    return InvalidArgument(AttrField(c, "shifts") + ": one shift per dim (or one shift and no " +
                           "dims), got " + std::to_string(shifts.size()) + " shifts and " +
                           std::to_string(dims.size()) + " dims");
  }
  if (shifts.size() > kMaxRank) {
    return InvalidArgument(AttrField(c, "shifts") + ": at most " + std::to_string(kMaxRank) +
                           " shifts, got " + std::to_string(shifts.size()));
  }
  for (int64_t d : dims) {
    MEMEST_RETURN_IF_ERROR(
        NormalizeDim(d, static_cast<int>(c.in(0).shape.size()), AttrField(c, "dims")).status());
  }
  return std::vector<OutputSpec>{Like(c.in(0))};
}

void RollMemory(const OpCall& c, OpMemory* m) {
  StatusOr<std::vector<int64_t>> dims = IntsAttr(c.op.attrs, "dims", {}, c.field);
  const int64_t extra = dims.ok() && dims->size() > 1 ? static_cast<int64_t>(dims->size()) - 1 : 0;
  if (extra == 0) return;
  m->forward_temps.push_back(Alloc{extra * BytesOf(c.in(0)), "roll: one dim at a time"});
  if (c.needs_grad(0)) {
    m->backward_temps.push_back(Alloc{extra * BytesOf(c.in(0)), "roll back: one dim at a time"});
  }
}

// clone(x): a copy in x's layout (memory_format=preserve); backward hands the gradient on
// (derivatives.yaml: grad). An explicit x.clone() copies even a contiguous x.
StatusOr<std::vector<OutputSpec>> InferClone(const OpCall& c) {
  return std::vector<OutputSpec>{Like(c.in(0))};
}

void PassGrad(const OpCall& c, OpMemory* m) { m->grad_flow = {GradFlow::kPassThrough}; }

// fill_(x; value) (zero_, fill_): in place; x's gradient is zeros (derivatives.yaml:
// zeros_like(grad)), a new tensor.
StatusOr<std::vector<OutputSpec>> InferFill(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(FloatAttr(c.op.attrs, "value", 0.0, c.field).status());
  return std::vector<OutputSpec>{ViewOf(0, c.in(0).shape, c.in(0).dtype, c.in(0).strides)};
}

// copy_(dst, src): src, broadcast to dst's shape and converted to its dtype, written into dst
// in place (a slice of a fresh tensor: torchvision's batch_images): no new storage, the output
// is dst's. Autograd keeps nothing (VariableTypeManual.cpp copy_; CopyBackwards in
// torch/csrc/autograd/functions/tensor.cpp): dst's gradient is zeros_like(grad), src's is
// grad.to(src's options), the incoming gradient itself when the dtypes match, reduced to a
// broadcast src's shape by the engine.
StatusOr<std::vector<OutputSpec>> InferCopyInto(const OpCall& c) {
  const Tensor& dst = c.in(0);
  StatusOr<Shape> out = BroadcastShapes(dst.shape, c.in(1).shape);
  if (!out.ok() || *out != dst.shape) {
    return InvalidArgument(InputField(c, 1) + ": " + ShapeToString(c.in(1).shape) +
                           " does not broadcast to the destination's " + ShapeToString(dst.shape));
  }
  return std::vector<OutputSpec>{ViewOf(0, dst.shape, dst.dtype, dst.strides)};
}

void CopyIntoMemory(const OpCall& c, OpMemory* m) {
  const bool same = c.in(1).shape == c.in(0).shape && c.in(1).dtype == c.in(0).dtype;
  m->grad_flow = {GradFlow::kFresh, same ? GradFlow::kPassThrough : GradFlow::kFresh};
}

// bmm_into(dst, a, b): a @ b written into dst in place (bmm's out= variant: 1.13's
// native_multi_head_attention writes the attention output into q's storage, attention.cpp
// bmm_nn): no new storage, the output is dst's. PyTorch runs out= variants only without
// autograd; with grad memest saves what bmm saves for a and b, and dst takes zeros as copy_'s.
StatusOr<std::vector<OutputSpec>> InferBmmInto(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(RequireRank(c, 0, 3, 3));
  const Tensor& dst = c.in(0);
  MEMEST_ASSIGN_OR_RETURN(const Shape product, BmmProduct(c, 1, 2));
  if (product != dst.shape) {
    return InvalidArgument(InputField(c, 0) + ": the product is " + ShapeToString(product) +
                           ", the destination " + ShapeToString(dst.shape));
  }
  for (size_t i = 1; i < 3; ++i) {
    if (c.in(i).dtype != dst.dtype) {
      return InvalidArgument(InputField(c, i) + ": " + std::string(DTypeName(c.in(i).dtype)) +
                             ", the destination is " + std::string(DTypeName(dst.dtype)));
    }
  }
  return std::vector<OutputSpec>{ViewOf(0, dst.shape, dst.dtype, dst.strides)};
}

void BmmIntoMemory(const OpCall& c, OpMemory* m) {
  m->backward_needs_dense_grad = true;
  SaveInputIf(m, c.needs_grad(2), 1);
  SaveInputIf(m, c.needs_grad(1), 2);
  m->grad_flow = {GradFlow::kFresh, GradFlow::kFresh, GradFlow::kFresh};
}

}  // namespace

void RegisterCopyRules(std::vector<OpRule>* r) {
  r->push_back({"clone", 1, 1, InferClone, PassGrad});
  r->push_back({"copy_", 2, 2, InferCopyInto, CopyIntoMemory});
  r->push_back({"bmm_into", 3, 3, InferBmmInto, BmmIntoMemory});
  r->push_back({"fill_", 1, 1, InferFill, NoSaves});
  // exponential_(x): x filled in place with random draws (vLLM's sampler's q): as fill_.
  r->push_back({"exponential_", 1, 1, InferFill, NoSaves});
  r->push_back({"pad", 1, 1, InferPad, NoSaves});
  r->push_back({"roll", 1, 1, InferRoll, RollMemory});
}

}  // namespace rules
}  // namespace memest
