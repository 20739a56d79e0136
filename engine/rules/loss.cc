// Rules for losses.
//
// cross_entropy = log_softmax(x, dim, x.dtype) + nll_loss: log_softmax keeps its [N, C] result,
// nll_loss its input (the same tensor; under autocast a float32 copy of it), its targets and a
// 0-dim total_weight, whatever the reduction (reduction="none" returns one loss per target);
// backward forms nll_loss_backward's [N, C] gradient, then _log_softmax_backward_data's.
// mse_loss keeps both operands.
#include <algorithm>

#include "engine/rules/internal.h"

namespace memest {
namespace rules {
namespace {

// attrs.reduction: "mean" (the default) and "sum" give a 0-dim loss, "none" one per target.
StatusOr<Shape> ReducedLossShape(const OpCall& c, const Shape& per_target) {
  MEMEST_ASSIGN_OR_RETURN(std::string r, StringAttr(c.op.attrs, "reduction", "mean", c.field));
  if (r != "mean" && r != "sum" && r != "none") {
    return InvalidArgument(AttrField(c, "reduction") + ": must be 'mean', 'sum' or 'none', got '" +
                           r + "'");
  }
  return r == "none" ? per_target : Shape{};
}

StatusOr<std::vector<OutputSpec>> InferCrossEntropy(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(RequireFloating(c, 0));
  MEMEST_RETURN_IF_ERROR(RequireRank(c, 0, 1, 8));
  const Shape& x = c.in(0).shape;
  const Shape& t = c.in(1).shape;
  Shape want = x;
  if (want.size() >= 2) want.erase(want.begin() + 1);
  else want.clear();
  if (IsFloating(c.in(1).dtype) ? t != x : t != want) {
    return InvalidArgument(InputField(c, 1) + ": cross_entropy targets for logits " +
                           ShapeToString(x) + " must be class indices of shape " +
                           ShapeToString(want) + " (or probabilities shaped like the logits), got " +
                           ShapeToString(t));
  }
  MEMEST_ASSIGN_OR_RETURN(int64_t f32, IntAttr(c.op.attrs, "nll_float32", 0, c.field));
  MEMEST_ASSIGN_OR_RETURN(Shape out, ReducedLossShape(c, want));
  return std::vector<OutputSpec>{{out, f32 ? DType::kFloat32 : c.in(0).dtype}};
}

// Under autocast (attrs.nll_float32) nll_loss runs on a float32 copy of the half log-probs.
bool NllFloat32(const OpCall& c) {
  return IntAttr(c.op.attrs, "nll_float32", 0, c.field).value() != 0;
}

void CrossEntropyMemory(const OpCall& c, OpMemory* m) {
  const int64_t n = Numel(c.in(0).shape);
  Alloc logp{BytesOf(c.in(0)), "log_softmax of the logits"};
  Alloc logp32{n * 4, "float32 copy of the log-probabilities (nll_loss under autocast)"};
  const bool f32 = NllFloat32(c);
  Alloc total_weight{4, "nll_loss total_weight (0-dim float32)"};
  if (!c.needs_grad(0)) {
    m->forward_temps.push_back(logp);
    if (f32) m->forward_temps.push_back(logp32);
    m->forward_temps.push_back(total_weight);
    return;
  }
  m->saved_extras.push_back(logp);  // log_softmax keeps its result; nll_loss keeps its input
  if (f32) m->saved_extras.push_back(logp32);
  m->saved_extras.push_back(total_weight);
  if (!IsFloating(c.in(1).dtype)) m->saved_inputs.push_back(1);
  m->grad_flow = {GradFlow::kFresh, GradFlow::kNone};
  m->backward_scratch_consumes_grad = true;  // NllLossBackward releases it
  const Alloc nll_grad{f32 ? n * 4 : BytesOf(c.in(0)), "nll_loss_backward gradient"};
  if (!f32) {
    m->backward_temps.push_back(nll_grad);
    return;
  }
  // Under autocast three nodes run: NllLossBackward makes its float32 gradient and lets go of the
  // float32 copy it kept; ToCopyBackward casts the gradient to the logits' dtype and the float32
  // one dies; LogSoftmaxBackward makes the logits' gradient (seen in that order on an H200 under
  // PyTorch 2.11, GPT-2 and Llama in bfloat16 autocast: docs/gpu-records.md).
  m->backward_first_temps.push_back(nll_grad);
  m->first_node_releases.push_back(1);  // logp32
  m->backward_temps.push_back(Alloc{BytesOf(c.in(0)), "its cast to the logits' dtype"});
}

// nll_loss(logp[N, C, ...], target[N, ...] int64): what cross_entropy runs after log_softmax,
// and what a traced model shows. It keeps its input (usually log_softmax's result, kept there
// too), the targets and a 0-dim float32 total_weight; its backward makes an input-sized
// gradient.
StatusOr<std::vector<OutputSpec>> InferNllLoss(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(RequireFloating(c, 0));
  MEMEST_RETURN_IF_ERROR(RequireRank(c, 0, 1, 8));
  const Shape& x = c.in(0).shape;
  Shape want = x;
  if (want.size() >= 2) want.erase(want.begin() + 1);
  else want.clear();
  if (IsFloating(c.in(1).dtype) || c.in(1).shape != want) {
    return InvalidArgument(InputField(c, 1) + ": nll_loss targets for log-probabilities " +
                           ShapeToString(x) + " must be class indices of shape " +
                           ShapeToString(want) + ", got " + ShapeToString(c.in(1).shape));
  }
  MEMEST_ASSIGN_OR_RETURN(Shape out, ReducedLossShape(c, want));
  return std::vector<OutputSpec>{{out, c.in(0).dtype}};
}

void NllLossMemory(const OpCall& c, OpMemory* m) {
  Alloc total_weight{4, "nll_loss total_weight (0-dim float32)"};
  if (!c.needs_grad(0)) {
    m->forward_temps.push_back(total_weight);
    return;
  }
  m->saved_inputs = {0, 1};
  m->saved_extras.push_back(total_weight);
  m->grad_flow = {GradFlow::kFresh, GradFlow::kNone};
}

StatusOr<std::vector<OutputSpec>> InferMse(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(RequireFloating(c, 0));
  StatusOr<Shape> s = BroadcastShapes(c.in(0).shape, c.in(1).shape);
  if (!s.ok()) return s.status().Prefixed(c.field + ".inputs: ");
  return std::vector<OutputSpec>{{{}, PromoteTypes(c.in(0).dtype, c.in(1).dtype)}};
}

// 1.13 on the CPU computes the elementwise loss into a full-size tensor and reduces into a 0-dim
// result that shares its storage: the loss keeps input-sized bytes alive as long as it lives;
// while the kernel runs it holds a second input-sized buffer (measured with the allocator's
// trace: it is freed inside the op).
void MseMemory(const OpCall& c, OpMemory* m) {
  if (c.runtime == Runtime::kCpuTorch113) {
    m->output_storage_bytes = {BytesOf(c.in(0))};
    m->forward_temps.push_back(Alloc{BytesOf(c.in(0)), "mse_loss unreduced buffer (CPU)"});
  }
  if (!c.needs_grad(0) && !c.needs_grad(1)) return;
  m->saved_inputs = {0, 1};
}

}  // namespace

void RegisterLossRules(std::vector<OpRule>* r) {
  r->push_back({"cross_entropy", 2, 2, InferCrossEntropy, CrossEntropyMemory});
  r->push_back({"mse_loss", 2, 2, InferMse, MseMemory});
  r->push_back({"nll_loss", 2, 2, InferNllLoss, NllLossMemory});
}

}  // namespace rules
}  // namespace memest
