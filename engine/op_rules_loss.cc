// Rules for losses and the fused attention op.
//
// cross_entropy = log_softmax(x, dim, x.dtype) + nll_loss: log_softmax keeps its [N, C] result,
// nll_loss its input (the same tensor; under autocast a float32 copy of it), its targets and a
// 0-dim total_weight, whatever the reduction (reduction="none" returns one loss per target); backward forms nll_loss_backward's [N, C] gradient, then
// _log_softmax_backward_data's. mse_loss keeps both operands. scaled_dot_product_attention is
// modelled in its math form (_scaled_dot_product_attention_math): q and k^T are each scaled
// by sqrt(scale) into new tensors that bmm keeps, the causal mask is built as an [L, S] bool
// and float pair, softmax keeps its [.., L, S] result, dropout its bool mask and output.
#include <algorithm>

#include "engine/op_rules_internal.h"

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
  // nll_loss_backward's [N, C] gradient (float32 under autocast, then cast back to the logits'
  // dtype for _log_softmax_backward_data).
  m->backward_temps.push_back(Alloc{f32 ? n * 4 : BytesOf(c.in(0)), "nll_loss_backward gradient"});
  if (f32) m->backward_temps.push_back(Alloc{BytesOf(c.in(0)), "its cast to the logits' dtype"});
  m->grad_flow = {GradFlow::kFresh, GradFlow::kNone};
  m->backward_scratch_consumes_grad = true;  // NllLossBackward releases it
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

StatusOr<std::vector<OutputSpec>> InferSdpa(const OpCall& c) {
  for (size_t i = 0; i < 3; ++i) {
    MEMEST_RETURN_IF_ERROR(RequireFloating(c, i));
    MEMEST_RETURN_IF_ERROR(RequireRank(c, i, 2, 8));
  }
  const Shape& q = c.in(0).shape;
  const Shape& k = c.in(1).shape;
  const Shape& v = c.in(2).shape;
  if (q.back() != k.back() || k[k.size() - 2] != v[v.size() - 2]) {
    return InvalidArgument(c.field + ".inputs: attention shapes q " + ShapeToString(q) + ", k " +
                           ShapeToString(k) + ", v " + ShapeToString(v) + " do not match");
  }
  MEMEST_ASSIGN_OR_RETURN(double p, FloatAttr(c.op.attrs, "dropout_p", 0.0, c.field));
  if (p < 0 || p >= 1) return InvalidArgument(AttrField(c, "dropout_p") + ": must be in [0, 1)");
  MEMEST_RETURN_IF_ERROR(IntAttr(c.op.attrs, "is_causal", 0, c.field).status());
  MEMEST_RETURN_IF_ERROR(IntAttr(c.op.attrs, "fused", 0, c.field).status());
  if (c.inputs.size() == 4) MEMEST_RETURN_IF_ERROR(RequireRank(c, 3, 2, 8));  // attn_mask
  // The math form materialises [.., L, S] scores (and an [L, S] causal mask): they must be
  // representable, which bounds every scratch SdpaMemory forms from them.
  Shape scores(q.begin(), q.end() - 1);
  scores.push_back(k[k.size() - 2]);
  MEMEST_RETURN_IF_ERROR(
      CheckedBytes(scores, c.in(0).dtype, c.field + ": its attention scores").status());
  Shape out = q;
  out.back() = v.back();
  OutputSpec spec{out, c.in(0).dtype};
  if (IntAttr(c.op.attrs, "fused", 0, c.field).value()) {
    // The fused kernels allocate the output in the query's memory layout (measured on 2.15's
    // CPU: nn.MultiheadAttention's permute(2, 0, 1, 3).contiguous() of it then copies nothing).
    Tensor like = c.in(0);
    like.shape = out;
    spec.strides = DenseStridesLike(like);
  }
  return std::vector<OutputSpec>{spec};
}

