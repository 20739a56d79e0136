// Megatron-LM's layers on one tensor-parallel rank (engine/passes/tensor_parallel.h): its
// column- and row-parallel linears with their collectives, the vocabulary-parallel embedding and
// cross-entropy, and the parameters sequence parallelism all-reduces.
#include <algorithm>
#include <string>

#include "engine/passes/tensor_parallel_internal.h"

namespace memest {
namespace tensor_parallel {

// Megatron marks the replicated parameters that sequence-split activations meet (norms,
// row-parallel biases) `sequence_parallel`: their gradients are all-reduced across the group.
void Sharder::NoteSequenceParallelParams(int i, const std::vector<int>& map) {
  const Op& op = g_.ops[i];
  bool sequence = false;
  for (size_t k = 0; k < op.inputs.size(); ++k) sequence |= In(i, k).sequence;
  if (!sequence) return;
  for (int in : op.inputs) {
    const int p = UncastOf(g_, in);
    const Tensor& param = g_.tensors[p];
    if (param.role != TensorRole::kParameter || !param.requires_grad || !split_[p].none()) continue;
    std::vector<int>& params = view_->sequence_parallel_params;
    if (std::find(params.begin(), params.end(), map[p]) == params.end()) params.push_back(map[p]);
  }
}

// What either layers refuse of a linear's splits: a column-parallel linear reading features
// already split, or whose bias is not split with its weight; a row-parallel one reading input
// features no column-parallel linear split, or whose bias is split.
Status Sharder::CheckLinear(int i, bool conv1d) const {
  const Op& op = g_.ops[i];
  const auto [xi, wi, bias] = SlotsOf(op, conv1d);
  const Split x = In(i, xi);
  if (In(i, wi).dim == (conv1d ? 1 : 0)) {
    if (!x.none() && !x.sequence) {
      return Refuse(i, "a column-parallel linear reads features that are already split");
    }
    if (bias >= 0 && In(i, bias) != Split{0, false}) return Refuse(i, "its bias is not split with its weight");
    return Status::Ok();
  }
  if (x != Split{Rank(op.inputs[xi]) - 1, false}) {
    return Refuse(i, "a row-parallel linear reads input features that no column-parallel linear "
                     "split (its weight is rowwise in the plan; the linear before it should be "
                     "colwise)");
  }
  if (bias >= 0 && !In(i, bias).none()) return Refuse(i, "a row-parallel linear's bias is split");
  return Status::Ok();
}

// A linear whose weight the plan split: column-parallel (output features) or row-parallel
// (input features), as Megatron runs it. conv1d: HF's Conv1D, addmm(bias, x2d, weight[in, out]).
Status Sharder::Linear(int i, GraphBuilder& b, std::vector<int>& map, bool conv1d) {
  const Op& op = g_.ops[i];
  const auto [xi, wi, bias] = SlotsOf(op, conv1d);
  const Split x = In(i, xi), w = In(i, wi);
  const int r = Rank(op.inputs[xi]);
  const bool column = w.dim == (conv1d ? 1 : 0);
  Attrs attrs{{"tp", t_}};
  if (conv1d) attrs["weight_layout"] = std::string("in_out");
  std::vector<int> inputs{map[op.inputs[xi]], map[op.inputs[wi]]};
  MEMEST_RETURN_IF_ERROR(CheckLinear(i, conv1d));
  if (column) {
    if (bias >= 0) inputs.push_back(map[op.inputs[bias]]);
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
    Split y{r - 1, false};
    y.parts = w.parts;  // replicated key-value heads keep the weight's shares
    MEMEST_RETURN_IF_ERROR(AddChecked(i, b, map, "megatron_linear", std::move(inputs),
                                      std::move(attrs), {y}));
    if (w.gather) {
      const int y = op.outputs[0];
      map[y] = b.Add1("tp_all_gather", {map[y]}, {{"tp", t_}, {"dim", int64_t{r - 1}}});
      split_[y] = Split{};
      ++view_->collectives;
    }
    return b.status();
  }
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
  // DTensor: F.cross_entropy under loss_parallel() (engine/rules/dtensor.cc).
  const char* kind = dtensor_ ? "loss_parallel_cross_entropy" : "vocab_parallel_cross_entropy";
  if (dtensor_ && Rank(op.inputs[1]) != 1) {
    return Refuse(i, "loss_parallel is modelled for [tokens, vocabulary] logits and [tokens] targets");
  }
  Attrs attrs{{"tp", t_}};
  if (dtensor_ && HasAttr(op.attrs, "nll_float32")) attrs["nll_float32"] = op.attrs.at("nll_float32");
  if (*reduction == "none") {
    return AddChecked(i, b, map, kind, {map[op.inputs[0]], map[op.inputs[1]]}, std::move(attrs), {Split{}});
  }
  const int loss = b.Add1(kind, {map[op.inputs[0]], map[op.inputs[1]]}, std::move(attrs));
  return AddChecked(i, b, map, *reduction == "sum" ? "sum" : "mean", {loss}, {}, {Split{}});
}

// Context parallelism's attention: q, k and v hold the rank's share of the sequence; the ring
// brings the others' keys and values (cp_attention, engine/rules/parallel.cc).
Status Sharder::RingAttention(int i, GraphBuilder& b, std::vector<int>& map) {
  const Op& op = g_.ops[i];
  if (op.inputs.size() > 3) {
    return Refuse(i, "attention with a mask tensor is not modelled with context parallelism");
  }
  const Split q = In(i, 0);
  if (Rank(op.inputs[0]) != 4 || q.dim != 2 || In(i, 1) != q || In(i, 2) != q) {
    return Refuse(i, "context parallelism splits attention's queries, keys and values along the "
                     "sequence ([B, H, L, D], dim 2); these are split otherwise");
  }
  StatusOr<int64_t> causal = IntAttr(op.attrs, "is_causal", 0, "");
  Attrs attrs{{"cp", t_}, {"is_causal", causal.ok() ? *causal : int64_t{0}}};
  view_->collectives += 1;
  return AddChecked(i, b, map, "cp_attention",
                    {map[op.inputs[0]], map[op.inputs[1]], map[op.inputs[2]]}, std::move(attrs), {q});
}

void Sharder::SliceToShare(int i, const Split& y, GraphBuilder& b, std::vector<int>* inputs) {
  const Op& op = g_.ops[i];
  const int r = Rank(op.outputs[0]);
  const int64_t whole = g_.tensors[op.outputs[0]].shape[y.dim];
  for (size_t k = 0; k < op.inputs.size(); ++k) {
    if (!In(i, k).none()) continue;
    // Sequence parallelism: a buffer indexed by position (a per-position table added to a
    // sequence-split activation) is read at the rank's positions.
    if (!context_ && (!y.sequence || g_.tensors[op.inputs[k]].role != TensorRole::kBuffer)) continue;
    const int d = y.dim - (r - Rank(op.inputs[k]));
    if (d < 0 || g_.tensors[op.inputs[k]].shape[d] != whole || whole <= 1) continue;
    (*inputs)[k] = b.Add1("slice", {(*inputs)[k]},
                          {{"dim", int64_t{d}}, {"start", int64_t{0}}, {"end", whole / t_}});
  }
}

}  // namespace tensor_parallel
}  // namespace memest
