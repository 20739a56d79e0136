// Rules for ops that make tensors or follow indices: arange, full, index (advanced indexing
// with integer index tensors for consecutive dims), gather, index_add_, scatter_, one_hot and
// embedding_bag.
//
// derivatives.yaml: index.Tensor keeps its indices and self's sizes; its backward is
// index_put_(zeros(self), indices, grad, accumulate=true), which on CUDA sorts the flattened
// indices (index_put_with_sort_kernel: a linear index, the sorted indices, their original
// positions and an arange over them, each int64 per index) and on the CPU (1.13) adds in
// place with no scratch (measured). _embedding_bag keeps indices, offsets, per_sample_weights
// and its three bookkeeping outputs (offset2bag, bag_size, max_indices); its dense backward
// makes a table-sized gradient.
#include <algorithm>

#include "engine/rules/internal.h"

namespace memest {
namespace rules {
namespace {

void NoMemory(const OpCall& c, OpMemory* m) {}

// arange(; end, start=0, step=1): int64 [ceil((end - start) / step)].
StatusOr<std::vector<OutputSpec>> InferArange(const OpCall& c) {
  MEMEST_ASSIGN_OR_RETURN(int64_t end, IntAttr(c.op.attrs, "end", -1, c.field));
  MEMEST_ASSIGN_OR_RETURN(int64_t start, IntAttr(c.op.attrs, "start", 0, c.field));
  MEMEST_ASSIGN_OR_RETURN(int64_t step, IntAttr(c.op.attrs, "step", 1, c.field));
  if (end < 0) return InvalidArgument(AttrField(c, "end") + ": required, non-negative");
  if (start < 0 || start > end) {
    return InvalidArgument(AttrField(c, "start") + ": must be in [0, end], got " +
                           std::to_string(start));
  }
  if (step <= 0) {
    return InvalidArgument(AttrField(c, "step") + ": must be positive, got " +
                           std::to_string(step));
  }
  const int64_t n = (end - start) / step + ((end - start) % step != 0);
  return std::vector<OutputSpec>{{{n}, DType::kInt64, {}, -1, false}};
}

// full(; shape, dtype="float32"): a new tensor made in forward (torch.zeros / ones / full /
// empty): it reads nothing and has no gradient.
StatusOr<std::vector<OutputSpec>> InferFull(const OpCall& c) {
  if (!HasAttr(c.op.attrs, "shape")) return InvalidArgument(AttrField(c, "shape") + ": required");
  MEMEST_ASSIGN_OR_RETURN(std::vector<int64_t> shape, IntsAttr(c.op.attrs, "shape", {}, c.field));
  MEMEST_ASSIGN_OR_RETURN(std::string name, StringAttr(c.op.attrs, "dtype", "float32", c.field));
  StatusOr<DType> d = ParseDType(name);
  if (!d.ok()) return d.status().Prefixed(AttrField(c, "dtype") + ": ");
  if (shape.size() > kMaxRank) {
    return InvalidArgument(AttrField(c, "shape") + ": more than " + std::to_string(kMaxRank) +
                           " dims");
  }
  for (int64_t n : shape) {
    if (n < 0) {
      return InvalidArgument(AttrField(c, "shape") + ": " + ShapeToString(shape) +
                             " has a negative size");
    }
  }
  return std::vector<OutputSpec>{{shape, *d, {}, -1, false}};
}

// ---- index(x, idx...; dim=0): x[:, ..., idx1, idx2, ...], integer index tensors for the
// consecutive dims from `dim` (broadcast together: RPN's objectness[batch_idx, top_n_idx]) ----

StatusOr<Shape> IndexShape(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(RequireRank(c, 0, 1, static_cast<int>(kMaxRank)));
  Shape indices;
  for (size_t i = 1; i < c.inputs.size(); ++i) {
    if (IsFloating(c.in(i).dtype) || c.in(i).dtype == DType::kBool) {
      return InvalidArgument(InputField(c, i) + ": index takes integer index tensors, got " +
                             std::string(DTypeName(c.in(i).dtype)));
    }
    StatusOr<Shape> b = i == 1 ? c.in(i).shape : BroadcastShapes(indices, c.in(i).shape);
    if (!b.ok()) return b.status().Prefixed(InputField(c, i) + ": ");
    indices = *b;
  }
  const Shape& x = c.in(0).shape;
  MEMEST_ASSIGN_OR_RETURN(int64_t dim, IntAttr(c.op.attrs, "dim", 0, c.field));
  MEMEST_ASSIGN_OR_RETURN(int d, NormalizeDim(dim, static_cast<int>(x.size()), AttrField(c, "dim")));
  const size_t k = c.inputs.size() - 1;
  if (d + k > x.size()) {
    return InvalidArgument(c.field + ".inputs: " + std::to_string(k) + " index tensors from dim " +
                           std::to_string(d) + " of " + ShapeToString(x));
  }
  Shape out(x.begin(), x.begin() + d);
  out.insert(out.end(), indices.begin(), indices.end());
  out.insert(out.end(), x.begin() + d + k, x.end());
  if (out.size() > kMaxRank) {
    return InvalidArgument(c.field + ": index gives " + std::to_string(out.size()) +
                           " dims, more than " + std::to_string(kMaxRank));
  }
  return out;
}

StatusOr<std::vector<OutputSpec>> InferIndex(const OpCall& c) {
  MEMEST_ASSIGN_OR_RETURN(Shape out, IndexShape(c));
  return std::vector<OutputSpec>{{out, c.in(0).dtype}};
}

void IndexMemory(const OpCall& c, OpMemory* m) {
  m->grad_flow.assign(c.inputs.size(), GradFlow::kNone);
  m->grad_flow[0] = GradFlow::kFresh;
  if (!c.needs_grad(0)) return;
  Shape indices = c.in(1).shape;  // broadcast (checked by IndexShape): one linear index each
  for (size_t i = 1; i < c.inputs.size(); ++i) {
    m->saved_inputs.push_back(static_cast<int>(i));
    StatusOr<Shape> b = BroadcastShapes(indices, c.in(i).shape);
    if (b.ok()) indices = *b;
  }
  if (c.runtime == Runtime::kCuda) {
    m->backward_temps.push_back(
        Alloc{4 * Numel(indices) * 8, "index_put_ sort: linear, sorted, original, range"});
  }
}

// ---- gather(x, idx; dim): x.gather(dim, idx), idx x's rank and no larger than x in the
// other dims; the result has idx's shape ----

StatusOr<std::vector<OutputSpec>> InferGather(const OpCall& c) {
  const Shape& x = c.in(0).shape;
  const Shape& idx = c.in(1).shape;
  MEMEST_RETURN_IF_ERROR(RequireIntegerIndex(c, 1));
  MEMEST_ASSIGN_OR_RETURN(int64_t dim, IntAttr(c.op.attrs, "dim", -1, c.field));
  MEMEST_ASSIGN_OR_RETURN(int d, NormalizeDim(dim, static_cast<int>(x.size()), AttrField(c, "dim")));
  bool fits = idx.size() == x.size();
  for (size_t i = 0; fits && i < idx.size(); ++i) fits = static_cast<int>(i) == d || idx[i] <= x[i];
  if (!fits) {
    return InvalidArgument(InputField(c, 1) + ": index " + ShapeToString(idx) +
                           " must have the rank of " + ShapeToString(x) +
                           " and no larger size outside dim " + std::to_string(d));
  }
  return std::vector<OutputSpec>{{idx, c.in(0).dtype}};
}

// derivatives.yaml gather: self's gradient gather_backward(grad, self, dim, index), zeros of
// self's shape that the gradient is scattered into (fresh); the index kept.
void GatherMemory(const OpCall& c, OpMemory* m) {
  m->grad_flow = {GradFlow::kFresh, GradFlow::kNone};
  if (c.needs_grad(0)) m->saved_inputs.push_back(1);
}

// ---- index_add_(x, idx, source; dim=0): x.index_add_(dim, idx, source), in place; idx a 1-D
// integer tensor of source.shape[dim] positions into x's dim, source x's shape elsewhere ----
//
// scatter_(x, idx; dim, value): x.scatter_(dim, idx, value), in place, idx x's rank and at most
// x's size in every dim (F.one_hot's zeros(.., classes).scatter_(-1, ids.unsqueeze(-1), 1)).

StatusOr<std::vector<OutputSpec>> InferIndexAdd(const OpCall& c) {
  const Shape& x = c.in(0).shape;
  MEMEST_RETURN_IF_ERROR(RequireRank(c, 0, 1, static_cast<int>(kMaxRank)));
  MEMEST_RETURN_IF_ERROR(RequireIntegerIndex(c, 1));
  MEMEST_ASSIGN_OR_RETURN(int64_t dim, IntAttr(c.op.attrs, "dim", 0, c.field));
  MEMEST_ASSIGN_OR_RETURN(int d, NormalizeDim(dim, static_cast<int>(x.size()), AttrField(c, "dim")));
  const Shape& source = c.in(2).shape;
  if (c.in(1).shape.size() != 1) {
    return InvalidArgument(InputField(c, 1) + ": index_add_ takes a 1-D index, got " +
                           ShapeToString(c.in(1).shape));
  }
  Shape expected = x;
  expected[d] = c.in(1).shape[0];
  if (source != expected) {
    return InvalidArgument(InputField(c, 2) + ": source " + ShapeToString(source) +
                           " must be " + ShapeToString(expected) + " (the index's " +
                           std::to_string(expected[d]) + " rows of " + ShapeToString(x) + ")");
  }
  if (c.in(2).dtype != c.in(0).dtype) {
    return InvalidArgument(InputField(c, 2) + ": source is " +
                           std::string(DTypeName(c.in(2).dtype)) + ", self " +
                           std::string(DTypeName(c.in(0).dtype)) + ": index_add_ takes one dtype");
  }
  return std::vector<OutputSpec>{ViewOf(0, x, c.in(0).dtype, c.in(0).strides)};
}

// derivatives.yaml index_add: self's gradient is grad itself; source's is
// grad.index_select(dim, index).expand_as(source), fresh, and the formula names source, so
// autograd keeps source whole besides the index (measured on 1.13's CPU: index and source
// saved).
void IndexAddMemory(const OpCall& c, OpMemory* m) {
  m->grad_flow = {GradFlow::kPassThrough, GradFlow::kNone, GradFlow::kFresh};
  if (!c.needs_grad(2)) return;
  m->saved_inputs = {1, 2};
}

StatusOr<std::vector<OutputSpec>> InferScatter(const OpCall& c) {
  const Shape& x = c.in(0).shape;
  MEMEST_RETURN_IF_ERROR(RequireIntegerIndex(c, 1));
  MEMEST_ASSIGN_OR_RETURN(int64_t dim, IntAttr(c.op.attrs, "dim", -1, c.field));
  MEMEST_RETURN_IF_ERROR(
      NormalizeDim(dim, static_cast<int>(x.size()), AttrField(c, "dim")).status());
  MEMEST_RETURN_IF_ERROR(FloatAttr(c.op.attrs, "value", 0, c.field).status());
  const Shape& idx = c.in(1).shape;
  bool fits = idx.size() == x.size();
  for (size_t i = 0; fits && i < idx.size(); ++i) fits = idx[i] <= x[i];
  if (!fits) {
    return InvalidArgument(InputField(c, 1) + ": index " + ShapeToString(idx) +
                           " must have the rank of " + ShapeToString(x) + " and no larger size");
  }
  return std::vector<OutputSpec>{ViewOf(0, x, c.in(0).dtype, c.in(0).strides)};
}

// derivatives.yaml scatter.value: self's gradient grad.scatter(dim, index, 0), fresh; the index
// kept.
void ScatterMemory(const OpCall& c, OpMemory* m) {
  m->grad_flow = {GradFlow::kFresh, GradFlow::kNone};
  if (c.needs_grad(0)) m->saved_inputs.push_back(1);
}

// ---- one_hot(ids; num_classes): F.one_hot, int64 [..., num_classes] from int64 ids ----

StatusOr<std::vector<OutputSpec>> InferOneHot(const OpCall& c) {
  if (c.in(0).dtype != DType::kInt64) {
    return InvalidArgument(InputField(c, 0) + ": one_hot takes int64 class ids, got " +
                           std::string(DTypeName(c.in(0).dtype)));
  }
  MEMEST_ASSIGN_OR_RETURN(int64_t classes, IntAttr(c.op.attrs, "num_classes", -1, c.field));
  if (classes <= 0) {
    return InvalidArgument(AttrField(c, "num_classes") + ": must be positive, got " +
                           std::to_string(classes));
  }
  if (c.in(0).shape.size() >= kMaxRank) {
    return InvalidArgument(InputField(c, 0) + ": one_hot adds a dim to " +
                           ShapeToString(c.in(0).shape) + ", past " + std::to_string(kMaxRank));
  }
  Shape out = c.in(0).shape;
  out.push_back(classes);
  return std::vector<OutputSpec>{{out, DType::kInt64, {}, -1, false}};
}

// zeros(.., num_classes).scatter_(-1, ids.unsqueeze(-1), 1): the result alone on CUDA. On the
// CPU aten first checks the ids' range, ids.min().item() then ids.max().item(): a 0-dim int64
// at a time.
void OneHotMemory(const OpCall& c, OpMemory* m) {
  m->grad_flow = {GradFlow::kNone};
  if (c.runtime != Runtime::kCuda && Numel(c.in(0).shape) > 0) {
    m->forward_temps.push_back(Alloc{8, "one_hot: ids.min(), then ids.max()"});
  }
}

// ---- embedding_bag(weight[V, D], indices, offsets?, per_sample_weights?;
//      mode="mean", bag_size, include_last_offset=0) ----
//
// Bags are given by `offsets` (B starts, or B + 1 with include_last_offset) for 1-D indices
// [N]; or, without offsets, as the rows of 2-D indices [B, L], or with attrs.bag_size as N /
// bag_size bags of that size: F.embedding_bag of a 2-D input, which flattens it and makes the
// offsets itself (an int64 arange that autograd keeps). per_sample_weights (mode "sum" only),
// shaped like the indices, follows the bags' inputs.

struct Bags {
  int64_t n = 0, bags = 0, dim = 0;
  std::string mode;
  bool made_offsets = false;  // offsets made inside (attrs.bag_size)
  int psw = -1;               // input index of per_sample_weights, or -1
};

StatusOr<Bags> ReadBags(const OpCall& c) {
  Bags b;
  MEMEST_ASSIGN_OR_RETURN(b.mode, StringAttr(c.op.attrs, "mode", "mean", c.field));
  if (b.mode != "sum" && b.mode != "mean" && b.mode != "max") {
    return InvalidArgument(AttrField(c, "mode") + ": must be 'sum', 'mean' or 'max', got '" +
                           b.mode + "'");
  }
  b.n = Numel(c.in(1).shape);
  b.dim = c.in(0).shape.size() == 2 ? c.in(0).shape[1] : 0;
  if (c.in(1).shape.size() == 2) {  // [B, L]: B bags of L
    if (HasAttr(c.op.attrs, "bag_size")) {
      return InvalidArgument(AttrField(c, "bag_size") + ": 2-D indices are bags of their rows");
    }
    b.made_offsets = true;
    b.bags = c.in(1).shape[0];
    if (c.inputs.size() == 3) b.psw = 2;
    if (c.inputs.size() > 3) {
      return InvalidArgument(c.field + ".inputs: embedding_bag of 2-D indices takes no offsets");
    }
    return b;
  }
  b.made_offsets = HasAttr(c.op.attrs, "bag_size");
  if (b.made_offsets) {
    MEMEST_ASSIGN_OR_RETURN(int64_t size, IntAttr(c.op.attrs, "bag_size", 1, c.field));
    if (size <= 0 || b.n % size != 0) {
      return InvalidArgument(AttrField(c, "bag_size") + ": " + std::to_string(size) +
                             " must be positive and divide the " + std::to_string(b.n) +
                             " indices");
    }
    b.bags = b.n / size;
    if (c.inputs.size() > 3) {
      return InvalidArgument(c.field + ".inputs: embedding_bag with attrs.bag_size takes no " +
                             "offsets (weight, indices and optionally per_sample_weights)");
    }
    if (c.inputs.size() == 3) b.psw = 2;
  } else {
    if (c.inputs.size() < 3) {
      return InvalidArgument(c.field + ".inputs: embedding_bag takes offsets as inputs[2] " +
                             "unless attrs.bag_size is set");
    }
    MEMEST_RETURN_IF_ERROR(RequireRank(c, 2, 1, 1));
    MEMEST_ASSIGN_OR_RETURN(int64_t last, IntAttr(c.op.attrs, "include_last_offset", 0, c.field));
    b.bags = std::max<int64_t>(0, c.in(2).shape[0] - (last ? 1 : 0));
    if (c.inputs.size() == 4) b.psw = 3;
  }
  return b;
}

StatusOr<std::vector<OutputSpec>> InferEmbeddingBag(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(RequireRank(c, 0, 2, 2));
  MEMEST_RETURN_IF_ERROR(RequireFloating(c, 0));
  MEMEST_RETURN_IF_ERROR(RequireRank(c, 1, 1, 2));
  const bool made = c.in(1).shape.size() == 2 || HasAttr(c.op.attrs, "bag_size");
  for (size_t i = 1; i < std::min<size_t>(c.inputs.size(), 3); ++i) {
    if (IsFloating(c.in(i).dtype) && !(i == 2 && made)) {
      return InvalidArgument(InputField(c, i) + ": embedding_bag indices and offsets must be " +
                             "integer tensors, got " + std::string(DTypeName(c.in(i).dtype)));
    }
  }
  MEMEST_ASSIGN_OR_RETURN(Bags b, ReadBags(c));
  if (b.psw >= 0) {
    if (Numel(c.in(b.psw).shape) != b.n || !IsFloating(c.in(b.psw).dtype) || b.mode != "sum") {
      return InvalidArgument(InputField(c, b.psw) + ": per_sample_weights must be shaped like " +
                             "the indices " + ShapeToString(c.in(1).shape) +
                             ", with mode 'sum'");
    }
  }
  // CUDA's backward sums gradient rows per index in float32 (embedding's partial sums).
  MEMEST_RETURN_IF_ERROR(
      CheckedBytes({b.n, b.dim}, DType::kFloat32, c.field + ": its per-index partial sums").status());
  return std::vector<OutputSpec>{{{b.bags, b.dim}, c.in(0).dtype}};
}

// PyTorch 1.13's CPU _embedding_bag allocates, in order (measured): the output, offset2bag
// ([N + 1] int64, mean and max only) by make_offset2bag (index_add_ of ones_like(offsets),
// a 0-dim update, a cumsum into a new tensor), bag_size ([B] int64, from a [B - 1] difference
// and a 0-dim), max_indices ([B] int64; max: [B, D] int64, after a [B] one it frees), and for
// mean a division by the bag sizes (two [B] int64 and one [B] in the weight's dtype).
// The scratch is the sequence's high-water mark above what it keeps.
int64_t CpuForwardScratch(const Bags& b, int64_t e) {
  const int64_t o2b = (b.n + 1) * 8, bag = b.bags * 8;
  std::vector<int64_t> seq{b.bags * b.dim * e};
  if (b.mode != "sum") seq.insert(seq.end(), {o2b, bag, -bag, 8, -8, o2b, -o2b});
  seq.insert(seq.end(), {bag, (b.bags - 1) * 8, -(b.bags - 1) * 8, 8, -8});
  if (b.mode == "max") {
    seq.insert(seq.end(), {bag, b.bags * b.dim * 8, -bag});
  } else {
    seq.push_back(bag);
  }
  if (b.mode == "mean") seq.insert(seq.end(), {bag, bag, b.bags * e, -bag, -bag, -b.bags * e});
  int64_t net = 0, peak = 0;
  for (int64_t x : seq) {
    net += x;
    peak = std::max(peak, net);
  }
  return peak - net;
}

void EmbeddingBagMemory(const OpCall& c, OpMemory* m) {
  StatusOr<Bags> read = ReadBags(c);
  if (!read.ok()) return;
  const Bags& b = *read;
  const bool cpu = c.runtime == Runtime::kCpuTorch113;
  const int64_t e = DTypeSize(c.in(0).dtype);
  // The bookkeeping outputs: offset2bag, bag_size, max_indices (EmbeddingBag.cpp / .cu).
  std::vector<Alloc> books;
  if (b.made_offsets) books.push_back(Alloc{b.bags * 8, "embedding_bag offsets (arange)"});
  const int64_t o2b = cpu ? (b.mode == "sum" ? 0 : (b.n + 1) * 8) : b.n * 8;
  if (o2b > 0) books.push_back(Alloc{o2b, "embedding_bag offset2bag"});
  books.push_back(Alloc{b.bags * 8, "embedding_bag bag_size"});
  const int64_t max_indices = b.mode == "max" ? b.bags * b.dim * 8 : cpu ? b.bags * 8 : 0;
  if (max_indices > 0) books.push_back(Alloc{max_indices, "embedding_bag max_indices"});
  const bool psw_grad = b.psw >= 0 && c.needs_grad(b.psw);
  const bool grad = c.needs_grad(0) || psw_grad;
  for (const Alloc& a : books) (grad ? m->saved_extras : m->forward_temps).push_back(a);
  if (cpu) {
    const int64_t s = CpuForwardScratch(b, e);
    if (s > 0) m->forward_temps.push_back(Alloc{s, "embedding_bag offset2bag cumsum, bag sizes"});
  }
  m->grad_flow.assign(c.inputs.size(), GradFlow::kNone);
  m->grad_flow[0] = GradFlow::kFresh;
  if (b.psw >= 0) m->grad_flow[b.psw] = GradFlow::kFresh;
  if (!grad) return;
  for (size_t i = 1; i < c.inputs.size(); ++i) m->saved_inputs.push_back(static_cast<int>(i));
  if (!c.needs_grad(0)) return;
  // The dense backward. CPU (measured): sum makes offset2bag now ([N + 1] int64, live
  // throughout) and, like mean, sorts the indices into three [N] int64 buffers (plus [N] in
  // the weight's dtype with per_sample_weights); max scatters through [B] and [B, D] int64 and
  // [B, D] buffers. CUDA (embedding_bag_backward_cuda_sum_avg): the indices' sort and the
  // per-segment partial sums, as embedding's backward; max adds atomically with no scratch.
  int64_t scratch = 0;
  if (cpu) {
    if (b.mode == "max") {
      scratch = b.bags * 8 + b.bags * b.dim * 8 + b.bags * b.dim * e;
    } else {
      scratch = 3 * b.n * 8;
      if (b.mode == "sum") scratch += (b.n + 1) * 8;
      if (b.psw >= 0) scratch += b.n * e;
    }
  } else if (b.mode != "max") {
    scratch = 3 * b.n * 8 + b.n * b.dim * 4;
  }
  if (scratch > 0) m->backward_temps.push_back(Alloc{scratch, "embedding_bag backward"});
}

}  // namespace

void RegisterIndexRules(std::vector<OpRule>* r) {
  r->push_back({"arange", 0, 0, InferArange, NoMemory});
  r->push_back({"full", 0, 0, InferFull, NoMemory});
  r->push_back({"index", 2, -1, InferIndex, IndexMemory});
  r->push_back({"index_add_", 3, 3, InferIndexAdd, IndexAddMemory});
  r->push_back({"gather", 2, 2, InferGather, GatherMemory});
  r->push_back({"scatter_", 2, 2, InferScatter, ScatterMemory});
  r->push_back({"one_hot", 1, 1, InferOneHot, OneHotMemory});
  r->push_back({"embedding_bag", 2, 4, InferEmbeddingBag, EmbeddingBagMemory});
}

}  // namespace rules
}  // namespace memest
