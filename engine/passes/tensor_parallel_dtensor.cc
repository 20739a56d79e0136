// DTensor's tensor-parallel layers on one rank (engine/passes/tensor_parallel.h, with
// config.parallelism.tensor_layers = dtensor): torch.distributed.tensor.parallel's
// ColwiseParallel, RowwiseParallel (on linears and embeddings), SequenceParallel and
// PrepareModuleInput as torchtitan's plan applies them, and loss_parallel. PyTorch 2.15's
// behaviour, measured on the CPU with gloo (docs/parallelism-truth.md section 10):
//
// - A colwise linear reads a Replicate input through from_local (tp_from_local: its backward
//   all-reduces the Partial input gradient into a new tensor, each linear its own), or under
//   sequence parallelism the module input all-gathered once per module by PrepareModuleInput
//   (tp_all_gather of the module's input, which every linear of the module reading it shares and
//   saves: the whole sequence, where Megatron saves the shard and gathers into its global
//   buffer). Both act on the module's input: autocast's casts and the views come after them.
// - A rowwise linear's output is Partial (its bias added inside addmm) and is reduced into a new
//   tensor: a functional all-reduce, or under sequence parallelism a reduce-scatter.
// - funcol's copies: a reduce-scatter along a dim other than 0 copies its input into chunk order
//   first; an all-gather along such a dim gathers along dim 0 and cats.
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

Attrs Sharder::FuncolCopies(int d) {
  // PyTorch 2.15's _maybe_view_chunk_cat views instead of copying when every dim before the
  // gathered one holds one; earlier 2.x releases always cat: counted, whatever the batch.
  return Attrs{{"scatter_copy", int64_t{d != 0}}, {"gather_copy", int64_t{d != 0}}};
}

int Sharder::ModuleInput(int x, std::vector<int>* chain) const {
  int base = x;
  while (g_.tensors[base].producer >= 0) {
    const Op& p = g_.ops[g_.tensors[base].producer];
    if (!IsView(p.kind) && p.kind != "to") break;
    // A view may move the split dim ([b, s/t, h] -> [b s/t, h]); what must stay is its kind.
    const Split& in = split_[p.inputs.empty() ? base : p.inputs[0]];
    if (p.inputs.empty() || in.none() != split_[x].none() || in.sequence != split_[x].sequence) break;
    chain->push_back(g_.tensors[base].producer);
    base = p.inputs[0];
  }
  return base;
}

StatusOr<int> Sharder::ColumnInput(int i, int x, GraphBuilder& b, const std::vector<int>& map) {
  std::vector<int> chain;  // the views and casts from the module input to x, x's producer first
  const int base = ModuleInput(x, &chain);
  int y = -1;
  if (split_[x].sequence) {
    // PrepareModuleInput on the linear's parent module: one gather per module and input.
    const std::string& scope = g_.ops[i].scope;
    const size_t dot = scope.rfind('.');
    std::pair<int, std::string> key{base, dot == std::string::npos ? "" : scope.substr(0, dot)};
    auto it = gathered_.find(key);
    if (it == gathered_.end()) {
      const int d = split_[base].dim;
      Attrs attrs = FuncolCopies(d);
      attrs["tp"] = t_;
      attrs["dim"] = int64_t{d};
      const int gathered = b.Add1("tp_all_gather", {map[base]}, std::move(attrs));
      // The module's forward holds its redistributed input as an argument until it returns
      // (under autocast its linears save their casts, not it).
      if (!key.second.empty()) module_holds_.push_back({gathered, key.second});
      it = gathered_.emplace(std::move(key), gathered).first;
      ++view_->collectives;
    }
    y = it->second;
  } else {
    y = b.Add1("tp_from_local", {map[base]}, {{"tp", t_}});
  }
  // Replayed on the whole tensor for this reader (autocast casts inside the linear, after the
  // input hook; the shard's own cast, now unread, is a transient over-count).
  for (auto c = chain.rbegin(); c != chain.rend(); ++c) {
    const Op& v = g_.ops[*c];
    y = b.Add1(v.kind, {y}, v.attrs);
  }
  if (!b.ok()) return b.status();
  return y;
}

void Sharder::ReleaseModuleHolds(int i, GraphBuilder& b) {
  for (size_t k = 0; k < module_holds_.size();) {
    if (ScopeWithin(g_.ops[i].scope, module_holds_[k].second)) {
      ++k;
      continue;
    }
    b.HoldUntilLastOp(module_holds_[k].first);  // the module's last op has run
    module_holds_.erase(module_holds_.begin() + static_cast<std::ptrdiff_t>(k));
  }
}

Status Sharder::DTensorLinear(int i, GraphBuilder& b, std::vector<int>& map, bool conv1d) {
  const Op& op = g_.ops[i];
  const auto [xi, wi, bias] = SlotsOf(op, conv1d);
  const Split w = In(i, wi);
  const int r = Rank(op.inputs[xi]);
  const bool column = w.dim == (conv1d ? 1 : 0);
  std::vector<int> inputs = MappedInputs(op, map);
  MEMEST_RETURN_IF_ERROR(CheckLinear(i, conv1d));
  if (column) {
    MEMEST_ASSIGN_OR_RETURN(inputs[xi], ColumnInput(i, op.inputs[xi], b, map));
    Split y{r - 1, false};
    y.parts = w.parts;
    MEMEST_RETURN_IF_ERROR(AddChecked(i, b, map, op.kind, std::move(inputs), op.attrs, {y}));
    if (w.gather) {  // ColwiseParallel(output_layouts=Replicate()): the features gathered
      const int o = op.outputs[0];
      // The gradient back to Shard(-1) is the rank's chunk (made contiguous: the new shard),
      // not a reduce-scatter: no chunk-order copy.
      Attrs attrs = FuncolCopies(r - 1);
      attrs["scatter_copy"] = int64_t{0};
      attrs["tp"] = t_;
      attrs["dim"] = int64_t{r - 1};
      map[o] = b.Add1("tp_all_gather", {map[o]}, std::move(attrs));
      split_[o] = Split{};
      ++view_->collectives;
    }
    return b.status();
  }
  int out = b.Add1(op.kind, std::move(inputs), op.attrs);  // Partial
  ++view_->collectives;
  Split s;
  if (sp_) {
    const int d = SequenceDimOf(r);
    Attrs attrs = FuncolCopies(sequence_layout_.size() >= 3 ? sequence_dim_ : d);
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
  const int w = op.inputs[0];
  if (g_.tensors[w].role != TensorRole::kParameter) {
    return Refuse(i, "its vocabulary-split table is not a parameter itself (a cast of one): "
                     "DTensor's whole-table gradient through the cast is not modelled");
  }
  for (size_t k = 0; k < g_.ops.size(); ++k) {
    if (static_cast<int>(k) == i) continue;
    for (int in : g_.ops[k].inputs) {
      if (in == w) {
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
    for (auto& [k, v] : FuncolCopies(d)) attrs[k] = v;
    attrs["scatter_dim"] = int64_t{d};
    s = Split{d, true};
    if (sequence_layout_.empty()) sequence_layout_ = whole;
  }
  ++view_->collectives;
  if (g_.loss >= 0 && g_.tensors[w].requires_grad) {  // training: the .grad is the whole table
    view_->whole_grads.push_back({map[w], Bytes(g_.tensors[w].shape, b.tensor(map[w]).dtype)});
  }
  return AddChecked(i, b, map, "dtensor_embedding", {map[op.inputs[0]], map[op.inputs[1]]},
                    std::move(attrs), {s});
}

}  // namespace tensor_parallel
}  // namespace memest
