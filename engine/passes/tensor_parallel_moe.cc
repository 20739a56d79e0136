// Megatron-LM's MoELayer on one tensor-parallel rank (engine/passes/tensor_parallel.h), as
// megatron/core/transformer/moe/{moe_layer,token_dispatcher,experts}.py run it at d98e8a64 with
// the expert-tensor-parallel group the tensor group (expert_tensor_parallel_size defaults to
// tensor_model_parallel_size). Sequence parallelism is required (MoELayer.forward raises in
// training without it). The rank's share of the sequence is its tokens: it routes and permutes
// them on its own (the router's weight is replicated, its gradient all-reduced as a
// `sequence_parallel` parameter), sends them through the expert-parallel all-to-all, then
// dispatch_postprocess all-gathers what the group's ranks received (gather_from_sequence_
// parallel_region over the tensor group: every rank's experts see every token routed to them
// within the group), the experts run with their linear_fc1 split by columns and linear_fc2 by
// rows without communicating (explicit_expert_comm: fc2's output is a partial sum), and
// combine_preprocess reduce-scatters that sum back to the rows the rank received before the
// all-to-all returns them. The shared experts are Megatron's MLP with the usual layers.
//
// Every rank of the group routes alike (config.expert_load spreads each rank's tokens the same
// way), so what the group's ranks received is the rank's own rows t times, and Megatron's
// [tensor x expert-parallel rank][local expert] chunks, sorted to [local expert][rank], hold
// the same rows as the builder's per-expert chunks t times as large: the sort's copy and the
// experts' inputs are the same bytes (views cost nothing).
#include <string>

#include "engine/ir/experts.h"
#include "engine/ir/text.h"
#include "engine/passes/expert_parallel.h"
#include "engine/passes/tensor_parallel_internal.h"

