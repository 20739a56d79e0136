// Rules for views, copies, reductions, concatenation and embedding lookups.
//
// Views (view, reshape when the strides allow it, transpose, permute, expand, unsqueeze,
// squeeze, slice, split, flatten) share their input's storage and save nothing; their backward
// reshapes or permutes the incoming gradient, except expand (a sum), slice (zeros + copy) and
// split (a cat), which allocate an input-sized gradient. reshape of a tensor whose strides do
// not allow a view copies it (at::_reshape_alias / clone), as contiguous() does for a
// non-contiguous tensor. sum saves nothing and passes an expanded view of the incoming
// gradient back; mean divides it (a fresh tensor). cat saves nothing and hands back slices.
// embedding saves its indices; its backward allocates a gradient as large as the whole table.
#include <algorithm>

#include "engine/rules/internal.h"

namespace memest {
namespace rules {

// Shared with engine/rules/parallel.cc's vocabulary-parallel embedding (internal.h).
StatusOr<std::vector<OutputSpec>> InferEmbedding(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(RequireRank(c, 0, 2, 2));
  MEMEST_RETURN_IF_ERROR(RequireFloating(c, 0));
  if (IsFloating(c.in(1).dtype)) {
    return InvalidArgument(InputField(c, 1) + ": embedding indices must be an integer tensor, got " +
                           std::string(DTypeName(c.in(1).dtype)));
  }
  Shape out = c.in(1).shape;
  out.push_back(c.in(0).shape[1]);
  return std::vector<OutputSpec>{{out, c.in(0).dtype}};
}

// embedding_dense_backward (CUDA) sorts the indices into a few index-sized int64 buffers and
// sums gradient rows per segment into grad_weight_per_segment: up to one float32 row per index.
// On the CPU, embedding_dense_backward_cpu index_adds rows into the zeroed table: no scratch.
void EmbeddingBackwardScratch(const OpCall& c, OpMemory* m) {
  const int64_t n = Numel(c.in(1).shape);
  if (c.runtime == Runtime::kCuda) {
    m->backward_temps.push_back(Alloc{3 * n * 8, "embedding backward index sort"});
    m->backward_temps.push_back(Alloc{n * c.in(0).shape[1] * 4, "embedding backward partial sums"});
  }
}

namespace {

int Rank(const OpCall& c, size_t i = 0) { return static_cast<int>(c.in(i).shape.size()); }

void PassThrough(const OpCall& c, OpMemory* m) {
  m->grad_flow.assign(c.inputs.size(), GradFlow::kPassThrough);
}
void FreshGrad(const OpCall& c, OpMemory* m) {}

// mean's backward expands and divides the gradient (a fresh tensor). PyTorch 2.x keeps only the
// sizes; 1.13's mean.dim kept its input.
void MeanMemory(const OpCall& c, OpMemory* m) {
  if (c.runtime == Runtime::kCpuTorch113 && HasAttr(c.op.attrs, "dim")) {
    SaveInputIf(m, c.needs_grad(0), 0);
  }
}

// sum hands back an expanded view of its gradient; when it summed into another dtype
// (autocast's float32), autograd casts that view back: a fresh input-sized gradient.
void SumMemory(const OpCall& c, OpMemory* m) {
  const bool cast = c.out(0).dtype != c.in(0).dtype;
  m->grad_flow.assign(1, cast ? GradFlow::kFresh : GradFlow::kPassThrough);
}

StatusOr<Shape> ResolveShape(const OpCall& c, const char* attr) {
  MEMEST_ASSIGN_OR_RETURN(std::vector<int64_t> shape, IntsAttr(c.op.attrs, attr, {}, c.field));
  if (!HasAttr(c.op.attrs, attr)) return InvalidArgument(AttrField(c, attr) + ": required");
  const int64_t numel = Numel(c.in(0).shape);
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      if (infer >= 0) return InvalidArgument(AttrField(c, attr) + ": more than one -1");
      infer = static_cast<int>(i);
    } else if (shape[i] < 0) {
      return InvalidArgument(AttrField(c, attr) + "[" + std::to_string(i) +
                             "]: must be non-negative or -1, got " + std::to_string(shape[i]));
    } else {
      MEMEST_ASSIGN_OR_RETURN(known, CheckedMul(known, shape[i]));
    }
  }
  if (infer >= 0) {
    if (known == 0 || numel % known != 0) {
      return InvalidArgument(AttrField(c, attr) + ": cannot infer -1 for " +
                             std::to_string(numel) + " elements");
    }
    shape[infer] = numel / known;
  } else if (known != numel) {
    return InvalidArgument(AttrField(c, attr) + ": shape " + ShapeToString(shape) + " has " +
                           std::to_string(known) + " elements, the input " +
                           ShapeToString(c.in(0).shape) + " has " + std::to_string(numel));
  }
  return Shape(shape);
}

StatusOr<std::vector<OutputSpec>> ReshapeTo(const OpCall& c, Shape shape, bool may_copy) {
  const Tensor& x = c.in(0);
  Strides strides;
  if (ComputeViewStrides(x.shape, x.strides, shape, &strides)) {
    return std::vector<OutputSpec>{ViewOf(0, std::move(shape), x.dtype, std::move(strides))};
  }
  if (!may_copy) {
    return InvalidArgument(InputField(c, 0) + ": view of a tensor with strides that do not "
                           "allow it; use reshape (which copies) or contiguous()");
  }
  return std::vector<OutputSpec>{{std::move(shape), x.dtype}};
}

StatusOr<std::vector<OutputSpec>> InferReshape(const OpCall& c) {
  MEMEST_ASSIGN_OR_RETURN(Shape shape, ResolveShape(c, "shape"));
  return ReshapeTo(c, std::move(shape), c.op.kind == "reshape");
}

StatusOr<std::vector<OutputSpec>> InferFlatten(const OpCall& c) {
  const int r = std::max(Rank(c), 1);
  MEMEST_ASSIGN_OR_RETURN(int64_t s, IntAttr(c.op.attrs, "start_dim", 0, c.field));
  MEMEST_ASSIGN_OR_RETURN(int64_t e, IntAttr(c.op.attrs, "end_dim", -1, c.field));
  MEMEST_ASSIGN_OR_RETURN(int start, NormalizeDim(s, r, AttrField(c, "start_dim")));
  MEMEST_ASSIGN_OR_RETURN(int end, NormalizeDim(e, r, AttrField(c, "end_dim")));
  if (start > end) return InvalidArgument(AttrField(c, "start_dim") + ": is after end_dim");
  const Shape& x = c.in(0).shape;
  if (x.empty()) return ReshapeTo(c, Shape{1}, true);
  Shape out(x.begin(), x.begin() + start);
  int64_t n = 1;
  for (int i = start; i <= end; ++i) n *= x[i];
  out.push_back(n);
  out.insert(out.end(), x.begin() + end + 1, x.end());
  return ReshapeTo(c, std::move(out), true);
}

StatusOr<std::vector<OutputSpec>> Permuted(const OpCall& c, const std::vector<int>& perm) {
  const Tensor& x = c.in(0);
  Shape s;
  Strides st;
  for (int p : perm) {
    s.push_back(x.shape[p]);
    st.push_back(x.strides[p]);
  }
  return std::vector<OutputSpec>{ViewOf(0, std::move(s), x.dtype, std::move(st))};
}

StatusOr<std::vector<OutputSpec>> InferTranspose(const OpCall& c) {
  MEMEST_ASSIGN_OR_RETURN(int64_t d0, IntAttr(c.op.attrs, "dim0", 0, c.field));
  MEMEST_ASSIGN_OR_RETURN(int64_t d1, IntAttr(c.op.attrs, "dim1", 1, c.field));
  MEMEST_ASSIGN_OR_RETURN(int a, NormalizeDim(d0, Rank(c), AttrField(c, "dim0")));
  MEMEST_ASSIGN_OR_RETURN(int b, NormalizeDim(d1, Rank(c), AttrField(c, "dim1")));
  std::vector<int> perm(Rank(c));
  for (int i = 0; i < Rank(c); ++i) perm[i] = i;
  if (Rank(c) > 0) std::swap(perm[a], perm[b]);
  return Permuted(c, perm);
}

StatusOr<std::vector<OutputSpec>> InferPermute(const OpCall& c) {
  MEMEST_ASSIGN_OR_RETURN(std::vector<int64_t> dims, IntsAttr(c.op.attrs, "dims", {}, c.field));
  if (static_cast<int>(dims.size()) != Rank(c)) {
    return InvalidArgument(AttrField(c, "dims") + ": needs " + std::to_string(Rank(c)) +
                           " dims for shape " + ShapeToString(c.in(0).shape));
  }
  std::vector<int> perm;
  std::vector<bool> seen(Rank(c), false);
  for (int64_t d : dims) {
    MEMEST_ASSIGN_OR_RETURN(int p, NormalizeDim(d, Rank(c), AttrField(c, "dims")));
    if (seen[p]) return InvalidArgument(AttrField(c, "dims") + ": repeats dim " + std::to_string(p));
    seen[p] = true;
    perm.push_back(p);
  }
  return Permuted(c, perm);
}

StatusOr<std::vector<OutputSpec>> InferExpand(const OpCall& c) {
  MEMEST_ASSIGN_OR_RETURN(std::vector<int64_t> shape, IntsAttr(c.op.attrs, "shape", {}, c.field));
  const Tensor& x = c.in(0);
  if (shape.size() < x.shape.size()) {
    return InvalidArgument(AttrField(c, "shape") + ": " + ShapeToString(shape) +
                           " has fewer dims than the input " + ShapeToString(x.shape));
  }
  const size_t off = shape.size() - x.shape.size();
  Strides st(shape.size(), 0);
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i < off) {
      if (shape[i] < 0) return InvalidArgument(AttrField(c, "shape") + ": -1 in a new leading dim");
      continue;
    }
    const int64_t in = x.shape[i - off];
    if (shape[i] == -1) shape[i] = in;
    if (in != 1 && shape[i] != in) {
      return InvalidArgument(AttrField(c, "shape") + ": cannot expand " + ShapeToString(x.shape) +
                             " to " + ShapeToString(shape));
    }
    st[i] = in == 1 && shape[i] != 1 ? 0 : x.strides[i - off];
  }
  return std::vector<OutputSpec>{ViewOf(0, shape, x.dtype, st)};
}

