#include "engine/passes/context_parallel.h"

#include <string>

#include "engine/ir/text.h"
#include "engine/passes/passes.h"
#include "engine/passes/tensor_parallel_internal.h"

namespace memest {

StatusOr<ContextParallelView> ShardContextParallel(const Graph& graph, int64_t cp) {
  using tensor_parallel::Split;
  std::vector<Split> split(graph.tensors.size());
  Graph leaves = graph;  // the data batch as the rank holds it
  int seq = 1;
  for (size_t t = 0; t < graph.tensors.size(); ++t) {
    Tensor& x = leaves.tensors[t];
    if ((x.role != TensorRole::kInput && x.role != TensorRole::kTarget) || x.shape.size() < 2) {
      continue;
    }
    const int d = x.batch_dim == 1 ? 0 : 1;  // the sequence: the leading dim the batch is not
    if (x.shape[d] % (2 * cp) != 0) {
      return InvalidArgument("config.parallelism.context: the sequence (dim " + std::to_string(d) +
                             " of " + Quote(x.name) + " " + ShapeToString(x.shape) +
                             ") does not split into 2 x " + std::to_string(cp) +
                             " equal chunks (load-balanced causal attention)");
    }
    x.shape[d] /= cp;
    x.strides = ContiguousStrides(x.shape);
    split[t] = Split{d, true};
    seq = d;
  }
  ContextParallelView view;
  TensorParallelView counts;
  tensor_parallel::Sharder sharder(graph, cp, false, seq, std::move(split), -1, &counts);
  sharder.set_context();
  StatusOr<Graph> out = ReplayGraph(
      leaves, [&](int i, GraphBuilder& b, std::vector<int>& map) { return sharder.Emit(i, b, map); },
      std::nullopt, &view.replay);
  if (!out.ok()) return out.status().Prefixed("config.parallelism.context: ");
  view.graph = std::move(*out);
  for (const Op& op : view.graph.ops) {
    if (op.kind != "cp_attention") continue;
    ++view.attentions;
    const Tensor& k = view.graph.tensors[op.inputs[1]];
    const Tensor& v = view.graph.tensors[op.inputs[2]];
    const int64_t kv = Bytes(k.shape, k.dtype) + Bytes(v.shape, v.dtype);
    if (!AddBytes(&view.communicated_bytes, kv * 3 * (cp - 1))) view.communicated_bytes = kMaxBytes;
  }
  return view;
}

}  // namespace memest
