// Rules for ops that select elements: nonzero, topk, sort, the whole-tensor max, and
// index_put_ (x[idx] = values in place). Detection models run them on boxes and scores.
//
// derivatives.yaml (1.13 and 2.x): nonzero is `output_differentiability: [False]`; topk and
// sort keep their indices output, and their gradient is value_selecting_reduction_backward
// (zeros of self's sizes, the incoming gradient scattered in at the indices: a fresh tensor);
// max(self) keeps self and its result, its gradient is evenly_distribute_backward;
// index_put_ keeps its indices, self's gradient is `grad.index_put(indices, zeros_like(values))`
// (accumulate: grad itself), values' is `grad.index(indices)`.
//
// How many elements nonzero finds is the data's: a traced graph carries the count it saw
// (attrs.count), as it carries nms's (engine/rules/detection.cc).
#include "engine/rules/internal.h"

namespace memest {
namespace rules {
namespace {

// nonzero(x; count): int64 [count, rank of x]; count at most numel(x).
StatusOr<std::vector<OutputSpec>> InferNonzero(const OpCall& c) {
  MEMEST_ASSIGN_OR_RETURN(int64_t count, IntAttr(c.op.attrs, "count", -1, c.field));
  const int64_t n = Numel(c.in(0).shape);
  if (count < 0 || count > n) {
    return InvalidArgument(AttrField(c, "count") + ": the elements found, in [0, " +
                           std::to_string(n) + "] for " + ShapeToString(c.in(0).shape) +
                           ", got " + std::to_string(count));
  }
  const int64_t rank = static_cast<int64_t>(c.in(0).shape.size());
  return std::vector<OutputSpec>{{{count, rank}, DType::kInt64, {}, -1, false}};
}


// The dim of a topk / sort, normalised.
StatusOr<int> SelectDim(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(RequireRank(c, 0, 1, static_cast<int>(kMaxRank)));
  MEMEST_ASSIGN_OR_RETURN(int64_t dim, IntAttr(c.op.attrs, "dim", -1, c.field));
  return NormalizeDim(dim, static_cast<int>(c.in(0).shape.size()), AttrField(c, "dim"));
}

// topk(x; k, dim=-1, largest=1, sorted=1) -> (values, int64 indices), k along dim.
StatusOr<std::vector<OutputSpec>> InferTopk(const OpCall& c) {
  MEMEST_ASSIGN_OR_RETURN(int d, SelectDim(c));
  MEMEST_ASSIGN_OR_RETURN(int64_t k, IntAttr(c.op.attrs, "k", -1, c.field));
  const Shape& x = c.in(0).shape;
  if (k < 0 || k > x[d]) {
    return InvalidArgument(AttrField(c, "k") + ": must be in [0, " + std::to_string(x[d]) +
                           "] (dim " + std::to_string(d) + " of " + ShapeToString(x) + "), got " +
                           std::to_string(k));
  }
  Shape out = x;
  out[d] = k;
  return std::vector<OutputSpec>{{out, c.in(0).dtype}, {out, DType::kInt64, {}, -1, false}};
}

// sort(x; dim=-1, descending=0) -> (values, int64 indices) of x's shape.
StatusOr<std::vector<OutputSpec>> InferSort(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(SelectDim(c).status());
  const Shape& x = c.in(0).shape;
  return std::vector<OutputSpec>{{x, c.in(0).dtype}, {x, DType::kInt64, {}, -1, false}};
}

// Indices kept for backward. Measured on 1.13's CPU: topk makes only its outputs; sort also
// makes an int64 arange over the sorted dim that it copies into every row's indices
// (_fill_indices; freed when it returns). On CUDA the radix selection and segmented sorts
// (TensorTopK.cu, Sort.cu) take scratch of their own for long rows, not counted.
void SelectMemory(const OpCall& c, OpMemory* m) {
  StatusOr<int> d = SelectDim(c);
  if (c.op.kind == "sort" && c.runtime == Runtime::kCpuTorch113 && d.ok()) {
    m->forward_temps.push_back(Alloc{c.in(0).shape[*d] * 8, "sort: positions"});
  }
  if (c.needs_grad(0)) m->saved_outputs.push_back(1);
}

// max(x) / min(x): the largest / smallest element, 0-dim.
StatusOr<std::vector<OutputSpec>> InferMaxAll(const OpCall& c) {
  if (Numel(c.in(0).shape) == 0) {
    return InvalidArgument(InputField(c, 0) + ": " + c.op.kind + " of an empty tensor " +
                           ShapeToString(c.in(0).shape));
  }
  return std::vector<OutputSpec>{{{}, c.in(0).dtype}};
}

// evenly_distribute_backward (FunctionsManual.cpp). On CUDA: input_and_value_nan =
// logical_and(input.isnan(), value.isnan()), mask = (input == value).logical_or_(that), then
// mask * (grad / mask.sum()): two bool tensors of x's size at a time. On the CPU: mask =
// input == value, a zeros tensor (the gradient) masked_fill_'d with grad / mask.sum(); 1.13's
// sum of the bool mask first copies it to int64 (measured: eq n B, new_zeros, then an 8 n B
// aten::to under sum).
void MaxAllMemory(const OpCall& c, OpMemory* m) {
  if (!c.needs_grad(0)) return;
  m->saved_inputs.push_back(0);
  m->saved_outputs.push_back(0);
  const int64_t n = Numel(c.in(0).shape);
  m->backward_temps.push_back(Alloc{(c.runtime == Runtime::kCuda ? 2 : 9) * n, "max backward: masks"});
}

// index_put_(x, idx, values; dim=0, accumulate=0): x[:, ..., idx] = values in place (one
// integer index tensor at dim, as index takes it); values broadcast to the indexed shape.
StatusOr<std::vector<OutputSpec>> InferIndexPut(const OpCall& c) {
  const Shape& x = c.in(0).shape;
  MEMEST_RETURN_IF_ERROR(RequireRank(c, 0, 1, static_cast<int>(kMaxRank)));
  MEMEST_RETURN_IF_ERROR(RequireIntegerIndex(c, 1));
  MEMEST_ASSIGN_OR_RETURN(int64_t dim, IntAttr(c.op.attrs, "dim", 0, c.field));
  MEMEST_ASSIGN_OR_RETURN(int d, NormalizeDim(dim, static_cast<int>(x.size()), AttrField(c, "dim")));
  MEMEST_ASSIGN_OR_RETURN(int64_t acc, IntAttr(c.op.attrs, "accumulate", 0, c.field));
  if (acc != 0 && acc != 1) {
    return InvalidArgument(AttrField(c, "accumulate") + ": must be 0 or 1, got " + std::to_string(acc));
  }
  Shape indexed(x.begin(), x.begin() + d);
  indexed.insert(indexed.end(), c.in(1).shape.begin(), c.in(1).shape.end());
  indexed.insert(indexed.end(), x.begin() + d + 1, x.end());
  StatusOr<Shape> b = BroadcastShapes(indexed, c.in(2).shape);
  if (indexed.size() > kMaxRank || !b.ok() || *b != indexed) {
    return InvalidArgument(InputField(c, 2) + ": values " + ShapeToString(c.in(2).shape) +
                           " do not broadcast to the indexed " + ShapeToString(indexed));
  }
  return std::vector<OutputSpec>{ViewOf(0, x, c.in(0).dtype, c.in(0).strides)};
}

// Nothing but the write itself in forward (accumulate=0 runs TensorIterator's index_put; 1.13's
// CPU measured). Backward: indices kept; with accumulate=0, self's gradient is a copy of the
// incoming one with zeros put in (a values-sized zeros_like beside it), values' is the indexed
// gradient (fresh, reduced to a broadcast values' shape).
void IndexPutMemory(const OpCall& c, OpMemory* m) {
  StatusOr<int64_t> acc = IntAttr(c.op.attrs, "accumulate", 0, c.field);
  const bool accumulate = acc.ok() && *acc == 1;
  m->grad_flow = {accumulate ? GradFlow::kPassThrough : GradFlow::kFresh, GradFlow::kNone,
                  GradFlow::kFresh};
  if (!c.needs_grad(0) && !c.needs_grad(2)) return;
  m->saved_inputs.push_back(1);
  if (c.needs_grad(0) && !accumulate) {
    m->backward_temps.push_back(Alloc{BytesOf(c.in(2)), "index_put backward: zeros_like(values)"});
  }
}

}  // namespace

void RegisterSelectRules(std::vector<OpRule>* r) {
  // Only its result (measured on 1.13's CPU). On CUDA, nonzero's cub passes (a count, then a
  // selection) take temporary storage of their own, not counted.
  r->push_back({"nonzero", 1, 1, InferNonzero, NoGradient});
  r->push_back({"topk", 1, 1, InferTopk, SelectMemory});
  r->push_back({"sort", 1, 1, InferSort, SelectMemory});
  r->push_back({"max", 1, 1, InferMaxAll, MaxAllMemory});
  r->push_back({"min", 1, 1, InferMaxAll, MaxAllMemory});
  r->push_back({"index_put_", 3, 3, InferIndexPut, IndexPutMemory});
}

}  // namespace rules
}  // namespace memest
