// DTensor's tensor-parallel layers on one rank (engine/passes/tensor_parallel.h, with
// config.parallelism.tensor_layers = dtensor): torch.distributed.tensor.parallel's
// ColwiseParallel, RowwiseParallel (on linears and embeddings), SequenceParallel and
// PrepareModuleInput as torchtitan's plan applies them, and loss_parallel. PyTorch 2.15's
// behaviour, measured on the CPU with gloo (docs/parallelism-truth.md section 10):
//
// - A colwise linear reads a Replicate input through from_local (tp_from_local: its backward
//   all-reduces the Partial input gradient into a new tensor, each linear its own), or under
//   sequence parallelism the module input all-gathered once by PrepareModuleInput (tp_all_gather
//   of the module's input, which every linear reading it shares and saves: the whole sequence,
//   where Megatron saves the shard and gathers into its global buffer).
// - A rowwise linear's output is Partial (its bias added inside addmm) and is reduced into a new
//   tensor: a functional all-reduce, or under sequence parallelism a reduce-scatter.
// - funcol's copies: a reduce-scatter along a dim other than 0 copies its input into chunk order
//   first; an all-gather along such a dim gathers along dim 0 and cats (unless every dim before
//   the sequence holds one).
// - A rowwise embedding is _MaskPartial's lookup, reduced likewise (dtensor_embedding); its
//   weight's gradient is the whole table on every rank.
// - Norms under SequenceParallel keep Partial gradients, which every optimizer op that reads
//   them all-reduces into a new tensor (no finalize_model_grads flat copy).
#include <algorithm>
#include <string>

#include "engine/passes/tensor_parallel_internal.h"

