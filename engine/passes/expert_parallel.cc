#include "engine/passes/expert_parallel.h"

#include <string>
#include <string_view>
#include <vector>

#include "engine/ir/experts.h"
#include "engine/ir/shape.h"

namespace memest {

using namespace std::string_view_literals;  // kind == "linear"sv: lengths first
namespace {

constexpr const char* kField = "config.parallelism.expert";
constexpr int64_t kMaxExperts = int64_t{1} << 16;

// One MoE layer of the whole graph, found by its dispatch.
struct MoeLayer {
  std::string scope;  // the layer's module scope (its all-to-alls')
  int64_t experts = 0, top_k = 0, tokens = 0;
  std::vector<int64_t> counts;  // token choices per expert from one rank
  int64_t received = 0;         // rows the estimated rank's experts receive (ShardExpertParallel)
};

// Rows rank r receives for its local expert j from each rank of the group.
int64_t Chunk(const MoeLayer& l, int64_t local, int64_t r, int64_t j) {
  return l.counts[static_cast<size_t>(r * local + j)];
}

// Rows rank r's experts receive from the whole group (at most size x tokens x top_k, checked).
StatusOr<int64_t> Received(const MoeLayer& l, int64_t size, int64_t r) {
  const int64_t local = l.experts / size;
  int64_t rows = 0;
  for (int64_t j = 0; j < local; ++j) {
    MEMEST_ASSIGN_OR_RETURN(int64_t from_all, CheckedMul(size, Chunk(l, local, r, j)));
    MEMEST_ASSIGN_OR_RETURN(rows, CheckedAdd(rows, from_all));
  }
  return rows;
}

StatusOr<std::vector<MoeLayer>> FindLayers(const Graph& g, int64_t size, ExpertLoad load) {
  std::vector<MoeLayer> layers;
  for (const Op& op : g.ops) {
    if (op.kind != "ep_all_to_all") continue;
    MEMEST_ASSIGN_OR_RETURN(std::string role, StringAttr(op.attrs, "role", "", "ep_all_to_all"));
    MEMEST_ASSIGN_OR_RETURN(int64_t ep, IntAttr(op.attrs, "ep", 1, "ep_all_to_all"));
    if (ep != 1) {
      return InvalidArgument(std::string(kField) + ": the graph's experts are split already (an "
                             "all-to-all over " + std::to_string(ep) + " ranks at " + op.scope +
                             ")");
    }
    if (role != "dispatch" || (!layers.empty() && layers.back().scope == op.scope)) continue;
    MoeLayer l;
    l.scope = op.scope;
    MEMEST_ASSIGN_OR_RETURN(l.experts, IntAttr(op.attrs, "experts", 0, "ep_all_to_all"));
    MEMEST_ASSIGN_OR_RETURN(l.top_k, IntAttr(op.attrs, "top_k", 0, "ep_all_to_all"));
    const Shape& in = g.tensors[op.inputs[0]].shape;
    if (l.top_k < 1 || in.empty() || in[0] % l.top_k != 0) {
      return Internal("expert parallelism: the dispatch at " + op.scope + " sends " +
                      ShapeToString(in) + ", not tokens x top_k " + std::to_string(l.top_k));
    }
    l.tokens = in[0] / l.top_k;
    if (l.experts > kMaxExperts) {  // ExpertTokens keeps a count per expert
      return InvalidArgument(std::string(kField) + ": " + std::to_string(l.experts) +
                             " experts at " + op.scope + ", more than " +
                             std::to_string(kMaxExperts));
    }
    if (l.experts % size != 0) {
      return InvalidArgument(std::string(kField) + ": " + std::to_string(l.experts) +
                             " experts (at " + op.scope + ") do not split evenly over " +
                             std::to_string(size) + " ranks (Megatron asserts num_moe_experts "
                             "% expert_model_parallel_size == 0)");
    }
    l.counts = ExpertTokens(l.tokens, l.experts, l.top_k, load);
    layers.push_back(std::move(l));
  }
  if (layers.empty()) {
    return InvalidArgument(std::string(kField) + ": the model has no mixture-of-experts layer as "
                           "Megatron-LM runs it (its all-to-all token dispatcher): expert "
                           "parallelism splits the experts of Hugging Face configs with them "
                           "(mixtral, qwen2_moe, qwen3_moe) trained with megatron-ddp or "
                           "megatron-distopt");
  }
  return layers;
}

// The layer an op belongs to (-1: none).
int LayerOf(const std::vector<MoeLayer>& layers, const std::string& scope) {
  for (size_t i = 0; i < layers.size(); ++i) {
    if (ScopeWithin(scope, layers[i].scope)) return static_cast<int>(i);
  }
  return -1;
}

// The local expert an op's scope names ("<layer>.experts.local_experts.<j>[.…]"), or -1.
int64_t LocalExpertOf(const MoeLayer& l, const std::string& scope) {
  const std::string prefix = l.scope + ".experts.local_experts.";
  if (scope.compare(0, prefix.size(), prefix) != 0) return -1;
  int64_t j = 0;
  size_t i = prefix.size();
  if (i >= scope.size()) return -1;
  for (; i < scope.size() && scope[i] != '.'; ++i) {
    if (scope[i] < '0' || scope[i] > '9' || j > (int64_t{1} << 40)) return -1;
    j = 10 * j + (scope[i] - '0');
  }
  return j;
}

}  // namespace

std::string AttrText(const Op& op, std::string_view name) {
  StatusOr<std::string> text = StringAttr(op.attrs, name, "", "op");
  return text.ok() ? *text : std::string();
}

bool HasExpertDispatch(const Graph& g) {
  for (const Op& op : g.ops) {
    if (op.kind == "ep_all_to_all"sv) return true;
  }
  return false;
}

bool HasRouterAuxLoss(const Graph& g) {
  for (const Op& op : g.ops) {
    if (AttrText(op, "moe") == "aux_loss") return true;
  }
  return false;
}

bool IsExpertParameter(const Tensor& t) {
  return t.role == TensorRole::kParameter &&
         t.name.find("experts.local_experts.") != std::string::npos;
}

StatusOr<ExpertParallelView> ShardExpertParallel(const Graph& g, const ParallelismConfig& p,
                                                 ExpertLoad load, Budget* budget) {
  ExpertParallelView v;
  v.size = p.expert;
  MEMEST_ASSIGN_OR_RETURN(std::vector<MoeLayer> layers, FindLayers(g, v.size, load));
  const MoeLayer& first = layers.front();
  v.layers = static_cast<int64_t>(layers.size());
  v.local_experts = first.experts / v.size;
  // The rank that receives the most over every layer (layers may differ in experts and tokens),
  // and the one that receives the least.
  int64_t most = -1, least = -1;
  for (int64_t r = 0; r < v.size; ++r) {
    int64_t rows = 0;
    for (const MoeLayer& l : layers) {
      MEMEST_ASSIGN_OR_RETURN(int64_t in_layer, Received(l, v.size, r));
      StatusOr<int64_t> sum = CheckedAdd(rows, in_layer);
      if (!sum.ok()) {
        return InvalidArgument(std::string(kField) + ": rank " + std::to_string(r) +
                               " receives more token choices than 64 bits count");
      }
      rows = *sum;
    }
    if (rows > most) v.rank = r, most = rows;
    if (least < 0 || rows < least) v.least_rank = r, least = rows;
  }
  const int64_t r = v.rank;
  for (MoeLayer& l : layers) l.received = *Received(l, v.size, r);  // summed above: no overflow
  v.received_rows = first.received;
  MEMEST_ASSIGN_OR_RETURN(v.least_received_rows, Received(first, v.size, v.least_rank));

  // The experts past the rank's share leave with their parameters.
  std::vector<char> drop(g.tensors.size(), 0);
  std::vector<int> layer_of_op(g.ops.size(), -1);
  std::vector<char> dropped_op(g.ops.size(), 0);
  for (size_t i = 0; i < g.ops.size(); ++i) {
    const Op& op = g.ops[i];
    const int l = LayerOf(layers, op.scope);
    layer_of_op[i] = l;
    if (l < 0) continue;
    const int64_t local = layers[l].experts / v.size;
    if (LocalExpertOf(layers[l], op.scope) < local) continue;
    dropped_op[i] = 1;
    for (int t : op.inputs) {
      if (g.tensors[t].producer < 0 && g.tensors[t].role == TensorRole::kParameter) drop[t] = 1;
    }
  }

  auto emit = [&](int i, GraphBuilder& b, std::vector<int>& map) {
    const Op& op = g.ops[i];
    if (dropped_op[i]) return true;
    const int l = layer_of_op[i];
    if (l < 0) return false;
    const MoeLayer& layer = layers[l];
    const int64_t local = layer.experts / v.size;
    const std::string moe = AttrText(op, "moe");
    Attrs attrs = op.attrs;
    auto gathered = [&](int64_t rows) {  // the tensor group's rows (rows <= received: fits)
      StatusOr<int64_t> all = CheckedMul(p.tensor, rows);
      if (!all.ok()) b.Fail(InvalidArgument(std::string(kField) + ": " + std::to_string(rows) +
                                            " rows gathered over " + std::to_string(p.tensor) +
                                            " tensor-parallel ranks overflow 64 bits"));
      return all.ok() ? *all : 0;
    };
    if (local == 1 && (moe == "chunks" || moe == "experts")) {
      // One local expert: Megatron sorts nothing (`if self.num_local_experts > 1`) and
      // SequentialMLP calls the expert on its whole input: each split hands its input on, the
      // sort's cat what its split read, the experts' cat the one expert's output.
      int from = op.inputs[0];
      if (op.kind == "cat" && moe == "chunks") from = g.ops[g.tensors[from].producer].inputs[0];
      for (int out : op.outputs) map[out] = map[from];
      return true;
    }
    if (op.kind == "ep_all_to_all") {
      const bool dispatch = AttrText(op, "role") == "dispatch";
      attrs["ep"] = AttrValue(int64_t{v.size});
      attrs["rows"] = AttrValue(int64_t{dispatch ? layer.received : layer.tokens * layer.top_k});
    } else if (op.kind == "split" && moe == "chunks") {
      // From each rank of the group, its local experts in order; under tensor parallelism the
      // rows the tensor group gathered, each rank's alike (engine/passes/tensor_parallel_moe.cc).
      std::vector<int64_t> sizes;
      for (int64_t s = 0; s < v.size; ++s) {
        for (int64_t j = 0; j < local; ++j) sizes.push_back(gathered(Chunk(layer, local, r, j)));
      }
      attrs["sizes"] = AttrValue(std::move(sizes));
    } else if (op.kind == "split" && moe == "experts") {
      std::vector<int64_t> sizes;  // each local expert's tokens from every rank
      for (int64_t j = 0; j < local; ++j) sizes.push_back(gathered(v.size * Chunk(layer, local, r, j)));
      attrs["sizes"] = AttrValue(std::move(sizes));
    } else if (!(op.kind == "cat" && moe == "experts")) {
      return false;  // copied (ReplayGraph names a dropped tensor such an op would read)
    }
    std::vector<int> inputs;  // the experts' cat: the local experts' outputs
    for (int t : op.inputs) {
      if (map[t] >= 0) inputs.push_back(map[t]);
    }
    std::vector<int> outs = b.Add(op.kind, std::move(inputs), std::move(attrs));
    for (size_t k = 0; k < outs.size(); ++k) map[op.outputs[k]] = outs[k];
    return true;
  };
  MEMEST_ASSIGN_OR_RETURN(v.graph, ReplayGraph(g, emit, std::nullopt, &v.replay, budget, &drop));

  // Sent per layer, forward and backward: (size - 1)/size of what each all-to-all carries.
  for (const Op& op : g.ops) {
    if (op.kind != "ep_all_to_all") continue;
    const Tensor& x = g.tensors[op.inputs[0]];
    MEMEST_ASSIGN_OR_RETURN(int64_t both, CheckedMul(2, Bytes(x.shape, x.dtype) / v.size));
    MEMEST_ASSIGN_OR_RETURN(int64_t sent, CheckedMul(both, v.size - 1));
    MEMEST_ASSIGN_OR_RETURN(v.communicated_bytes, CheckedAdd(v.communicated_bytes, sent));
  }
  return v;
}

}  // namespace memest
