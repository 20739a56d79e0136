// vLLM's fused mixture-of-experts workspace, a pass over one served rank's graph (after tensor
// parallelism and quantization).
//
// vLLM runs a sparse MoE block as FusedMoE (model_executor/layers/fused_moe): its modular kernel
// (modular_kernel.py, FusedMoEModularKernel._allocate_buffers, with TritonExperts'
// workspace_shapes in fused_moe.py) takes two scratch tensors from the worker's workspace manager
// (v1/worker/workspace.py, get_simultaneous): one of max(M * top_k * max(N / 2, K), M * K)
// values, shared by the first GEMM's output, the second's and the block's output, and one of
// M * top_k * max(N, K), each rounded up to 256 bytes, in the activations' dtype, for M tokens,
// N the rank's w13 rows (2 x the expert's MLP size) and K the hidden size. The manager keeps
// that buffer once it has grown to it: allocated at the first MoE block of the profile run, it
// is held to the end of the run (the sampler's peak included).
//
// The graph's MoE blocks are found by their router: a `topk` op whose scope S has experts'
// linears in "S.experts." (the serving build's fused_experts blocks with FusedMoE's stacked
// "experts.w13" and "experts.w2", engine/models/layers.h SparseMoe, or transformers' expert
// loop). The workspace is added before the first block's
// first expert op, as a `full` held until the graph's last op.
#ifndef MEMEST_ENGINE_PASSES_FUSED_MOE_WORKSPACE_H_
#define MEMEST_ENGINE_PASSES_FUSED_MOE_WORKSPACE_H_

#include <cstdint>

#include "engine/ir/budget.h"
#include "engine/ir/graph.h"
#include "engine/ir/status.h"

namespace memest {

// The workspace `rank`'s MoE blocks take: the largest block's bytes (0: no block), taken before
// the first block's first expert op, in the activations' dtype.
struct FusedMoeWorkspace {
  int64_t bytes = 0;
  int first_expert_op = -1;
  DType dtype = DType::kBFloat16;
};
StatusOr<FusedMoeWorkspace> FindFusedMoeWorkspace(const Graph& rank);

// `rank` with `workspace` (FindFusedMoeWorkspace's) added as a held `full`; `rank` itself
// (copied) when it has no bytes.
StatusOr<Graph> AddFusedMoeWorkspace(const Graph& rank, const FusedMoeWorkspace& workspace,
                                     Budget* budget = nullptr);

}  // namespace memest

#endif  // MEMEST_ENGINE_PASSES_FUSED_MOE_WORKSPACE_H_
