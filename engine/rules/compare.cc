// Rules for comparisons, element-wise extrema and the running sum: eq / ne / lt / le / gt / ge
// (bool results), bitwise_and / bitwise_or, maximum / minimum, cumsum.
//
// derivatives.yaml (1.13 and 2.x): every comparison is `output_differentiability: [False]`, so
// autograd keeps nothing and no input gets a gradient through it. maximum's self and other
// gradients are both `at::where(self == other, grad / 2, grad).masked_fill_(self < other, 0)`
// (minimum and the other operand flip the comparison): both formulas read self and other, so
// autograd keeps both whenever either needs grad. cumsum keeps nothing: its gradient is
// cumsum_backward(grad, dim) = grad.flip(dim).cumsum(dim).flip(dim) (FunctionsManual.cpp),
// or grad itself when the dim has one element.
#include "engine/rules/internal.h"

namespace memest {
namespace rules {
namespace {

bool HasScalar(const OpCall& c) { return HasAttr(c.op.attrs, "scalar"); }

// The broadcast shape of a binary op's operands (or the one operand's, with attrs.scalar),
// laid out like an operand of that shape (TensorIterator's choice), in dtype `d`.
StatusOr<OutputSpec> BroadcastOutput(const OpCall& c, DType d) {
  if (c.inputs.size() == 1) {
    if (!HasScalar(c)) {
      return InvalidArgument(c.field + ".inputs: " + c.op.kind +
                             " takes two tensors, or one tensor and attrs.scalar");
    }
    MEMEST_RETURN_IF_ERROR(FloatAttr(c.op.attrs, "scalar", 0, c.field).status());
    return OutputSpec{c.in(0).shape, d, DenseStridesLike(c.in(0))};
  }
  StatusOr<Shape> out = BroadcastShapes(c.in(0).shape, c.in(1).shape);
  if (!out.ok()) return out.status().Prefixed(c.field + ".inputs: ");
  for (size_t i = 0; i < 2; ++i) {
    if (c.in(i).shape == *out) return OutputSpec{*out, d, DenseStridesLike(c.in(i))};
  }
  return OutputSpec{*out, d};
}

// eq / ne / lt / le / gt(a, b) or (a; scalar): a bool tensor, never differentiable.
StatusOr<std::vector<OutputSpec>> InferCompare(const OpCall& c) {
  MEMEST_ASSIGN_OR_RETURN(OutputSpec out, BroadcastOutput(c, DType::kBool));
  out.differentiable = false;
  return std::vector<OutputSpec>{out};
}

void CompareMemory(const OpCall& c, OpMemory* m) {
  m->grad_flow.assign(c.inputs.size(), GradFlow::kNone);
}

// bitwise_and / bitwise_or(a, b): integer or bool operands (detection's mask & mask), the
// promoted type; not differentiable (no derivatives.yaml entry: integral types only).
StatusOr<std::vector<OutputSpec>> InferBitwise(const OpCall& c) {
  if (c.inputs.size() != 2) {
    return InvalidArgument(c.field + ".inputs: " + c.op.kind + " takes two tensors");
  }
  for (size_t i = 0; i < 2; ++i) {
    if (IsFloating(c.in(i).dtype)) {
      return InvalidArgument(InputField(c, i) + ": " + c.op.kind + " takes integer or bool " +
                             "tensors, got " + std::string(DTypeName(c.in(i).dtype)));
    }
  }
  MEMEST_ASSIGN_OR_RETURN(OutputSpec out,
                          BroadcastOutput(c, PromoteTypes(c.in(0).dtype, c.in(1).dtype)));
  out.differentiable = false;
  return std::vector<OutputSpec>{out};
}

// bitwise_not(x): `~mask`, like x, for bool or integer x; not differentiable.
StatusOr<std::vector<OutputSpec>> InferBitwiseNot(const OpCall& c) {
  if (IsFloating(c.in(0).dtype)) {
    return InvalidArgument(InputField(c, 0) + ": bitwise_not takes a bool or integer tensor, got " +
                           std::string(DTypeName(c.in(0).dtype)));
  }
  return std::vector<OutputSpec>{
      {c.in(0).shape, c.in(0).dtype, DenseStridesLike(c.in(0)), -1, false}};
}

// maximum / minimum(a, b): the promoted type (a 0-dim floating tensor does not promote a
// dimensioned one of another floating type, as for add).
StatusOr<std::vector<OutputSpec>> InferExtremum(const OpCall& c) {
  if (c.inputs.size() != 2) {
    return InvalidArgument(c.field + ".inputs: " + c.op.kind + " takes two tensors");
  }
  DType d = PromoteTypes(c.in(0).dtype, c.in(1).dtype);
  if (c.in(1).shape.empty() && IsFloating(c.in(0).dtype) && IsFloating(c.in(1).dtype)) {
    d = c.in(0).dtype;
  }
  MEMEST_ASSIGN_OR_RETURN(OutputSpec out, BroadcastOutput(c, d));
  return std::vector<OutputSpec>{out};
}

// Both operands kept. Each gradient the backward makes holds, until its expression ends, the
// bool `self == other`, `grad / 2`, the where() result (the gradient itself, or for a broadcast
// operand an output-sized tensor the engine then reduces) and the bool `self < other`
// (measured on 1.13's CPU: div, eq, where, lt under MaximumBackward0). The two gradients are
// made one after the other, so the scratch is one set of temporaries, plus, for each broadcast
// operand, its output-sized where() result beyond the reduced gradient counted for it.
void ExtremumMemory(const OpCall& c, OpMemory* m) {
  const bool g0 = c.needs_grad(0), g1 = c.needs_grad(1);
  if (!g0 && !g1) return;
  m->saved_inputs = {0, 1};
  const Tensor& out = c.out(0);
  const int64_t n = Numel(out.shape);
  int64_t scratch = 2 * n + BytesOf(out);
  for (size_t i = 0; i < 2; ++i) {
    if (c.needs_grad(i) && c.in(i).shape != out.shape) {
      scratch += BytesOf(out) - Bytes(c.in(i).shape, out.dtype);
    }
  }
  m->backward_temps.push_back(Alloc{scratch, "maximum/minimum backward: ==, grad/2, where, <"});
}

// cumsum(x; dim): like x; an integral or bool x sums into int64.
StatusOr<std::vector<OutputSpec>> InferCumsum(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(RequireRank(c, 0, 1, static_cast<int>(kMaxRank)));
  MEMEST_ASSIGN_OR_RETURN(int64_t dim, IntAttr(c.op.attrs, "dim", 0, c.field));
  MEMEST_RETURN_IF_ERROR(
      NormalizeDim(dim, static_cast<int>(c.in(0).shape.size()), AttrField(c, "dim")).status());
  const DType d = IsFloating(c.in(0).dtype) ? c.in(0).dtype : DType::kInt64;
  return std::vector<OutputSpec>{{c.in(0).shape, d, DenseStridesLike(c.in(0))}};
}

// Forward: impl_func_cum_ops (ReduceOps.cpp, 1.13 and 2.x, CPU and CUDA) scans
// `self.to(result.scalar_type())`: a copy of x when the dtypes differ (measured on 1.13's CPU:
// an int32 x's int64 copy under aten::cumsum). Backward: flip, cumsum, flip, all live until the
// expression ends (measured: two input-sized tensors besides the gradient). On CUDA a scan of a
// 1-D tensor also takes cub's temporary storage, a few KiB, not counted.
void CumsumMemory(const OpCall& c, OpMemory* m) {
  const Tensor& x = c.in(0);
  if (x.dtype != c.out(0).dtype) {
    m->forward_temps.push_back(AllocOf(x.shape, c.out(0).dtype, "cumsum: input in the result's dtype"));
  }
  if (!c.needs_grad(0)) return;
  StatusOr<int64_t> dim = IntAttr(c.op.attrs, "dim", 0, c.field);
  StatusOr<int> axis = NormalizeDim(dim.ok() ? *dim : 0, static_cast<int>(x.shape.size()), "");
  if (Numel(x.shape) <= 1 || (axis.ok() && x.shape[*axis] == 1)) {
    m->grad_flow = {GradFlow::kPassThrough};
    return;
  }
  m->backward_temps.push_back(Alloc{2 * BytesOf(x), "cumsum backward: flip, cumsum"});
}

// all / any(x; dim, keepdim): a bool of the reduced shape, not differentiable (the checks
// Hugging Face's mask code branches on, as `if (mask[:, -1] == 0).all():`).
StatusOr<std::vector<OutputSpec>> InferAllAny(const OpCall& c) {
  MEMEST_ASSIGN_OR_RETURN(std::vector<OutputSpec> out, InferReduce(c));
  out[0].dtype = DType::kBool;
  return out;
}

// On the CPU the input is cast to bool first unless it is bool (or uint8) already
// (get_allany_iter: make_reduction_from_out_ty, 1.13 and 2.x; a tensor of one element is
// copied with .to(kBool) the same way); CUDA's kernel casts as it reads.
void AllAnyMemory(const OpCall& c, OpMemory* m) {
  m->grad_flow.assign(c.inputs.size(), GradFlow::kNone);
  const Tensor& x = c.in(0);
  if (c.runtime == Runtime::kCpuTorch113 && x.dtype != DType::kBool && x.dtype != DType::kUInt8 &&
      Numel(x.shape) > 0) {
    m->forward_temps.push_back(AllocOf(x.shape, DType::kBool, "all/any: the input cast to bool"));
  }
}

}  // namespace

void RegisterCompareRules(std::vector<OpRule>* r) {
  for (const char* kind : {"eq", "ne", "lt", "le", "gt", "ge"}) {
    r->push_back({kind, 1, 2, InferCompare, CompareMemory});
  }
  r->push_back({"bitwise_and", 2, 2, InferBitwise, CompareMemory});
  r->push_back({"bitwise_or", 2, 2, InferBitwise, CompareMemory});
  r->push_back({"bitwise_not", 1, 1, InferBitwiseNot, CompareMemory});
  r->push_back({"maximum", 2, 2, InferExtremum, ExtremumMemory});
  r->push_back({"minimum", 2, 2, InferExtremum, ExtremumMemory});
  r->push_back({"cumsum", 1, 1, InferCumsum, CumsumMemory});
  r->push_back({"all", 1, 1, InferAllAny, AllAnyMemory});
  r->push_back({"any", 1, 1, InferAllAny, AllAnyMemory});
}

}  // namespace rules
}  // namespace memest
