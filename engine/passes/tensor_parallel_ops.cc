// How each op runs on one tensor-parallel rank: which dim of its outputs is split, with which
// attributes, and the linears that become Megatron's (engine/passes/tensor_parallel.h).
#include <algorithm>
#include <string_view>

#include "engine/ir/text.h"
#include "engine/passes/tensor_parallel_internal.h"

namespace memest {
namespace tensor_parallel {

bool IsElementwise(std::string_view k) {
  static constexpr std::string_view kKinds[] = {
      "add", "sub", "mul", "div", "add_", "mul_", "masked_fill", "where", "maximum", "minimum",
      "relu", "silu", "hardswish", "hardsigmoid", "sigmoid", "tanh", "hardtanh", "gelu", "exp",
      "rsqrt", "sqrt", "neg", "log1p", "log2", "floor", "pow", "dropout", "to", "contiguous",
      "clone", "fill_", "clamp", "copy_", "eq", "ne", "lt", "le", "gt", "ge", "bitwise_and",
      "bitwise_or", "stochastic_depth"};
  for (std::string_view kind : kKinds) {
    if (k == kind) return true;
  }
  return false;
}

namespace {

// Reductions and normalisations over some dims: a split there would mix the ranks' values.
bool IsReduction(std::string_view k) {
  return k == "sum" || k == "mean" || k == "softmax" || k == "log_softmax" || k == "cumsum" ||
         k == "layer_norm" || k == "rms_norm" || k == "norm";
}

int64_t Int(const Attrs& attrs, std::string_view name, int64_t fallback) {
  StatusOr<int64_t> v = IntAttr(attrs, name, fallback, "");
  return v.ok() ? *v : fallback;
}

int Normalize(int64_t dim, int rank) { return static_cast<int>(dim < 0 ? dim + rank : dim); }

}  // namespace

int ReshapedDim(const Shape& in, const Shape& out, int d, int64_t t, int prefer) {
  auto strides = [](const Shape& s) {
    std::vector<long double> st(s.size(), 1);
    for (int k = static_cast<int>(s.size()) - 2; k >= 0; --k) st[k] = st[k + 1] * s[k + 1];
    return st;
  };
  const std::vector<long double> si = strides(in), so = strides(out);
  const long double lo = si[d], hi = si[d] * in[d], top = hi / t;
  int best = -1;
  for (int k = 0; k < static_cast<int>(out.size()); ++k) {
    if (out[k] <= 1 || out[k] % t != 0) continue;
    const long double klo = so[k], khi = so[k] * out[k];
    if (khi <= lo || klo >= hi) continue;  // holds none of d
    if (k == prefer) return k;
    if (best < 0 && klo <= top && khi >= hi) best = k;
  }
  return best;
}

Sharder::Sharder(const Graph& graph, int64_t t, bool sequence_parallel, int sequence_dim,
                 std::vector<Split> split, int scatter, TensorParallelView* view)
    : g_(graph), t_(t), sp_(sequence_parallel), sequence_dim_(sequence_dim),
      split_(std::move(split)), scatter_(scatter), view_(view) {
  if (scatter_ >= 0) sequence_layout_ = g_.tensors[scatter_].shape;
  for (size_t t = 0; t < split_.size() && sequence_layout_.empty(); ++t) {
    if (split_[t].sequence) sequence_layout_ = g_.tensors[t].shape;
  }
}

std::string Sharder::Where(int i) const {
  const Op& op = g_.ops[i];
  return "op " + std::to_string(i) + " (" + Escape(op.kind) +
         (op.scope.empty() ? std::string() : " in " + Quote(op.scope)) + ")";
}

Status Sharder::Refuse(int i, const std::string& why) const {
  return InvalidArgument(Where(i) + ": " + why);
}

int Sharder::SequenceDimOf(int rank) const { return rank >= 3 ? sequence_dim_ : 0; }

bool Sharder::Emit(int i, GraphBuilder& b, std::vector<int>& map) {
  b.SetLazyErrorContext([this, i] { return Where(i); });
  if (dtensor_) ReleaseModuleHolds(i, b);
  Status s = EmitOp(i, b, map);
  if (!s.ok()) b.Fail(s);
  b.SetErrorContext("");
  if (b.ok() && scatter_ >= 0) {
    for (int o : g_.ops[i].outputs) {
      if (o != scatter_ || split_[o].sequence) continue;  // DTensor's embedding scattered it
      const int d = SequenceDimOf(Rank(o));
      map[o] = b.Add1("tp_scatter", {map[o]}, {{"tp", t_}, {"dim", int64_t{d}}});
      split_[o] = Split{d, true};
      ++view_->collectives;
    }
  }
  return true;
}

Status Sharder::EmitOp(int i, GraphBuilder& b, std::vector<int>& map) {
  const Op& op = g_.ops[i];
  std::vector<int> inputs = MappedInputs(op, map);
  if (sp_) NoteSequenceParallelParams(i, map);
  if (!moe_of_op_.empty() && moe_of_op_[i] >= 0) {
    bool done = false;
    MEMEST_RETURN_IF_ERROR(MoeOp(i, b, map, &done));
    if (done) return Status::Ok();
  }
  if (dtensor_ && op.kind == "linear" && !In(i, 1).none()) return DTensorLinear(i, b, map, false);
  if (dtensor_ && op.kind == "addmm" && !In(i, 2).none()) return DTensorLinear(i, b, map, true);
  if (dtensor_ && op.kind == "embedding" && !In(i, 0).none()) return DTensorEmbedding(i, b, map);
  if (op.kind == "linear" && !In(i, 1).none()) return Linear(i, b, map, false);
  if (op.kind == "addmm" && !In(i, 2).none()) return Linear(i, b, map, true);
  if (op.kind == "embedding" && !In(i, 0).none()) return VocabEmbedding(i, b, map);
  if (op.kind == "cross_entropy" && In(i, 0) == Split{1, false}) return VocabCrossEntropy(i, b, map);
  if (context_ && op.kind == "scaled_dot_product_attention" && !In(i, 0).none()) {
    return RingAttention(i, b, map);
  }
  std::vector<Split> splits;
  Attrs attrs = op.attrs;
  MEMEST_RETURN_IF_ERROR(Propagate(i, &splits, &attrs));
  if ((context_ || sp_) && IsElementwise(op.kind) && !splits.empty() && !splits[0].none()) {
    SliceToShare(i, splits[0], b, &inputs);
  }
  return AddChecked(i, b, map, op.kind, std::move(inputs), std::move(attrs), splits);
}

Status Sharder::AddChecked(int i, GraphBuilder& b, std::vector<int>& map, std::string_view kind,
                           std::vector<int> inputs, Attrs attrs, const std::vector<Split>& splits) {
  const Op& op = g_.ops[i];
  std::vector<int> outs = b.Add(kind, std::move(inputs), std::move(attrs));
  if (!b.ok()) return b.status();
  for (size_t k = 0; k < op.outputs.size() && k < outs.size(); ++k) {
    const int o = op.outputs[k];
    Shape want = g_.tensors[o].shape;
    if (!splits[k].none()) want[splits[k].dim] /= Parts(splits[k]);
    if (b.shape(outs[k]) != want) {
      return Refuse(i, "on a rank its output " + std::to_string(k) + " would be " +
                           ShapeToString(b.shape(outs[k])) + ", not " + ShapeToString(want) +
                           " (the whole " + ShapeToString(g_.tensors[o].shape) +
                           " split over " + std::to_string(t_) + " ranks)");
    }
    map[o] = outs[k];
    split_[o] = splits[k];
  }
  return Status::Ok();
}

Status Sharder::Propagate(int i, std::vector<Split>* out, Attrs* attrs) {
  const Op& op = g_.ops[i];
  out->assign(op.outputs.size(), Split{});
  bool any = false;
  for (size_t k = 0; k < op.inputs.size(); ++k) any |= !In(i, k).none();
  if (!any) return Status::Ok();
  const std::string_view kind = op.kind;
  if (IsElementwise(kind)) return Elementwise(i, out);
  if (kind == "addmm" && In(i, 0).none() && In(i, 2).none() && In(i, 1).dim == 0) {
    out->assign(op.outputs.size(), In(i, 1));  // HF Conv1D over a split activation's rows
    return Status::Ok();
  }
  if (kind == "embedding" && In(i, 0).none()) {  // split indices: the rows follow them
    out->assign(op.outputs.size(), In(i, 1));
    return Status::Ok();
  }
  if ((kind == "cross_entropy" || kind == "nll_loss") && In(i, 0).sequence && In(i, 0).dim == 0 &&
      In(i, 1) == In(i, 0)) {  // the rank's rows and their targets: a share of the loss
    StatusOr<std::string> reduction = StringAttr(op.attrs, "reduction", "mean", "");
    if (reduction.ok() && *reduction == "none") out->assign(op.outputs.size(), In(i, 0));
    return Status::Ok();
  }
  if (kind == "megatron_linear" || kind == "tp_all_reduce" || kind == "tp_reduce_scatter" ||
      kind == "tp_scatter") {  // tensor parallelism's, over a sequence context parallelism split
    if (!In(i, 0).sequence) return Refuse(i, "reads a tensor split other than by the sequence");
    out->assign(op.outputs.size(), In(i, 0));
    return Status::Ok();
  }
  if (kind == "matmul" || kind == "bmm" || kind == "baddbmm") return Matmul(i, out);
  if (kind == "view" || kind == "reshape") return Reshape(i, out, attrs);
  const Split x = In(i, 0);
  const int r = Rank(op.inputs[0]);
  for (size_t k = 1; k < op.inputs.size(); ++k) {
    if (!In(i, k).none() && kind != "cat" && kind != "scaled_dot_product_attention" &&
        kind != "cp_attention" && kind != "layer_norm") {
      return Refuse(i, "reads a split tensor as its input " + std::to_string(k) +
                           ", which the tensor-parallel pass does not model");
    }
  }
  if (IsReduction(kind)) return Reduction(i, out);
  Split y = x;
  if (kind == "transpose") {
    const int a = Normalize(Int(op.attrs, "dim0", 0), r), c = Normalize(Int(op.attrs, "dim1", 1), r);
    y.dim = x.dim == a ? c : x.dim == c ? a : x.dim;
  } else if (kind == "permute") {
    StatusOr<std::vector<int64_t>> dims = IntsAttr(op.attrs, "dims", {}, "");
    if (!dims.ok()) return dims.status();
    for (size_t k = 0; k < dims->size(); ++k) {
      if (Normalize((*dims)[k], r) == x.dim) y.dim = static_cast<int>(k);
    }
  } else if (kind == "unsqueeze") {
    y.dim += Normalize(Int(op.attrs, "dim", 0), r + 1) <= x.dim;
  } else if (kind == "squeeze") {
    const int d = Normalize(Int(op.attrs, "dim", 0), r);
    if (d == x.dim) return Refuse(i, "squeezes its split dim");
    y.dim -= d < x.dim;
  } else if (kind == "flatten") {
    const int a = Normalize(Int(op.attrs, "start_dim", 0), r), e = Normalize(Int(op.attrs, "end_dim", -1), r);
    y.dim = x.dim < a ? x.dim : x.dim <= e ? a : x.dim - (e - a);
  } else if (kind == "expand") {
    StatusOr<std::vector<int64_t>> shape = IntsAttr(op.attrs, "shape", {}, "");
    if (!shape.ok()) return shape.status();
    std::vector<int64_t> s = *shape;
    y.dim = x.dim + static_cast<int>(s.size()) - r;
    if (s[y.dim] != -1) s[y.dim] /= Parts(x);
    (*attrs)["shape"] = s;
  } else if (kind == "split" || kind == "slice") {
    if (Normalize(Int(op.attrs, "dim", 0), r) == x.dim) {
      const int64_t whole = g_.tensors[op.inputs[0]].shape[x.dim];
      if (kind == "split") {
        StatusOr<std::vector<int64_t>> sizes = IntsAttr(op.attrs, "sizes", {}, "");
        if (!sizes.ok()) return sizes.status();
        std::vector<int64_t> s = *sizes;
        const int64_t parts = Parts(x);
        for (int64_t& v : s) {
          if (v % parts != 0) return Refuse(i, "splits its split dim into sizes that do not divide by " + std::to_string(parts));
          v /= parts;
        }
        (*attrs)["sizes"] = s;
      } else {
        const int64_t start = std::clamp<int64_t>(Int(op.attrs, "start", 0), -whole, whole);
        const int64_t end = std::clamp<int64_t>(Int(op.attrs, "end", whole), -whole, whole);
        const int64_t parts = Parts(x);
        if (start % parts != 0 || end % parts != 0 || Int(op.attrs, "step", 1) != 1) {
          return Refuse(i, "slices its split dim at bounds that do not divide by " + std::to_string(parts));
        }
        (*attrs)["start"] = start / parts;
        (*attrs)["end"] = end / parts;
      }
    }
  } else if (kind == "linear") {  // a replicated weight over a split activation's rows
    if (x.dim == r - 1) {
      return Refuse(i, "a linear whose weight the plan does not split reads split features (make "
                       "it rowwise in config.parallelism.tensor_plan)");
    }
  } else if (kind == "cat") {
    for (size_t k = 1; k < op.inputs.size(); ++k) {
      if (In(i, k) != x) return Refuse(i, "concatenates tensors split differently");
    }
  } else if (kind == "mla_profile_attention") {  // vLLM's latent attention: the rank's heads
    if (x.dim != 2) return Refuse(i, "latent attention over a split other than its query's heads");
  } else if (kind == "scaled_dot_product_attention" || kind == "cp_attention") {
    if (x.dim >= r - 2) return Refuse(i, "attends over a split sequence or head dim");
    for (size_t k = 1; k < 3 && k < op.inputs.size(); ++k) {
      if (In(i, k) != x) return Refuse(i, "its query, key and value are split differently");
    }
  } else {
    return Refuse(i, std::string("reads a tensor split along dim ") + std::to_string(x.dim) +
                         (x.sequence ? " (the sequence, by sequence parallelism)"
                                     : " (by a column-parallel linear or a split embedding)") +
                         ", and the pass does not know how this op runs on a rank's share");
  }
  out->assign(op.outputs.size(), y);
  return Status::Ok();
}

// A norm, softmax or reduction: refused across a split dim, except a loss's sum or mean
// over a sequence split (each rank's share of it).
Status Sharder::Reduction(int i, std::vector<Split>* out) {
  const Op& op = g_.ops[i];
  const std::string_view kind = op.kind;
  const Split x = In(i, 0);
  const int r = Rank(op.inputs[0]);
  Split y = x;
  std::vector<int> dims;
  if (kind == "layer_norm") {
    const int n = static_cast<int>(Int(op.attrs, "normalized_ndim", 1));
    for (int d = r - n; d < r; ++d) dims.push_back(d);
    for (size_t k = 1; k < op.inputs.size(); ++k) {
      if (!In(i, k).none()) return Refuse(i, "its weight or bias is split");
    }
  } else if (kind == "rms_norm") {
    dims.push_back(r - 1);
  } else if (kind == "sum" || kind == "mean" || kind == "norm") {
    StatusOr<std::vector<int64_t>> ds = IntsAttr(op.attrs, "dim", {}, "");
    if (!ds.ok() || ds->empty()) {
      for (int d = 0; d < r; ++d) dims.push_back(d);
    } else {
      for (int64_t d : *ds) dims.push_back(Normalize(d, r));
    }
  } else {
    dims.push_back(Normalize(Int(op.attrs, "dim", -1), r));
  }
  const bool reduced = std::find(dims.begin(), dims.end(), x.dim) != dims.end();
  const bool shrinks = kind == "sum" || kind == "mean" || kind == "norm";
  if (reduced && !(x.sequence && shrinks)) {
    return Refuse(i, std::string("works across dim ") + std::to_string(x.dim) + ", which " +
                         (x.sequence ? "sequence parallelism splits"
                                     : "a column-parallel linear split (only a row-parallel "
                                       "linear may read it whole)"));
  }
  if (shrinks && reduced) {  // a rank's share of a loss over the sequence
    y = Split{};
  } else if (shrinks && Int(op.attrs, "keepdim", 0) == 0) {
    int before = 0;
    for (int d : dims) before += d < x.dim;
    y.dim -= before;
  }
  (*out)[0] = y;
  return Status::Ok();
}

Status Sharder::Elementwise(int i, std::vector<Split>* out) {
  const Op& op = g_.ops[i];
  const int r = Rank(op.outputs[0]);
  Split y;
  for (size_t k = 0; k < op.inputs.size(); ++k) {
    Split s = In(i, k);
    if (s.none()) continue;
    s.dim += r - Rank(op.inputs[k]);
    if (!y.none() && y != s) return Refuse(i, "combines tensors split along different dims");
    y = s;
  }
  out->assign(op.outputs.size(), y);
  return Status::Ok();
}

Status Sharder::Matmul(int i, std::vector<Split>* out) {
  const Op& op = g_.ops[i];
  const size_t first = op.kind == "baddbmm" ? 1 : 0;  // baddbmm(self, a, b)
  const int ra = Rank(op.inputs[first]), rb = Rank(op.inputs[first + 1]), r = Rank(op.outputs[0]);
  if (ra < 2 || rb < 2) return Refuse(i, "a vector product over a split tensor is not modelled");
  const Split a = In(i, first), b = In(i, first + 1);
  if ((!a.none() && a.dim == ra - 1) || (!b.none() && b.dim == rb - 2)) {
    return Refuse(i, "contracts a split dim: only a row-parallel linear may (give its weight "
                     "to config.parallelism.tensor_plan as rowwise)");
  }
  Split y;
  auto merge = [&](Split s) -> Status {
    if (s.none()) return Status::Ok();
    if (!y.none() && y != s && context_) {
      return Refuse(i, "attention in its math form over a split sequence: context parallelism "
                       "needs a fused kernel (config.attention sdpa or flash)");
    }
    if (!y.none() && y != s) return Refuse(i, "multiplies tensors split along different dims");
    y = s;
    return Status::Ok();
  };
  if (!a.none()) MEMEST_RETURN_IF_ERROR(merge(Split{a.dim + r - ra, a.sequence}));
  if (!b.none()) MEMEST_RETURN_IF_ERROR(merge(Split{b.dim == rb - 1 ? r - 1 : b.dim + r - rb, b.sequence}));
  if (first == 1 && !In(i, 0).none()) {
    MEMEST_RETURN_IF_ERROR(merge(Split{In(i, 0).dim + r - Rank(op.inputs[0]), In(i, 0).sequence}));
  }
  out->assign(op.outputs.size(), y);
  return Status::Ok();
}

Status Sharder::Reshape(int i, std::vector<Split>* out, Attrs* attrs) {
  const Op& op = g_.ops[i];
  const Split x = In(i, 0);
  const Shape& in = g_.tensors[op.inputs[0]].shape;
  const Shape& whole = g_.tensors[op.outputs[0]].shape;
  const int prefer = x.sequence ? SequenceDimOf(static_cast<int>(whole.size())) : -1;
  const int64_t parts = Parts(x);
  const int d = ReshapedDim(in, whole, x.dim, parts, prefer);
  if (d < 0) {
    return Refuse(i, "reshapes its split dim " + std::to_string(x.dim) + " of " +
                         ShapeToString(in) + " into " + ShapeToString(whole) +
                         ", where no dim can hold a 1/" + std::to_string(parts) + " share");
  }
  StatusOr<std::vector<int64_t>> shape = IntsAttr(op.attrs, "shape", {}, "");
  if (!shape.ok()) return shape.status();
  std::vector<int64_t> s = *shape;
  if (s.size() == whole.size() && s[d] != -1) s[d] /= parts;
  (*attrs)["shape"] = s;
  Split y{d, x.sequence};
  y.parts = x.parts;
  out->assign(op.outputs.size(), y);
  return Status::Ok();
}

}  // namespace tensor_parallel
}  // namespace memest