void ExpandMemory(const OpCall& c, OpMemory* m) {}  // backward: sum_to, a fresh gradient

StatusOr<std::vector<OutputSpec>> InferUnsqueeze(const OpCall& c) {
  MEMEST_ASSIGN_OR_RETURN(int64_t d, IntAttr(c.op.attrs, "dim", 0, c.field));
  MEMEST_ASSIGN_OR_RETURN(int dim, NormalizeDim(d, Rank(c) + 1, AttrField(c, "dim")));
  Shape s = c.in(0).shape;
  s.insert(s.begin() + dim, 1);
  return ReshapeTo(c, s, false);
}

StatusOr<std::vector<OutputSpec>> InferSqueeze(const OpCall& c) {
  Shape s;
  if (HasAttr(c.op.attrs, "dim")) {
    MEMEST_ASSIGN_OR_RETURN(int64_t d, IntAttr(c.op.attrs, "dim", 0, c.field));
    MEMEST_ASSIGN_OR_RETURN(int dim, NormalizeDim(d, Rank(c), AttrField(c, "dim")));
    s = c.in(0).shape;
    if (!s.empty() && s[dim] == 1) s.erase(s.begin() + dim);
  } else {
    for (int64_t x : c.in(0).shape) {
      if (x != 1) s.push_back(x);
    }
  }
  return ReshapeTo(c, s, false);
}