namespace memest {
namespace tensor_parallel {

namespace {

bool IsView(std::string_view kind) { return kind == "view" || kind == "reshape"; }

}  // namespace

Attrs Sharder::FuncolCopies(const Shape& whole, int d) {
  int64_t before = 1;
  for (int k = 0; k < d && k < static_cast<int>(whole.size()); ++k) before *= whole[k] > 0 ? whole[k] : 1;
  return Attrs{{"scatter_copy", int64_t{d != 0}}, {"gather_copy", int64_t{before > 1}}};
}

StatusOr<int> Sharder::Gathered(int x, GraphBuilder& b, const std::vector<int>& map) {
  std::vector<int> chain;  // the views from the module input to x, outermost first
  int base = x;
  while (g_.tensors[base].producer >= 0) {
    const Op& p = g_.ops[g_.tensors[base].producer];
    if (!IsView(p.kind) || p.inputs.empty() || !split_[p.inputs[0]].sequence) break;
    chain.push_back(g_.tensors[base].producer);
    base = p.inputs[0];
  }
  if (gathered_.empty()) gathered_.assign(g_.tensors.size(), -1);
  if (gathered_[base] < 0) {
    const int d = split_[base].dim;
    Attrs attrs = FuncolCopies(g_.tensors[base].shape, d);
    attrs["tp"] = t_;
    attrs["dim"] = int64_t{d};
    gathered_[base] = b.Add1("tp_all_gather", {map[base]}, std::move(attrs));
    ++view_->collectives;
  }
  int y = gathered_[base];
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
    const Op& v = g_.ops[*it];
    y = b.Add1(v.kind, {y}, v.attrs);
  }
  if (!b.ok()) return b.status();
  return y;
}

Status Sharder::DTensorLinear(int i, GraphBuilder& b, std::vector<int>& map, bool conv1d) {
  const Op& op = g_.ops[i];
  const int xi = conv1d ? 1 : 0, wi = conv1d ? 2 : 1;
  const int bias = conv1d ? 0 : (op.inputs.size() > 2 ? 2 : -1);
  const Split x = In(i, xi), w = In(i, wi);
  const int r = Rank(op.inputs[xi]);
  const bool column = w.dim == (conv1d ? 1 : 0);
  std::vector<int> inputs;
  for (int t : op.inputs) inputs.push_back(map[t]);
  if (column) {
    if (!x.none() && !x.sequence) {
      return Refuse(i, "a column-parallel linear reads features that are already split");
    }
    if (bias >= 0 && In(i, bias) != Split{0, false}) return Refuse(i, "its bias is not split with its weight");
    if (x.sequence) {
      MEMEST_ASSIGN_OR_RETURN(inputs[xi], Gathered(op.inputs[xi], b, map));
    } else {
      inputs[xi] = b.Add1("tp_from_local", {inputs[xi]}, {{"tp", t_}});
    }
    Split y{r - 1, false};
    y.parts = w.parts;
    MEMEST_RETURN_IF_ERROR(AddChecked(i, b, map, op.kind, std::move(inputs), op.attrs, {y}));
    if (w.gather) {  // ColwiseParallel(output_layouts=Replicate()): the features gathered
      const int o = op.outputs[0];
      Attrs attrs = FuncolCopies(g_.tensors[o].shape, r - 1);
      attrs["tp"] = t_;
      attrs["dim"] = int64_t{r - 1};
      map[o] = b.Add1("tp_all_gather", {map[o]}, std::move(attrs));
      split_[o] = Split{};
      ++view_->collectives;
    }
    return b.status();
  }
  if (x != Split{r - 1, false}) {
    return Refuse(i, "a row-parallel linear reads input features that no column-parallel linear "
                     "split (its weight is rowwise in the plan; the linear before it should be "
                     "colwise)");
  }
  if (bias >= 0 && !In(i, bias).none()) return Refuse(i, "a row-parallel linear's bias is split");
  int out = b.Add1(op.kind, std::move(inputs), op.attrs);  // Partial
  ++view_->collectives;
  Split s;
  if (sp_) {
    const int d = SequenceDimOf(r);
    Attrs attrs = sequence_layout_.size() >= 3 ? FuncolCopies(sequence_layout_, sequence_dim_)
                                               : FuncolCopies(g_.tensors[op.outputs[0]].shape, d);
    attrs["tp"] = t_;
    attrs["dim"] = int64_t{d};
    out = b.Add1("tp_reduce_scatter", {out}, std::move(attrs));
    s = Split{d, true};
  } else {
    out = b.Add1("tp_all_reduce", {out}, {{"tp", t_}, {"out_of_place", int64_t{1}}});
  }
  if (!b.ok()) return b.status();
  Shape want = g_.tensors[op.outputs[0]].shape;
  if (!s.none()) want[s.dim] /= t_;
  if (b.shape(out) != want) return Refuse(i, "the row-parallel output's shape is not the whole one's share");
  map[op.outputs[0]] = out;
  split_[op.outputs[0]] = s;
  return Status::Ok();
}

Status Sharder::DTensorEmbedding(int i, GraphBuilder& b, std::vector<int>& map) {
  const Op& op = g_.ops[i];
  if (In(i, 0).dim != 0 || !In(i, 1).none()) {
    return Refuse(i, "only an embedding split by vocabulary (rowwise) is modelled");
  }
  int w = op.inputs[0];
  if (g_.tensors[w].producer >= 0 && g_.ops[g_.tensors[w].producer].kind == "to") {
    w = g_.ops[g_.tensors[w].producer].inputs[0];
  }
  for (size_t k = 0; k < g_.ops.size(); ++k) {
    if (static_cast<int>(k) == i) continue;
    for (int in : g_.ops[k].inputs) {
      if (in == op.inputs[0] || in == w) {
        return Refuse(i, "its vocabulary-split weight is read by " + Where(static_cast<int>(k)) +
                             " as well (tied): DTensor's whole-table gradient meeting a "
                             "sharded one is not modelled");
      }
    }
  }
  const int o = op.outputs[0];
  const Shape& whole = g_.tensors[o].shape;
  // torchtitan's RowwiseParallel(output_layouts=Shard(1)) under sequence parallelism: the lookup
  // is reduce-scattered along the sequence where the split begins (the hidden state entering the
  // first block, or in a model without blocks, the embedding's output).
  const bool scatter = sp_ && (o == scatter_ || scatter_ < 0) && whole.size() >= 3;
  Attrs attrs{{"tp", t_}};
  Split s;
  if (scatter) {
    const int d = SequenceDimOf(static_cast<int>(whole.size()));
    for (auto& [k, v] : FuncolCopies(whole, d)) attrs[k] = v;
    attrs["scatter_dim"] = int64_t{d};
    s = Split{d, true};
    if (sequence_layout_.empty()) sequence_layout_ = whole;
  }
  ++view_->collectives;
  view_->whole_grads.push_back({map[w], Bytes(g_.tensors[w].shape, b.tensor(map[w]).dtype)});
  return AddChecked(i, b, map, "dtensor_embedding", {map[op.inputs[0]], map[op.inputs[1]]},
                    std::move(attrs), {s});
}

}  // namespace tensor_parallel
}  // namespace memest