// F.scaled_dot_product_attention as PyTorch 2.x dispatches it (attr fused; what memest.trace
// records): a fused kernel keeps q, k, v, the mask, the output and a float32 logsumexp per query
// row instead of the [L, S] probabilities. On the CPU (runtime cpu-1.13, which has no SDPA of
// its own: a fused op comes from a 2.x trace) that is _scaled_dot_product_flash_attention_for_cpu,
// taken unless dropout is on (then the math path). On CUDA: flash attention for half inputs
// without a mask (logsumexp [.., L]), the memory-efficient kernel otherwise (logsumexp padded to
// a multiple of 32 rows), both keeping the dropout RNG's seed and offset.
bool FusedSdpa(const OpCall& c, OpMemory* m) {
  const int64_t fused = IntAttr(c.op.attrs, "fused", 0, c.field).value();
  const double p = FloatAttr(c.op.attrs, "dropout_p", 0.0, c.field).value();
  const bool cpu = c.runtime == Runtime::kCpuTorch113;
  if (!fused || (cpu && p > 0 && c.grad_enabled)) return false;
  const Tensor& q = c.in(0);
  const bool mask = c.inputs.size() == 4;
  const bool half = q.dtype == DType::kFloat16 || q.dtype == DType::kBFloat16;
  const bool flash = cpu || (half && !mask && q.shape.back() <= 256);
  Shape rows(q.shape.begin(), q.shape.end() - 1);  // [.., L]
  if (!flash) rows.back() = (rows.back() + 31) / 32 * 32;
  const Alloc lse = AllocOf(rows, DType::kFloat32, "logsumexp");
  const bool grad = c.needs_grad(0) || c.needs_grad(1) || c.needs_grad(2);
  if (!grad) {
    m->forward_temps.push_back(lse);
    return true;
  }
  m->saved_inputs = {0, 1, 2};
  if (mask) m->saved_inputs.push_back(3);
  m->saved_outputs.push_back(0);
  m->saved_extras.push_back(lse);
  if (!cpu && p > 0) {
    m->saved_extras.push_back(Alloc{8, "philox seed"});
    m->saved_extras.push_back(Alloc{8, "philox offset"});
  }
  return true;
}

void SdpaMemory(const OpCall& c, OpMemory* m) {
  if (FusedSdpa(c, m)) return;
  const Tensor& q = c.in(0);
  const Tensor& k = c.in(1);
  Shape scores(q.shape.begin(), q.shape.end() - 1);
  scores.push_back(k.shape[k.shape.size() - 2]);
  const int64_t L = q.shape[q.shape.size() - 2], S = scores.back();
  const int64_t score_bytes = Bytes(scores, q.dtype);
  const double p = FloatAttr(c.op.attrs, "dropout_p", 0.0, c.field).value();
  const bool causal = IntAttr(c.op.attrs, "is_causal", 0, c.field).value() != 0;
  const bool grad = c.needs_grad(0) || c.needs_grad(1) || c.needs_grad(2);
  if (causal) {
    m->forward_temps.push_back(Alloc{L * S, "causal mask (bool)"});
    m->forward_temps.push_back(Alloc{L * S * DTypeSize(q.dtype), "causal mask (additive)"});
  }
  Alloc q_scaled{BytesOf(q), "q * sqrt(scale)"};
  Alloc k_scaled{BytesOf(k), "k^T * sqrt(scale)"};
  Alloc probs{score_bytes, "softmax(scores)"};
  if (!grad) {
    for (Alloc a : {q_scaled, k_scaled, probs}) m->forward_temps.push_back(a);
    m->forward_temps.push_back(Alloc{score_bytes, "scores"});
    return;
  }
  m->saved_extras = {q_scaled, k_scaled, probs};
  m->saved_inputs.push_back(2);
  if (p > 0) {
    m->saved_extras.push_back(Alloc{Numel(scores), "dropout mask"});
    m->saved_extras.push_back(Alloc{score_bytes, "dropout(softmax)"});
  } else {
    m->forward_temps.push_back(Alloc{score_bytes, "scores before softmax"});
  }
  m->backward_temps.push_back(Alloc{2 * score_bytes, "grad of probabilities and scores"});
}

}  // namespace

void RegisterLossRules(std::vector<OpRule>* r) {
  r->push_back({"cross_entropy", 2, 2, InferCrossEntropy, CrossEntropyMemory});
  r->push_back({"mse_loss", 2, 2, InferMse, MseMemory});
  r->push_back({"nll_loss", 2, 2, InferNllLoss, NllLossMemory});
  r->push_back({"scaled_dot_product_attention", 3, 4, InferSdpa, SdpaMemory});
}

}  // namespace rules
}  // namespace memest