StatusOr<std::vector<OutputSpec>> InferSlice(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(RequireRank(c, 0, 1, static_cast<int>(kMaxRank)));  // a 0-dim tensor has no dim to cut
  MEMEST_ASSIGN_OR_RETURN(int64_t d, IntAttr(c.op.attrs, "dim", 0, c.field));
  MEMEST_ASSIGN_OR_RETURN(int dim, NormalizeDim(d, Rank(c), AttrField(c, "dim")));
  const int64_t n = c.in(0).shape[dim];
  MEMEST_ASSIGN_OR_RETURN(int64_t start, IntAttr(c.op.attrs, "start", 0, c.field));
  MEMEST_ASSIGN_OR_RETURN(int64_t end, IntAttr(c.op.attrs, "end", n, c.field));
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  MEMEST_ASSIGN_OR_RETURN(int64_t step, IntAttr(c.op.attrs, "step", 1, c.field));
  if (step <= 0) return InvalidArgument(AttrField(c, "step") + ": must be positive");
  Shape s = c.in(0).shape;
  s[dim] = (end - start) / step + ((end - start) % step != 0);
  Strides st = c.in(0).strides;
  if (step != 1 && s[dim] > 1) {  // every step-th element: the stride grows
    if (st.empty()) st = ContiguousStrides(c.in(0).shape);
    MEMEST_ASSIGN_OR_RETURN(st[dim], CheckedMul(st[dim], step));
  }
  return std::vector<OutputSpec>{ViewOf(0, s, c.in(0).dtype, st)};
}

