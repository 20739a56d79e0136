// Expert parallelism as one rank sees it (docs/parallelism.md): Megatron-LM's
// expert_model_parallel_size over its MoELayer with the all-to-all token dispatcher
// (engine/models/megatron_moe.cc builds the layer for a group of one rank). The `expert` ranks
// of a group each hold experts/expert consecutive experts of every mixture-of-experts layer
// (the rank's local_experts.0, 1, ...), and each routes its own tokens: a token's choices travel
// to the ranks of their experts and back (`ep_all_to_all`, engine/rules/moe_dispatch.cc).
//
// What a rank holds then depends on what it receives: expert e's tokens from every rank of the
// group, which config.expert_load spreads (ExpertTokens, per rank and the same on each). With
// the worst load every token's choices go to the last top_k experts, so the ranks holding them
// receive expert x tokens x (their share of those experts) rows, the last one expert x tokens x
// min(top_k, local experts), and the first ranks nothing; balanced, each expert gets its share
// from every rank. The rank estimated is the one that receives the most over all layers (the
// lowest such rank); the view names the one that receives the least too. A pipeline stage
// without a MoE layer is left as it is (PlanStep). With one local expert Megatron sorts
// nothing and calls the expert on what arrived: the pass drops those copies.
//
// The pass rebuilds the graph: the experts past the rank's share, their ops and parameters,
// leave it; the dispatch's all-to-alls receive the rank's rows, the combine's return the rows
// it sent; the chunk sorts and the experts' split take the rank's sizes. The dense parameters
// stay whole. Refused, naming the field: a graph without Megatron's MoE layer, and experts that
// do not split evenly (Megatron asserts num_moe_experts % expert_model_parallel_size == 0).
#ifndef MEMEST_ENGINE_PASSES_EXPERT_PARALLEL_H_
#define MEMEST_ENGINE_PASSES_EXPERT_PARALLEL_H_

#include <cstdint>

#include "engine/ir/budget.h"
#include "engine/ir/config.h"
#include "engine/ir/graph.h"
#include "engine/ir/status.h"
#include "engine/passes/passes.h"

namespace memest {

struct ExpertParallelView {
  int64_t size = 1;            // ranks in the expert-parallel group
  int64_t rank = 0;            // the rank estimated: the one that receives the most
  int64_t local_experts = 0;   // each MoE layer's experts on a rank
  int64_t layers = 0;          // MoE layers
  // Token choices the estimated rank's experts compute on in one MoE layer (the first), and
  // those of the rank that receives the fewest.
  int64_t received_rows = 0;
  int64_t least_rank = 0;
  int64_t least_received_rows = 0;
  // Bytes the rank sends through the all-to-alls per micro-batch, forward and backward: the
  // tokens and their weights out and back, the (expert - 1)/expert that leave the rank.
  int64_t communicated_bytes = 0;
  Graph graph;                 // the rank's graph
  ReplayMap replay;            // where the whole graph's tensors and ops went
};

// A string attribute the builder set on `op` ("role", "moe"), or "" (absent or not a string).
std::string AttrText(const Op& op, std::string_view name);

// Whether `graph` has a Megatron MoE layer's dispatch (a pipeline stage may have none).
bool HasExpertDispatch(const Graph& graph);

// Whether a Megatron MoE layer of `graph` has the router's load-balancing loss (its token counts
// all-reduced over the tensor x context group every forward).
bool HasRouterAuxLoss(const Graph& graph);

// Whether `tensor` is a parameter of a Megatron MoELayer's experts (its name has
// "experts.local_experts."): Megatron marks them `allreduce = False`, and its DDP keeps them in
// the expert-parallel buffers.
bool IsExpertParameter(const Tensor& tensor);

// The rank's view of `graph` (built with one expert-parallel rank) under parallelism.expert > 1.
StatusOr<ExpertParallelView> ShardExpertParallel(const Graph& graph,
                                                 const ParallelismConfig& parallelism,
                                                 ExpertLoad load, Budget* budget = nullptr);

}  // namespace memest

#endif  // MEMEST_ENGINE_PASSES_EXPERT_PARALLEL_H_
