// How each op runs on one tensor-parallel rank: which dim of its outputs is split, with which
// attributes, and the linears that become Megatron's (engine/passes/tensor_parallel.h).
#include <algorithm>
#include <string_view>

#include "engine/ir/text.h"
#include "engine/passes/tensor_parallel_internal.h"

namespace memest {
namespace tensor_parallel {

bool IsElementwise(std::string_view k) {
  static const char* const kKinds[] = {
      "add", "sub", "mul", "div", "add_", "mul_", "masked_fill", "where", "maximum", "minimum",
      "relu", "silu", "hardswish", "hardsigmoid", "sigmoid", "tanh", "hardtanh", "gelu", "exp",
      "rsqrt", "sqrt", "neg", "log1p", "log2", "floor", "pow", "dropout", "to", "contiguous",
      "clone", "fill_", "clamp", "copy_", "eq", "ne", "lt", "le", "gt", "ge", "bitwise_and",
      "bitwise_or", "stochastic_depth"};
  for (const char* kind : kKinds) {
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
      split_(std::move(split)), scatter_(scatter), view_(view) {}

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
  b.SetErrorContext(Where(i));
  Status s = EmitOp(i, b, map);
  if (!s.ok()) b.Fail(s);
  b.SetErrorContext("");
  if (b.ok() && scatter_ >= 0) {
    for (int o : g_.ops[i].outputs) {
      if (o != scatter_) continue;
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
  std::vector<int> inputs;
  for (int t : op.inputs) inputs.push_back(map[t]);
  if (sp_) NoteSequenceParallelParams(i, map);
  if (op.kind == "linear" && !In(i, 1).none()) return Linear(i, b, map, false);
  if (op.kind == "addmm" && !In(i, 2).none()) return Linear(i, b, map, true);
  if (op.kind == "embedding" && !In(i, 0).none()) return VocabEmbedding(i, b, map);
  if (op.kind == "cross_entropy" && In(i, 0) == Split{1, false}) return VocabCrossEntropy(i, b, map);
  std::vector<Split> splits;
  Attrs attrs = op.attrs;
  MEMEST_RETURN_IF_ERROR(Propagate(i, &splits, &attrs));
  return AddChecked(i, b, map, op.kind, std::move(inputs), std::move(attrs), splits);
}

// Megatron marks the replicated parameters that sequence-split activations meet (norms,
// row-parallel biases) `sequence_parallel`: their gradients are all-reduced across the group.
void Sharder::NoteSequenceParallelParams(int i, const std::vector<int>& map) {
  const Op& op = g_.ops[i];
  bool sequence = false;
  for (size_t k = 0; k < op.inputs.size(); ++k) sequence |= In(i, k).sequence;
  if (!sequence) return;
  for (int in : op.inputs) {
    int p = in;
    const Tensor& x = g_.tensors[in];
    if (x.producer >= 0 && g_.ops[x.producer].kind == "to") p = g_.ops[x.producer].inputs[0];
    const Tensor& param = g_.tensors[p];
    if (param.role != TensorRole::kParameter || !param.requires_grad || !split_[p].none()) continue;
    std::vector<int>& params = view_->sequence_parallel_params;
    if (std::find(params.begin(), params.end(), map[p]) == params.end()) params.push_back(map[p]);
  }
}

Status Sharder::AddChecked(int i, GraphBuilder& b, std::vector<int>& map, std::string_view kind,
                           std::vector<int> inputs, Attrs attrs, const std::vector<Split>& splits) {
  const Op& op = g_.ops[i];
  std::vector<int> outs = b.Add(kind, std::move(inputs), std::move(attrs));
  if (!b.ok()) return b.status();
  for (size_t k = 0; k < op.outputs.size() && k < outs.size(); ++k) {
    const int o = op.outputs[k];
    Shape want = g_.tensors[o].shape;
    if (!splits[k].none()) want[splits[k].dim] /= t_;
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
  if (kind == "matmul" || kind == "bmm" || kind == "baddbmm") return Matmul(i, out);
  if (kind == "view" || kind == "reshape") return Reshape(i, out, attrs);
  const Split x = In(i, 0);
  const int r = Rank(op.inputs[0]);
  for (size_t k = 1; k < op.inputs.size(); ++k) {
    if (!In(i, k).none() && kind != "cat" && kind != "scaled_dot_product_attention" &&
        kind != "layer_norm") {
      return Refuse(i, "reads a split tensor as its input " + std::to_string(k) +
                           ", which the tensor-parallel pass does not model");
    }
  }
  Split y = x;
  if (IsReduction(kind)) {
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
    if (s[y.dim] != -1) s[y.dim] /= t_;
    (*attrs)["shape"] = s;
  } else if (kind == "split" || kind == "slice") {
    if (Normalize(Int(op.attrs, "dim", 0), r) == x.dim) {
      const int64_t whole = g_.tensors[op.inputs[0]].shape[x.dim];
      if (kind == "split") {
        StatusOr<std::vector<int64_t>> sizes = IntsAttr(op.attrs, "sizes", {}, "");
        if (!sizes.ok()) return sizes.status();
        std::vector<int64_t> s = *sizes;
        for (int64_t& v : s) {
          if (v % t_ != 0) return Refuse(i, "splits its split dim into sizes that do not divide by " + std::to_string(t_));
          v /= t_;
        }
        (*attrs)["sizes"] = s;
      } else {
        const int64_t start = std::clamp<int64_t>(Int(op.attrs, "start", 0), -whole, whole);
        const int64_t end = std::clamp<int64_t>(Int(op.attrs, "end", whole), -whole, whole);
        if (start % t_ != 0 || end % t_ != 0 || Int(op.attrs, "step", 1) != 1) {
          return Refuse(i, "slices its split dim at bounds that do not divide by " + std::to_string(t_));
        }
        (*attrs)["start"] = start / t_;
        (*attrs)["end"] = end / t_;
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
  } else if (kind == "scaled_dot_product_attention") {
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
  const int d = ReshapedDim(in, whole, x.dim, t_, prefer);
  if (d < 0) {
    return Refuse(i, "reshapes its split dim " + std::to_string(x.dim) + " of " +
                         ShapeToString(in) + " into " + ShapeToString(whole) +
                         ", where no dim can hold a 1/" + std::to_string(t_) + " share");
  }
  StatusOr<std::vector<int64_t>> shape = IntsAttr(op.attrs, "shape", {}, "");
  if (!shape.ok()) return shape.status();
  std::vector<int64_t> s = *shape;
  if (s.size() == whole.size() && s[d] != -1) s[d] /= t_;
  (*attrs)["shape"] = s;
  out->assign(op.outputs.size(), Split{d, x.sequence});
  return Status::Ok();
}

// A linear whose weight the plan split: column-parallel (output features) or row-parallel
// (input features), as Megatron runs it. conv1d: HF's Conv1D, addmm(bias, x2d, weight[in, out]).
Status Sharder::Linear(int i, GraphBuilder& b, std::vector<int>& map, bool conv1d) {
  const Op& op = g_.ops[i];
  const int xi = conv1d ? 1 : 0, wi = conv1d ? 2 : 1;
  const int bias = conv1d ? 0 : (op.inputs.size() > 2 ? 2 : -1);
  const Split x = In(i, xi), w = In(i, wi);
  const int r = Rank(op.inputs[xi]);
  const bool column = w.dim == (conv1d ? 1 : 0);
  Attrs attrs{{"tp", t_}};
  if (conv1d) attrs["weight_layout"] = std::string("in_out");
  std::vector<int> inputs{map[op.inputs[xi]], map[op.inputs[wi]]};
  if (column) {
    if (!x.none() && !x.sequence) {
      return Refuse(i, "a column-parallel linear reads features that are already split");
    }
    if (bias >= 0) {
      if (In(i, bias) != Split{0, false}) return Refuse(i, "its bias is not split with its weight");
      inputs.push_back(map[op.inputs[bias]]);
    }
    if (x.sequence) {
      attrs["gather_dim"] = int64_t{x.dim};
      attrs["input_grad"] = std::string("reduce_scatter");
      int64_t gathered = Bytes(g_.tensors[op.inputs[xi]].shape, b.tensor(map[op.inputs[xi]]).dtype);
      if (view_->first_gather_op < 0) view_->first_gather_op = b.num_ops();
      view_->global_buffer_bytes = std::max(view_->global_buffer_bytes, gathered);
      ++view_->collectives;
    } else {
      attrs["input_grad"] = std::string("all_reduce");
    }
    return AddChecked(i, b, map, "megatron_linear", std::move(inputs), std::move(attrs),
                      {Split{r - 1, false}});
  }
  if (x != Split{r - 1, false}) {
    return Refuse(i, "a row-parallel linear reads input features that no column-parallel linear "
                     "split (its weight is rowwise in the plan; the linear before it should be "
                     "colwise)");
  }
  if (bias >= 0 && !In(i, bias).none()) return Refuse(i, "a row-parallel linear's bias is split");
  if (bias >= 0 && sp_ && g_.tensors[op.inputs[bias]].requires_grad) {  // meets the scattered output
    std::vector<int>& params = view_->sequence_parallel_params;
    const int p = map[op.inputs[bias]];
    if (std::find(params.begin(), params.end(), p) == params.end()) params.push_back(p);
  }
  std::vector<int> y = b.Add("megatron_linear", std::move(inputs), std::move(attrs));
  if (!b.ok()) return b.status();
  int out = y[0];
  Split s;
  ++view_->collectives;
  if (sp_) {
    const int d = SequenceDimOf(r);
    out = b.Add1("tp_reduce_scatter", {out}, {{"tp", t_}, {"dim", int64_t{d}}});
    s = Split{d, true};
  } else {
    out = b.Add1("tp_all_reduce", {out}, {{"tp", t_}});
  }
  if (bias < 0) {
    Shape want = g_.tensors[op.outputs[0]].shape;
    if (!s.none()) want[s.dim] /= t_;
    if (!b.ok()) return b.status();
    if (b.shape(out) != want) return Refuse(i, "the row-parallel output's shape is not the whole one's share");
    map[op.outputs[0]] = out;
    split_[op.outputs[0]] = s;
    return Status::Ok();
  }
  return AddChecked(i, b, map, "add", {out, map[op.inputs[bias]]}, {}, {s});
}

// VocabParallelEmbedding: the rank's rows looked up, then all-reduced in place (each token's
// row lives on one rank; the others contributed zeros).
Status Sharder::VocabEmbedding(int i, GraphBuilder& b, std::vector<int>& map) {
  const Op& op = g_.ops[i];
  if (In(i, 0).dim != 0 || !In(i, 1).none()) return Refuse(i, "only an embedding split by vocabulary (rowwise) is modelled");
  const int y = b.Add1("vocab_parallel_embedding", {map[op.inputs[0]], map[op.inputs[1]]}, {{"tp", t_}});
  view_->collectives += 1;
  return AddChecked(i, b, map, "tp_all_reduce", {y}, {{"tp", t_}}, {Split{}});
}

// The loss over logits split by vocabulary (a column-parallel head): Megatron's
// vocab_parallel_cross_entropy gives each token's loss, reduced as the op asked.
Status Sharder::VocabCrossEntropy(int i, GraphBuilder& b, std::vector<int>& map) {
  const Op& op = g_.ops[i];
  if (Rank(op.inputs[0]) != 2 || !In(i, 1).none()) {
    return Refuse(i, "a loss over logits split by vocabulary is modelled for [tokens, vocabulary] "
                     "logits only");
  }
  StatusOr<std::string> reduction = StringAttr(op.attrs, "reduction", "mean", "");
  if (!reduction.ok()) return reduction.status();
  view_->collectives += 3;  // the max, the predicted logits and the sum of exponentials
  if (*reduction == "none") {
    return AddChecked(i, b, map, "vocab_parallel_cross_entropy",
                      {map[op.inputs[0]], map[op.inputs[1]]}, {{"tp", t_}}, {Split{}});
  }
  const int loss = b.Add1("vocab_parallel_cross_entropy", {map[op.inputs[0]], map[op.inputs[1]]}, {{"tp", t_}});
  return AddChecked(i, b, map, *reduction == "sum" ? "sum" : "mean", {loss}, {}, {Split{}});
}

}  // namespace tensor_parallel
}  // namespace memest