StatusOr<std::vector<OutputSpec>> InferSplit(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(RequireRank(c, 0, 1, static_cast<int>(kMaxRank)));  // a 0-dim tensor has no dim to cut
  MEMEST_ASSIGN_OR_RETURN(int64_t d, IntAttr(c.op.attrs, "dim", 0, c.field));
  MEMEST_ASSIGN_OR_RETURN(int dim, NormalizeDim(d, Rank(c), AttrField(c, "dim")));
  MEMEST_ASSIGN_OR_RETURN(std::vector<int64_t> sizes, IntsAttr(c.op.attrs, "sizes", {}, c.field));
  int64_t total = 0;
  for (int64_t s : sizes) {
    if (s < 0) return InvalidArgument(AttrField(c, "sizes") + ": sizes must be non-negative");
    if (!AddBytes(&total, s)) total = -1;  // past 2^62: cannot add up to any size
  }
  if (sizes.empty() || total != c.in(0).shape[dim]) {
    return InvalidArgument(AttrField(c, "sizes") + ": must add up to " +
                           std::to_string(c.in(0).shape[dim]) + " (dim " + std::to_string(dim) +
                           " of " + ShapeToString(c.in(0).shape) + ")");
  }
  std::vector<OutputSpec> outs;
  for (int64_t s : sizes) {
    Shape shape = c.in(0).shape;
    shape[dim] = s;
    outs.push_back(ViewOf(0, shape, c.in(0).dtype, c.in(0).strides));
  }
  return outs;
}

StatusOr<std::vector<OutputSpec>> InferContiguous(const OpCall& c) {
  const Tensor& x = c.in(0);
  if (IsContiguous(x.shape, x.strides)) {
    return std::vector<OutputSpec>{ViewOf(0, x.shape, x.dtype, x.strides)};
  }
  return std::vector<OutputSpec>{{x.shape, x.dtype}};
}

