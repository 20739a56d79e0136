// Context parallelism as one rank sees it (docs/parallelism.md): Megatron-LM with
// TransformerEngine's ring attention (cp_comm_type "p2p", the default). Each of the `context`
// ranks holds 1/context of every sequence: the data loader gives it its share of the tokens and
// targets (with causal masking, two of 2·context chunks, for balance: the same size), so every
// activation holds it too, and a position-indexed tensor (a rotary table) is sliced to the
// rank's positions. Attention becomes `cp_attention` (engine/rules/parallel.cc): the rank's
// queries against every rank's keys and values, passed round the ring. The parameters, their
// gradients and the optimizer are each rank's whole (Megatron folds the context ranks into the
// data-parallel group for the gradients' reduction and the distributed optimizer).
//
// Refused, naming the op: attention in its math form (matmul, softmax; context parallelism needs
// a fused kernel: config.attention sdpa or flash), an attention mask tensor, and what the
// tensor-parallel pass refuses for a split sequence. The sequence must split into 2·context
// equal chunks.
#ifndef MEMEST_ENGINE_PASSES_CONTEXT_PARALLEL_H_
#define MEMEST_ENGINE_PASSES_CONTEXT_PARALLEL_H_

#include <cstdint>

#include "engine/ir/graph.h"
#include "engine/ir/status.h"
#include "engine/passes/passes.h"

namespace memest {

struct ContextParallelView {
  Graph graph;                     // the rank's graph
  // Bytes each rank sends and receives per micro-batch: each attention's keys and values, to the
  // next rank context - 1 times in forward, with their gradients twice that in backward.
  int64_t communicated_bytes = 0;
  int64_t attentions = 0;
  ReplayMap replay;                // where the whole graph's tensors and ops went
};

StatusOr<ContextParallelView> ShardContextParallel(const Graph& graph, int64_t context);

}  // namespace memest

#endif  // MEMEST_ENGINE_PASSES_CONTEXT_PARALLEL_H_
