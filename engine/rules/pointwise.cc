// Rules for pointwise ops: activations, unary math, binary arithmetic with broadcasting,
// masking, dropout and dtype casts.
//
// What autograd saves (derivatives.yaml): relu, sigmoid, tanh, exp, rsqrt, sqrt, softmax and
// log_softmax save their result; gelu, silu, log1p and pow save their input; mul saves each
// operand when the other needs grad; div saves the divisor, and the dividend too when the
// divisor needs grad; add, sub, neg and ops with a Python scalar save nothing that costs
// memory. native_dropout (CUDA, 0 < p < 1) saves a bool mask. masked_fill and where save the
// mask. Broadcast inputs get their gradient by reducing an output-sized product (mul, div) or
// the incoming gradient (add, sub) to their shape.
#include <algorithm>
#include <cmath>

#include "engine/ir/text.h"
#include "engine/rules/internal.h"

namespace memest {
namespace rules {
namespace {

bool HasScalar(const OpCall& c) { return HasAttr(c.op.attrs, "scalar"); }

StatusOr<std::vector<OutputSpec>> InferUnary(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(RequireFloating(c, 0));
  return std::vector<OutputSpec>{Like(c.in(0))};
}

// In place too, the result is the input's storage, as overwritten.
void SaveOutput(const OpCall& c, OpMemory* m) {
  if (c.needs_grad(0)) m->saved_outputs.push_back(0);
}
void SaveNothing(const OpCall& c, OpMemory* m) {}

// softmax / log_softmax keep their result; _softmax_backward_data works on a dense gradient.
// `safe` is PyTorch 2.5+'s _safe_softmax (the math SDPA path's): softmax, then rows whose
// inputs are all -inf are zeroed in place, through isneginf (a bool per element), all() over the
// dim (a bool per row) and a 0-dim zero; those are forward scratch. (Measured on 2.15's CPU.)
void SoftmaxMemory(const OpCall& c, OpMemory* m) {
  SaveOutput(c, m);
  m->backward_needs_dense_grad = true;
  StatusOr<int64_t> safe = IntAttr(c.op.attrs, "safe", 0, c.field);
  StatusOr<int64_t> dim = IntAttr(c.op.attrs, "dim", -1, c.field);
  if (!safe.ok() || *safe == 0 || !dim.ok()) return;
  const Shape& x = c.in(0).shape;
  StatusOr<int> axis = NormalizeDim(*dim, static_cast<int>(x.size()), "");
  const int64_t extent = x.empty() || !axis.ok() ? 1 : x[*axis];
  const int64_t numel = Numel(x);
  m->forward_temps.push_back(Alloc{numel, "isneginf mask"});
  m->forward_temps.push_back(Alloc{extent > 0 ? numel / extent : 0, "rows fully masked"});
  m->forward_temps.push_back(Alloc{DTypeSize(c.out(0).dtype), "zero"});
}

// Backward formulas that form `n` input-sized products before the gradient:
// rsqrt: -0.5 * grad * result.pow(3) (2); sqrt: grad / (2 * result) (1); log1p: grad / (self + 1) (1).
template <int n>
void SaveOutputWithBackwardProducts(const OpCall& c, OpMemory* m) {
  if (!c.needs_grad(0)) return;
  m->saved_outputs.push_back(0);
  m->backward_temps.push_back(Alloc{n * BytesOf(c.in(0)), "backward products"});
}
// log1p: grad / (self + 1); log2: grad / (self * ln 2): one input-sized product.
void Log1pMemory(const OpCall& c, OpMemory* m) {
  if (!c.needs_grad(0)) return;
  m->saved_inputs.push_back(0);
  m->backward_temps.push_back(Alloc{BytesOf(c.in(0)), "backward: self + 1, self * ln 2"});
}

// ---- activations that may run in place (attrs.inplace=1: relu_, silu_, hardtanh_, ...) ----

StatusOr<bool> InplaceAttr(const OpCall& c) {
  MEMEST_ASSIGN_OR_RETURN(int64_t inplace, IntAttr(c.op.attrs, "inplace", 0, c.field));
  if (inplace != 0 && inplace != 1) {
    return InvalidArgument(AttrField(c, "inplace") + ": must be 0 or 1, got " +
                           std::to_string(inplace));
  }
  return inplace == 1;
}
bool InPlace(const OpCall& c) { return !c.outputs.empty() && c.out(0).alias_of >= 0; }

// In place, the output is the input's storage.
StatusOr<std::vector<OutputSpec>> InferActivation(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(RequireFloating(c, 0));
  MEMEST_ASSIGN_OR_RETURN(bool inplace, InplaceAttr(c));
  if (inplace) return std::vector<OutputSpec>{ViewOf(0, c.in(0).shape, c.in(0).dtype, c.in(0).strides)};
  return std::vector<OutputSpec>{Like(c.in(0))};
}

StatusOr<std::vector<OutputSpec>> InferRelu(const OpCall& c) {
  MEMEST_ASSIGN_OR_RETURN(bool inplace, InplaceAttr(c));
  OutputSpec out = Like(c.in(0));
  if (inplace) out = ViewOf(0, c.in(0).shape, c.in(0).dtype, c.in(0).strides);
  return std::vector<OutputSpec>{out};
}

// A formula that reads `self` (silu, hardtanh, hardswish, hardsigmoid): out of place it keeps
// the input; in place autograd keeps a clone of the input taken before the op overwrites it
// (gen_variable_type.py, save_variables: `original_self = self.clone()`).
void SaveSelf(const OpCall& c, OpMemory* m) {
  if (!c.needs_grad(0)) return;
  if (InPlace(c)) {
    m->saved_extras.push_back(Alloc{BytesOf(c.in(0)), "clone of the original self"});
  } else {
    m->saved_inputs.push_back(0);
  }
}

StatusOr<std::vector<OutputSpec>> InferHardtanh(const OpCall& c) {
  MEMEST_ASSIGN_OR_RETURN(double lo, FloatAttr(c.op.attrs, "min_val", -1.0, c.field));
  MEMEST_ASSIGN_OR_RETURN(double hi, FloatAttr(c.op.attrs, "max_val", 1.0, c.field));
  if (lo > hi) {
    return InvalidArgument(AttrField(c, "min_val") + ": " + std::to_string(lo) +
                           " is greater than max_val " + std::to_string(hi));
  }
  return InferActivation(c);
}

StatusOr<std::vector<OutputSpec>> InferGelu(const OpCall& c) {
  MEMEST_ASSIGN_OR_RETURN(std::string approx, StringAttr(c.op.attrs, "approximate", "none", c.field));
  if (approx != "none" && approx != "tanh") {
    return InvalidArgument(AttrField(c, "approximate") + ": must be 'none' or 'tanh', got " +
                           Quote(approx));
  }
  return InferActivation(c);  // inplace=1: _addmm_activation's gelu_ (the encoder fast path)
}

StatusOr<std::vector<OutputSpec>> InferPow(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(FloatAttr(c.op.attrs, "exponent", 2.0, c.field).status());
  return InferUnary(c);
}

void PowMemory(const OpCall& c, OpMemory* m) {
  if (!c.needs_grad(0)) return;
  m->saved_inputs.push_back(0);
  // grad * exponent * x.pow(exponent - 1): two input-sized products live at once.
  m->backward_temps.push_back(Alloc{2 * BytesOf(c.in(0)), "pow backward products"});
}

StatusOr<std::vector<OutputSpec>> InferSoftmax(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(RequireFloating(c, 0));
  MEMEST_ASSIGN_OR_RETURN(int64_t dim, IntAttr(c.op.attrs, "dim", -1, c.field));
  MEMEST_RETURN_IF_ERROR(
      NormalizeDim(dim, static_cast<int>(c.in(0).shape.size()), AttrField(c, "dim")).status());
  MEMEST_ASSIGN_OR_RETURN(int64_t h2f, IntAttr(c.op.attrs, "half_to_float", 0, c.field));
  // inplace=1: _softmax_out(x, x) (1.13's native_multi_head_attention, on its scores).
  MEMEST_ASSIGN_OR_RETURN(bool inplace, InplaceAttr(c));
  if (inplace && h2f) {
    return InvalidArgument(AttrField(c, "inplace") + ": a softmax in place keeps its input's "
                           "dtype; half_to_float needs a new output");
  }
  if (inplace) {
    return std::vector<OutputSpec>{ViewOf(0, c.in(0).shape, c.in(0).dtype, c.in(0).strides)};
  }
  OutputSpec out = Like(c.in(0));
  if (h2f) out.dtype = DType::kFloat32;
  return std::vector<OutputSpec>{out};
}

StatusOr<double> DropoutP(const OpCall& c) {
  MEMEST_ASSIGN_OR_RETURN(double p, FloatAttr(c.op.attrs, "p", 0.1, c.field));
  if (p < 0 || p > 1) {
    return InvalidArgument(AttrField(c, "p") + ": must be in [0, 1], got " + std::to_string(p));
  }
  return p;
}

StatusOr<std::vector<OutputSpec>> InferDropout(const OpCall& c) {
  MEMEST_ASSIGN_OR_RETURN(double p, DropoutP(c));
  MEMEST_ASSIGN_OR_RETURN(bool inplace, InplaceAttr(c));
  if (p == 0.0 || inplace) {  // at::dropout returns its input when p == 0
    return std::vector<OutputSpec>{ViewOf(0, c.in(0).shape, c.in(0).dtype, c.in(0).strides)};
  }
  return InferUnary(c);
}

// CUDA: native_dropout keeps a bool mask. PyTorch 1.13 on the CPU, and in place (dropout_,
// which is never the fused kernel) on both: _dropout_impl draws a noise tensor in the input's
// dtype (bernoulli_, then div_ by 1-p) and returns input * noise (mul_ in place), which keeps
// the noise.
void DropoutMemory(const OpCall& c, OpMemory* m) {
  StatusOr<double> p = DropoutP(c);
  if (!p.ok() || *p == 0.0) return;
  const bool noise = c.runtime == Runtime::kCpuTorch113 || InPlace(c);
  Alloc mask = noise ? AllocOf(c.in(0).shape, c.in(0).dtype, "dropout noise")
                     : AllocOf(c.in(0).shape, DType::kBool, "dropout mask");
  (c.needs_grad(0) ? m->saved_extras : m->forward_temps).push_back(mask);
}

// torchvision.ops.stochastic_depth: noise = empty([N, 1, ...] for mode "row", [1, ...] for
// "batch").bernoulli_(1 - p), div_(1 - p) unless p is 1, then input * noise; mul keeps the
// noise (input's dtype). Eval and p = 0 return the input.
StatusOr<std::vector<OutputSpec>> InferStochasticDepth(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(RequireFloating(c, 0));
  MEMEST_RETURN_IF_ERROR(RequireRank(c, 0, 1, static_cast<int>(kMaxRank)));
  MEMEST_ASSIGN_OR_RETURN(double p, DropoutP(c));
  MEMEST_ASSIGN_OR_RETURN(std::string mode, StringAttr(c.op.attrs, "mode", "row", c.field));
  if (mode != "row" && mode != "batch") {
    return InvalidArgument(AttrField(c, "mode") + ": must be 'row' or 'batch', got '" + mode + "'");
  }
  if (p == 0.0) return std::vector<OutputSpec>{ViewOf(0, c.in(0).shape, c.in(0).dtype, c.in(0).strides)};
  return std::vector<OutputSpec>{Like(c.in(0))};
}

void StochasticDepthMemory(const OpCall& c, OpMemory* m) {
  StatusOr<double> p = DropoutP(c);
  StatusOr<std::string> mode = StringAttr(c.op.attrs, "mode", "row", c.field);
  if (!p.ok() || *p == 0.0 || !mode.ok()) return;
  Shape noise(c.in(0).shape.size(), 1);
  if (*mode == "row") noise[0] = c.in(0).shape[0];
  const Alloc a = AllocOf(noise, c.in(0).dtype, "stochastic depth noise");
  (c.needs_grad(0) ? m->saved_extras : m->forward_temps).push_back(a);
}

// ---- binary arithmetic ----

StatusOr<std::vector<OutputSpec>> InferBinary(const OpCall& c) {
  if (c.inputs.size() == 1) {
    if (!HasScalar(c)) {
      return InvalidArgument(c.field + ".inputs: " + c.op.kind +
                             " takes two tensors, or one tensor and attrs.scalar");
    }
    MEMEST_RETURN_IF_ERROR(FloatAttr(c.op.attrs, "scalar", 0, c.field).status());
    DType d = c.in(0).dtype;
    if (!IsFloating(d) && c.op.kind == "div") d = DType::kFloat32;
    return std::vector<OutputSpec>{{c.in(0).shape, d, DenseStridesLike(c.in(0))}};
  }
  StatusOr<Shape> out = BroadcastShapes(c.in(0).shape, c.in(1).shape);
  if (!out.ok()) return out.status().Prefixed(c.field + ".inputs: ");
  DType d = PromoteTypes(c.in(0).dtype, c.in(1).dtype);
  // A 0-dim tensor does not promote a dimensioned floating tensor of another float type.
  if (c.in(1).shape.empty() && IsFloating(c.in(0).dtype) && IsFloating(c.in(1).dtype)) {
    d = c.in(0).dtype;
  }
  if (c.op.kind == "div" && !IsFloating(d)) d = DType::kFloat32;
  // TensorIterator lays the output out in the memory order of an operand of its shape.
  for (size_t i = 0; i < 2; ++i) {
    if (c.in(i).shape == *out) return std::vector<OutputSpec>{{*out, d, DenseStridesLike(c.in(i))}};
  }
  return std::vector<OutputSpec>{{*out, d}};
}

bool Broadcast(const OpCall& c, size_t i) { return c.in(i).shape != c.out(0).shape; }

// The gradients of the broadcast operands `reduced` are summed over the dims each was broadcast
// along, one after another. Where those are leading dims (a bias or a norm's weight, [C] against
// [N.., C]) the sum is over rows, with its staging on CUDA (RowSumScratchTemps): the largest of
// them is what is live at once.
void BroadcastSumScratch(const OpCall& c, const std::vector<size_t>& reduced, OpMemory* m) {
  const Shape& out = c.out(0).shape;
  OpMemory largest;
  int64_t largest_bytes = 0;
  for (size_t i : reduced) {
    const Shape& in = c.in(i).shape;
    size_t first = 0;
    while (first < in.size() && in[first] == 1) ++first;
    const size_t n = in.size() - first;
    if (n == 0 || n > out.size() ||
        !std::equal(in.begin() + first, in.end(), out.end() - static_cast<std::ptrdiff_t>(n))) {
      continue;  // broadcast along inner dims too: not a row sum
    }
    const int64_t cols = Numel(Shape(in.begin() + first, in.end()));
    if (cols <= 0) continue;
    OpMemory one;
    RowSumScratchTemps(c, Numel(out) / cols, cols, c.out(0).dtype, &one);
    int64_t bytes = 0;
    for (const Alloc& a : one.backward_temps) bytes += a.bytes;
    if (bytes > largest_bytes) largest = std::move(one), largest_bytes = bytes;
  }
  for (const Alloc& a : largest.backward_temps) m->backward_temps.push_back(a);
}

// add / sub: the gradient of an operand of the output's shape and dtype is the incoming
// gradient itself (sub negates it for the second operand); a broadcast operand gets a fresh,
// reduced one.
void AddSubMemory(const OpCall& c, OpMemory* m) {
  std::vector<size_t> reduced;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const bool same = !Broadcast(c, i) && c.in(i).dtype == c.out(0).dtype;
    const bool negated = c.op.kind == "sub" && i == 1;
    m->grad_flow.push_back(same && !negated ? GradFlow::kPassThrough : GradFlow::kFresh);
    if (c.needs_grad(i) && Broadcast(c, i)) reduced.push_back(i);
  }
  BroadcastSumScratch(c, reduced, m);
}

// A broadcast operand's gradient is an output-sized product reduced to its shape. With two
// broadcast operands both products are formed first, then reduced one at a time, the first
// product freed before the second reduction: at the peak, both products and the first reduced
// gradient. The fresh gradients count in full, so the scratch is the products less the second
// reduced gradient.
void BroadcastProducts(const OpCall& c, OpMemory* m) {
  if (c.inputs.size() != 2) return;
  std::vector<size_t> reduced;
  for (size_t i = 0; i < 2; ++i) {
    if (c.needs_grad(i) && Broadcast(c, i)) reduced.push_back(i);
  }
  if (reduced.empty()) return;
  int64_t scratch = static_cast<int64_t>(reduced.size()) * BytesOf(c.out(0));
  if (reduced.size() == 2) scratch -= BytesOf(c.in(reduced[1]));
  m->backward_temps.push_back(Alloc{scratch, "output-sized products before sum_to"});
  BroadcastSumScratch(c, reduced, m);
}

void MulMemory(const OpCall& c, OpMemory* m) {
  if (c.inputs.size() == 1) return;  // scalar: nothing saved
  SaveInputIf(m, c.needs_grad(1), 0);
  SaveInputIf(m, c.needs_grad(0), 1);
  BroadcastProducts(c, m);
}

void DivMemory(const OpCall& c, OpMemory* m) {
  if (c.inputs.size() == 1) return;
  SaveInputIf(m, c.needs_grad(0) || c.needs_grad(1), 1);
  SaveInputIf(m, c.needs_grad(1), 0);
  BroadcastProducts(c, m);
  // DivBackward0 forms the divisor's gradient first, -grad * a / b / b, holding three
  // output-sized intermediates besides it; frees them; then the dividend's, grad / b. Both
  // fresh gradients count in full, so the scratch is two intermediates when both are needed.
  if (c.needs_grad(1)) {
    const int n = c.needs_grad(0) ? 2 : 3;
    m->backward_temps.push_back(Alloc{n * BytesOf(c.out(0)), "div backward: -grad*a/b/b"});
  }
}

// In place: the output is the first operand's storage.
StatusOr<std::vector<OutputSpec>> InferInplaceBinary(const OpCall& c) {
  MEMEST_ASSIGN_OR_RETURN(std::vector<OutputSpec> out, InferBinary(c));
  if (out[0].shape != c.in(0).shape) {
    return InvalidArgument(c.field + ".inputs: " + c.op.kind + " cannot broadcast its first " +
                           "operand " + ShapeToString(c.in(0).shape) + " to " +
                           ShapeToString(out[0].shape) + " in place");
  }
  return std::vector<OutputSpec>{ViewOf(0, c.in(0).shape, c.in(0).dtype, c.in(0).strides)};
}

void InplaceAddMemory(const OpCall& c, OpMemory* m) {
  m->grad_flow.push_back(GradFlow::kPassThrough);
  if (c.inputs.size() == 2) {
    m->grad_flow.push_back(Broadcast(c, 1) ? GradFlow::kFresh : GradFlow::kPassThrough);
    if (c.needs_grad(1) && Broadcast(c, 1)) BroadcastSumScratch(c, {1}, m);
  }
}

void InplaceMulMemory(const OpCall& c, OpMemory* m) {
  if (c.inputs.size() == 1) return;
  SaveInputIf(m, c.needs_grad(0), 1);
  if (c.needs_grad(1)) {  // the original self is needed: autograd keeps a clone
    m->saved_extras.push_back(Alloc{BytesOf(c.in(0)), "clone of the original self"});
  }
}

// a.div_(b) (Tensor divisor; a Python number is `div` with attrs.scalar): b is kept for a's
// gradient, and when b needs its own, -grad * a / b / b, the original a too, which autograd
// clones before the write (measured on 1.13's CPU: b and an a-sized copy saved). Backward as
// div's.
void InplaceDivMemory(const OpCall& c, OpMemory* m) {
  if (c.inputs.size() == 1) return;
  SaveInputIf(m, c.needs_grad(0) || c.needs_grad(1), 1);
  if (c.needs_grad(1)) {
    m->saved_extras.push_back(Alloc{BytesOf(c.in(0)), "clone of the original self"});
    m->backward_temps.push_back(Alloc{(c.needs_grad(0) ? 2 : 3) * BytesOf(c.out(0)),
                                      "div backward: -grad*a/b/b"});
  }
  BroadcastProducts(c, m);
}

StatusOr<std::vector<OutputSpec>> InferMaskedFill(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(FloatAttr(c.op.attrs, "value", 0, c.field).status());
  StatusOr<Shape> out = BroadcastShapes(c.in(0).shape, c.in(1).shape);
  if (!out.ok() || *out != c.in(0).shape) {
    return InvalidArgument(InputField(c, 1) + ": mask " + ShapeToString(c.in(1).shape) +
                           " does not broadcast to " + ShapeToString(c.in(0).shape));
  }
  return std::vector<OutputSpec>{Like(c.in(0))};
}

void SaveMask(const OpCall& c, OpMemory* m) {
  if (c.needs_grad(0)) m->saved_inputs.push_back(1);
}

StatusOr<std::vector<OutputSpec>> InferWhere(const OpCall& c) {
  MEMEST_ASSIGN_OR_RETURN(Shape ab, BroadcastShapes(c.in(1).shape, c.in(2).shape));
  StatusOr<Shape> out = BroadcastShapes(c.in(0).shape, ab);
  if (!out.ok()) return out.status().Prefixed(c.field + ".inputs: ");
  return std::vector<OutputSpec>{{*out, PromoteTypes(c.in(1).dtype, c.in(2).dtype)}};
}

void WhereMemory(const OpCall& c, OpMemory* m) {
  if (c.needs_grad(1) || c.needs_grad(2)) m->saved_inputs.push_back(0);
  m->grad_flow = {GradFlow::kNone, GradFlow::kFresh, GradFlow::kFresh};
}

StatusOr<std::vector<OutputSpec>> InferTo(const OpCall& c) {
  MEMEST_ASSIGN_OR_RETURN(std::string name, StringAttr(c.op.attrs, "dtype", "", c.field));
  StatusOr<DType> d = ParseDType(name);
  if (!d.ok()) return d.status().Prefixed(AttrField(c, "dtype") + ": ");
  if (*d == c.in(0).dtype) {
    return std::vector<OutputSpec>{ViewOf(0, c.in(0).shape, *d, c.in(0).strides)};
  }
  return std::vector<OutputSpec>{{c.in(0).shape, *d, DenseStridesLike(c.in(0))}};
}

}  // namespace

void RegisterPointwiseRules(std::vector<OpRule>* r) {
  r->push_back({"relu", 1, 1, InferRelu, SaveOutput});
  r->push_back({"gelu", 1, 1, InferGelu, SaveSelf});
  r->push_back({"silu", 1, 1, InferActivation, SaveSelf});
  r->push_back({"hardtanh", 1, 1, InferHardtanh, SaveSelf});
  r->push_back({"hardswish", 1, 1, InferActivation, SaveSelf});
  r->push_back({"hardsigmoid", 1, 1, InferActivation, SaveSelf});
  r->push_back({"sigmoid", 1, 1, InferActivation, SaveOutput});
  r->push_back({"tanh", 1, 1, InferActivation, SaveOutput});
  r->push_back({"exp", 1, 1, InferUnary, SaveOutput});
  r->push_back({"rsqrt", 1, 1, InferUnary, SaveOutputWithBackwardProducts<2>});
  r->push_back({"sqrt", 1, 1, InferUnary, SaveOutputWithBackwardProducts<1>});
  r->push_back({"log1p", 1, 1, InferUnary, Log1pMemory});
  r->push_back({"log2", 1, 1, InferUnary, Log1pMemory});
  r->push_back({"neg", 1, 1, InferUnary, SaveNothing});
  r->push_back({"floor", 1, 1, InferUnary, SaveNothing});  // zeros_like(grad)
  r->push_back({"pow", 1, 1, InferPow, PowMemory});
  r->push_back({"softmax", 1, 1, InferSoftmax, SoftmaxMemory});
  r->push_back({"log_softmax", 1, 1, InferSoftmax, SoftmaxMemory});
  r->push_back({"dropout", 1, 1, InferDropout, DropoutMemory, /*identity_in_eval=*/true});
  r->push_back({"stochastic_depth", 1, 1, InferStochasticDepth, StochasticDepthMemory,
                /*identity_in_eval=*/true});
  r->push_back({"add", 1, 2, InferBinary, AddSubMemory});
  r->push_back({"sub", 1, 2, InferBinary, AddSubMemory});
  r->push_back({"mul", 1, 2, InferBinary, MulMemory});
  r->push_back({"div", 1, 2, InferBinary, DivMemory});
  r->push_back({"add_", 1, 2, InferInplaceBinary, InplaceAddMemory});
  r->push_back({"mul_", 1, 2, InferInplaceBinary, InplaceMulMemory});
  r->push_back({"div_", 1, 2, InferInplaceBinary, InplaceDivMemory});
  r->push_back({"masked_fill", 2, 2, InferMaskedFill, SaveMask});
  r->push_back({"where", 3, 3, InferWhere, WhereMemory});
  r->push_back({"to", 1, 1, InferTo, SaveNothing});
}

}  // namespace rules
}  // namespace memest