StatusOr<std::vector<OutputSpec>> InferCat(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(RequireRank(c, 0, 1, static_cast<int>(kMaxRank)));  // nor one to join along
  MEMEST_ASSIGN_OR_RETURN(int64_t d, IntAttr(c.op.attrs, "dim", 0, c.field));
  MEMEST_ASSIGN_OR_RETURN(int dim, NormalizeDim(d, Rank(c), AttrField(c, "dim")));
  Shape out = c.in(0).shape;
  DType dtype = c.in(0).dtype;
  for (size_t i = 1; i < c.inputs.size(); ++i) {
    const Shape& s = c.in(i).shape;
    bool ok = s.size() == out.size();
    for (size_t j = 0; ok && j < s.size(); ++j) ok = j == static_cast<size_t>(dim) || s[j] == out[j];
    if (!ok) {
      return InvalidArgument(InputField(c, i) + ": shape " + ShapeToString(s) +
                             " does not match " + ShapeToString(c.in(0).shape) +
                             " outside dim " + std::to_string(dim));
    }
    if (!AddBytes(&out[dim], s[dim])) {
      return InvalidArgument(InputField(c, i) + ": the concatenation along dim " +
                             std::to_string(dim) + " has more than 2^62 elements");
    }
    dtype = PromoteTypes(dtype, c.in(i).dtype);
  }
  return std::vector<OutputSpec>{{out, dtype}};
}

}  // namespace

StatusOr<std::vector<OutputSpec>> InferReduce(const OpCall& c) {
  MEMEST_ASSIGN_OR_RETURN(int64_t keepdim, IntAttr(c.op.attrs, "keepdim", 0, c.field));
  const Shape& x = c.in(0).shape;
  std::vector<bool> reduce(x.size(), !HasAttr(c.op.attrs, "dim"));
  MEMEST_ASSIGN_OR_RETURN(std::vector<int64_t> dims, IntsAttr(c.op.attrs, "dim", {}, c.field));
  for (int64_t d : dims) {
    MEMEST_ASSIGN_OR_RETURN(int dim, NormalizeDim(d, Rank(c), AttrField(c, "dim")));
    if (!x.empty()) reduce[dim] = true;
  }
  Shape out;
  for (size_t i = 0; i < x.size(); ++i) {
    if (!reduce[i]) out.push_back(x[i]);
    else if (keepdim) out.push_back(1);
  }
  DType d = c.in(0).dtype;
  MEMEST_ASSIGN_OR_RETURN(int64_t f32, IntAttr(c.op.attrs, "dtype_float32", 0, c.field));
  if (f32 && IsFloating(d)) d = DType::kFloat32;  // sum(x, dtype=float32), as under autocast
  if (!IsFloating(d)) {
    if (c.op.kind == "mean") {
      return InvalidArgument(InputField(c, 0) + ": mean needs a floating tensor");
    }
    d = DType::kInt64;
  }
  return std::vector<OutputSpec>{{out, d}};
}