namespace memest {
namespace tensor_parallel {

namespace {

// Ops of the router and the permutation that each rank runs on its own tokens: whatever dim
// they work along, the rank's rows are its own.
bool IsTokenLocal(std::string_view kind) {
  return kind == "topk" || kind == "sort" || kind == "scatter" || kind == "scatter_add_" ||
         kind == "index" || kind == "index_select" || kind == "remainder" ||
         kind == "megatron_swiglu";
}

}  // namespace

Status Sharder::FindMoeLayers(ExpertLoad load, DataSharding sharding) {
  load_ = load;
  sharding_ = sharding;
  moe_of_op_.assign(g_.ops.size(), -1);
  for (const Op& op : g_.ops) {
    if (op.kind != "ep_all_to_all" || AttrText(op, "role") != "dispatch") continue;
    const Shape& x = g_.tensors[op.inputs[0]].shape;
    if (!moe_.empty() && moe_.back().scope == op.scope) {  // the routing weights' dispatch
      moe_.back().probs = g_.tensors[op.inputs[0]].dtype;
      continue;
    }
    MoeLayer l;
    l.scope = op.scope;
    MEMEST_ASSIGN_OR_RETURN(l.experts, IntAttr(op.attrs, "experts", 0, "ep_all_to_all"));
    MEMEST_ASSIGN_OR_RETURN(l.top_k, IntAttr(op.attrs, "top_k", 0, "ep_all_to_all"));
    if (l.top_k < 1 || l.experts < 1 || x.empty() || x[0] % l.top_k != 0) {
      return Internal("tensor parallelism: the dispatch at " + op.scope + " sends " +
                      ShapeToString(x) + ", not tokens x top_k " + std::to_string(l.top_k));
    }
    l.tokens = x[0] / l.top_k;
    if (!sp_) {
      return InvalidArgument(
          "config.parallelism.sequence_parallel: Megatron-LM's MoELayer (at " + Quote(op.scope) +
          ") over " + std::to_string(t_) +
          " tensor-parallel ranks needs sequence parallelism "
          "(moe_layer.py: \"performance may degrade if MoE and tensor parallelism are enabled "
          "without also enabling sequence parallelism\", raised in training)");
    }
    if (sharding_ != DataSharding::kNone && !IsMegatron(sharding_)) {
      return InvalidArgument("config.parallelism.data_parallel: Megatron-LM's MoELayer (at " +
                             Quote(op.scope) +
                             ") runs under Megatron's own data parallelism "
                             "(megatron-ddp, megatron-distopt), not " +
                             DataShardingName(sharding_));
    }
    if (dtensor_ || context_) {
      return InvalidArgument(std::string("config.parallelism.") +
                             (dtensor_ ? "tensor_layers" : "context") +
                             ": Megatron-LM's MoELayer (at " + Quote(op.scope) +
                             ") is modelled with Megatron's tensor parallelism only");
    }
    if (l.tokens % t_ != 0) {
      return InvalidArgument("config.parallelism.tensor: the MoE layer at " + Quote(op.scope) +
                             " routes " + std::to_string(l.tokens) + " tokens, which " +
                             std::to_string(t_) + " ranks do not split evenly");
    }
    moe_.push_back(std::move(l));
  }
  for (size_t i = 0; i < g_.ops.size() && !moe_.empty(); ++i) {
    for (size_t l = 0; l < moe_.size(); ++l) {
      if (ScopeWithin(g_.ops[i].scope, moe_[l].scope)) moe_of_op_[i] = static_cast<int>(l);
    }
  }
  return Status::Ok();
}

Status Sharder::AddMoe(int i, GraphBuilder& b, std::vector<int>& map, std::vector<int> inputs,
                       Attrs attrs, Split split) {
  const Op& op = g_.ops[i];
  std::vector<int> outs = b.Add(op.kind, std::move(inputs), std::move(attrs));
  if (!b.ok()) return b.status();
  for (size_t k = 0; k < op.outputs.size() && k < outs.size(); ++k) {
    map[op.outputs[k]] = outs[k];
    split_[op.outputs[k]] = split;
  }
  return Status::Ok();
}

Status Sharder::MoeOp(int i, GraphBuilder& b, std::vector<int>& map, bool* done) {
  const Op& op = g_.ops[i];
  const MoeLayer& layer = moe_[moe_of_op_[i]];
  *done = true;
  std::vector<int> inputs;
  Split x;  // the split every split input shares
  for (size_t k = 0; k < op.inputs.size(); ++k) {
    inputs.push_back(map[op.inputs[k]]);
    const Split s = In(i, k);
    if (s.none()) continue;
    if (!x.none() && s != x && IsTokenLocal(op.kind)) {
      return Refuse(i, "reads tensors split along different dims");
    }
    if (x.none()) x = s;
  }
  const std::string moe = AttrText(op, "moe");
  const int64_t rank_tokens = layer.tokens / t_;
  if (op.kind == "ep_all_to_all") return MoeAllToAll(i, b, map);
  if (op.kind == "linear" && op.inputs.size() >= 2 &&
      IsExpertParameter(g_.tensors[UncastOf(g_, op.inputs[1])])) {
    return ExpertLinear(i, b, map);
  }
  if (op.kind == "full") {  // the routing's [tokens, experts], the output's [tokens, hidden]
    StatusOr<std::vector<int64_t>> shape = IntsAttr(op.attrs, "shape", {}, "");
    if (!shape.ok() || shape->empty() || (*shape)[0] != layer.tokens) {
      *done = false;
      return Status::Ok();
    }
    Attrs attrs = op.attrs;
    std::vector<int64_t> s = *shape;
    s[0] = rank_tokens;
    attrs["shape"] = s;
    return AddMoe(i, b, map, {}, std::move(attrs), Split{0, true});
  }
  if (op.kind == "split" && (moe == "chunks" || moe == "experts")) {
    // The gathered rows by expert: each expert's rows from every rank of the group.
    if (!x.none()) return Refuse(i, "splits the routed tokens before the group gathered them");
    const std::vector<int64_t> counts =
        ExpertTokens(rank_tokens, layer.experts, layer.top_k, load_);
    std::vector<int64_t> sizes;
    for (int64_t c : counts) sizes.push_back(c * t_);  // at most the layer's tokens x top_k
    Attrs attrs = op.attrs;
    attrs["sizes"] = sizes;
    return AddMoe(i, b, map, std::move(inputs), std::move(attrs), Split{});
  }
  if (IsTokenLocal(op.kind)) {
    if (!x.none() && !x.sequence && op.kind != "megatron_swiglu") {
      return Refuse(i, "reads features a column-parallel linear split");
    }
    return AddMoe(i, b, map, std::move(inputs), op.attrs, x);
  }
  if (x.none()) {  // after the group's gather: the rank's rows, whatever the whole graph's
    return AddMoe(i, b, map, std::move(inputs), op.attrs, Split{});
  }
  *done = false;
  return Status::Ok();
}

// The dispatch sends the rank's routed tokens (tokens x top_k / t rows) and all-gathers what the
// group received; the combine reduce-scatters the experts' partial sums (in the routing
// weights' dtype, as combine_preprocess casts them) to the rows the rank received, then returns
// them.
Status Sharder::MoeAllToAll(int i, GraphBuilder& b, std::vector<int>& map) {
  const Op& op = g_.ops[i];
  MoeLayer& layer = moe_[moe_of_op_[i]];
  const bool dispatch = AttrText(op, "role") == "dispatch";
  const Split x = In(i, 0);
  int in = map[op.inputs[0]];
  if (dispatch != (x == Split{0, true})) {
    return Refuse(i, dispatch ? "dispatches rows that are not the rank's share of the tokens"
                              : "combines rows split otherwise than by the group's gather");
  }
  view_->collectives += 1;
  if (!dispatch) {
    const DType dtype = b.tensor(in).dtype;
    if (dtype != layer.probs)
      in = b.Add1("to", {in}, {{"dtype", std::string(DTypeName(layer.probs))}});
    in = b.Add1("tp_reduce_scatter", {in}, {{"tp", t_}, {"dim", int64_t{0}}, {"flat", int64_t{1}}});
    if (dtype != layer.probs) in = b.Add1("to", {in}, {{"dtype", std::string(DTypeName(dtype))}});
    // routed_experts_compute's locals (the sorted tokens and weights, the experts' output), held
    // by the builder to the end of its combine_preprocess, last until the reduce-scatter that
    // ends it now.
    const int ended = g_.tensors[op.inputs[0]].producer;
    for (const HeldTensor& h : g_.held) {
      if (h.until_op == ended && map[h.tensor] >= 0) b.HoldUntilLastOp(map[h.tensor]);
    }
    // No op reads the dispatch's outputs after this one: what MoELayer's custom_forward holds
    // of them to its end (dispatched_input, probs) is the all-to-all's, not the gathered rows.
    for (const auto& [whole, rank] : layer.dispatched) map[whole] = rank;
  }
  if (!b.ok()) return b.status();
  Attrs attrs = op.attrs;
  attrs["rows"] = b.shape(in)[0];  // one expert-parallel rank: what it sends (the pass sizes more)
  int y = b.Add1("ep_all_to_all", {in}, std::move(attrs));
  Split s{0, true};
  if (dispatch) {
    layer.dispatched.emplace_back(op.outputs[0], y);
    y = b.Add1("tp_all_gather", {y}, {{"tp", t_}, {"dim", int64_t{0}}, {"flat", int64_t{1}}});
    s = Split{};
  }
  if (!b.ok()) return b.status();
  map[op.outputs[0]] = y;
  split_[op.outputs[0]] = s;
  return Status::Ok();
}

// A local expert's linear_fc1 (split by the plan's colwise entry) or linear_fc2 (rowwise) with
// explicit_expert_comm: the plain product on the rank's share, no collective either way.
Status Sharder::ExpertLinear(int i, GraphBuilder& b, std::vector<int>& map) {
  const Op& op = g_.ops[i];
  if (op.inputs.size() != 2)
    return Refuse(i, "an expert's linear with a bias (Megatron's have none)");
  const Split x = In(i, 0), w = In(i, 1);
  const int r = Rank(op.inputs[0]);
  if (w.none()) {
    return Refuse(i,
                  "an expert's linear whose weight the plan does not split (Megatron splits "
                  "every expert over the expert-tensor-parallel group: linear_fc1 colwise, "
                  "linear_fc2 rowwise)");
  }
  if (w.dim == 0 && !x.none()) return Refuse(i, "a column-parallel expert linear reads split rows");
  if (w.dim == 1 && x != Split{r - 1, false}) {
    return Refuse(i, "a row-parallel expert linear reads features no column-parallel linear split");
  }
  const Split y = w.dim == 0 ? Split{r - 1, false} : Split{};
  return AddMoe(i, b, map, {map[op.inputs[0]], map[op.inputs[1]]}, op.attrs, y);
}

}  // namespace tensor_parallel
}  // namespace memest