namespace {

void EmbeddingMemory(const OpCall& c, OpMemory* m) {
  if (!c.needs_grad(0)) return;
  m->saved_inputs.push_back(1);
  EmbeddingBackwardScratch(c, m);
  // embedding_dense_backward (CPU and CUDA): grad_.contiguous().view({num_indices, dim}), a
  // copy of a gradient that reaches it transposed (nn.MultiheadAttention's batch_first input).
  m->backward_needs_contiguous_grad = true;
  m->grad_flow = {GradFlow::kFresh, GradFlow::kNone};
}

// ---- how view backwards hand the gradient on ----

// transpose / permute: the input's gradient is the output's, permuted back.
bool PermutedGradView(const Op& op, const Tensor& in, const Tensor& out, const Strides& out_grad,
                      Strides* in_grad) {
  const int r = static_cast<int>(in.shape.size());
  std::vector<int> perm(r);
  for (int i = 0; i < r; ++i) perm[i] = i;
  if (op.kind == "transpose" && r > 0) {
    const int64_t d0 = IntAttr(op.attrs, "dim0", 0, "").value();
    const int64_t d1 = IntAttr(op.attrs, "dim1", 1, "").value();
    std::swap(perm[(d0 + r) % r], perm[(d1 + r) % r]);
  } else if (op.kind == "permute") {
    const std::vector<int64_t> dims = IntsAttr(op.attrs, "dims", {}, "").value();
    for (int i = 0; i < r; ++i) perm[i] = static_cast<int>((dims[i] + r) % r);
  }
  in_grad->assign(r, 0);
  for (int i = 0; i < r; ++i) (*in_grad)[perm[i]] = out_grad[i];
  return true;
}

// reshape / view / flatten / (un)squeeze: the gradient reshaped back, a view when it can be.
bool ReshapedGradView(const Op& op, const Tensor& in, const Tensor& out, const Strides& out_grad,
                      Strides* in_grad) {
  return ComputeViewStrides(out.shape, out_grad, in.shape, in_grad);
}

// sum: the reduced gradient expanded back, stride 0 on the reduced dims.
bool ExpandedGradView(const Op& op, const Tensor& in, const Tensor& out, const Strides& out_grad,
                      Strides* in_grad) {
  const int r = static_cast<int>(in.shape.size());
  std::vector<bool> reduced(r, !HasAttr(op.attrs, "dim"));
  for (int64_t d : IntsAttr(op.attrs, "dim", {}, "").value()) reduced[(d + r) % r] = true;
  const bool keepdim = IntAttr(op.attrs, "keepdim", 0, "").value() != 0;
  in_grad->assign(r, 0);
  size_t j = 0;
  for (int i = 0; i < r; ++i) {
    if (reduced[i]) {
      if (keepdim) ++j;
      continue;
    }
    (*in_grad)[i] = j < out_grad.size() ? out_grad[j] : 0;
    ++j;
  }
  return true;
}

// x.detach(): x's storage, outside autograd.
StatusOr<std::vector<OutputSpec>> InferDetach(const OpCall& c) {
  OutputSpec y = ViewOf(0, c.in(0).shape, c.in(0).dtype, c.in(0).strides);
  y.differentiable = false;
  return std::vector<OutputSpec>{y};
}

// An op whose backward hands each input its own view of the gradient.
OpRule ViewBackward(OpRule rule, decltype(OpRule::grad_view) grad_view) {
  rule.grad_view = grad_view;
  rule.backward_makes_views = true;
  return rule;
}

}  // namespace

void RegisterShapeRules(std::vector<OpRule>* r) {
  r->push_back(ViewBackward({"reshape", 1, 1, InferReshape, PassThrough}, ReshapedGradView));
  r->push_back(ViewBackward({"view", 1, 1, InferReshape, PassThrough}, ReshapedGradView));
  r->push_back(ViewBackward({"flatten", 1, 1, InferFlatten, PassThrough}, ReshapedGradView));
  r->push_back(ViewBackward({"transpose", 1, 1, InferTranspose, PassThrough}, PermutedGradView));
  r->push_back(ViewBackward({"permute", 1, 1, InferPermute, PassThrough}, PermutedGradView));
  r->push_back({"expand", 1, 1, InferExpand, ExpandMemory});
  r->push_back(ViewBackward({"unsqueeze", 1, 1, InferUnsqueeze, PassThrough}, ReshapedGradView));
  r->push_back(ViewBackward({"squeeze", 1, 1, InferSqueeze, PassThrough}, ReshapedGradView));
  r->push_back({"slice", 1, 1, InferSlice, FreshGrad});
  r->push_back({"split", 1, 1, InferSplit, FreshGrad});
  r->push_back({"contiguous", 1, 1, InferContiguous, PassThrough});
  r->push_back({"detach", 1, 1, InferDetach, NoGradient});
  r->push_back(ViewBackward({"cat", 1, -1, InferCat, PassThrough}, nullptr));  // slices
  r->push_back(ViewBackward({"sum", 1, 1, InferReduce, SumMemory}, ExpandedGradView));
  r->push_back({"mean", 1, 1, InferReduce, MeanMemory});
  r->push_back({"embedding", 2, 2, InferEmbedding, EmbeddingMemory});
}

}  // namespace rules
}  // namespace memest
