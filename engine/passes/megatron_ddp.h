// Megatron-LM's own data parallelism as one rank sees it (docs/parallelism.md): its
// DistributedDataParallel, which keeps every gradient in one contiguous float32 buffer, with the
// distributed optimizer (ZeRO-1 over that buffer: --dp-strategy megatron-distopt) or with its
// plain mixed-precision optimizer (--dp-strategy megatron-ddp). Read from
// megatron/core/distributed/{distributed_data_parallel,param_and_grad_buffer}.py,
// megatron/core/optimizer/{distrib_optimizer,optimizer,param_layout}.py (NVIDIA/Megatron-LM,
// d98e8a64).
//
// - The gradient buffer: `torch.zeros(numel, dtype=float32)` made with the DDP wrapper and kept
//   (grad_reduce_in_fp32: Megatron's training sets accumulate_allreduce_grads_in_fp32 for bf16);
//   each parameter's `main_grad` is a view into it. A parameter's gradient from autograd is
//   added into its main_grad by DDP's hook and dropped (with gradient-accumulation fusion the
//   weight-gradient GEMM writes into main_grad directly, and that gradient never exists; this
//   model counts it as without fusion). zero_grad_buffer zeroes it in place.
// - With the distributed optimizer the parameters are moved into one contiguous buffer of their
//   own dtype (param_data), each parameter starting at a multiple of 64 elements and the buffer
//   padded to a multiple of lcm(d, 128) elements (one bucket: overlap_grad_reduce off); the
//   gradient buffer has the same layout. The gradients are reduce-scattered in place and each
//   rank's optimizer steps its 1/d of the buffer: a float32 master copy of its shard (made at
//   construction, `clone().float()`, for 16-bit parameters) and Adam's two float32 states
//   (made at the first step); the updated shard is copied into param_data and all-gathered in
//   place.
// - Without it: the gradient buffer is all-reduced in place; Float16OptimizerWithFloat16Params
//   keeps a float32 master copy of every 16-bit parameter and its state over all of them: 18
//   bytes per parameter for bf16 and Adam (theoretical_memory_usage.py), 6 + 12/d with the
//   distributed optimizer.
// - Under expert parallelism (expert > 1) the experts' parameters (Megatron's `allreduce =
//   False`: the MoELayer's local_experts) have buffers of their own (expert_parallel_buffers),
//   laid out and padded the same way over the expert-data-parallel group, data x context / expert ranks,
//   which reduces their gradients and shards their optimizer state.
// - The optimizer is a fused multi-tensor one (TransformerEngine's or Apex's FusedAdam): no
//   per-parameter scratch. Megatron's optimizers are Adam (AdamW's decoupled decay) and SGD.
#ifndef MEMEST_ENGINE_PASSES_MEGATRON_DDP_H_
#define MEMEST_ENGINE_PASSES_MEGATRON_DDP_H_

#include <cstdint>
#include <vector>

#include "engine/ir/config.h"
#include "engine/ir/graph.h"
#include "engine/ir/status.h"
#include "engine/report/report.h"

namespace memest {

// One rank's Megatron buffers (all bytes).
struct MegatronDdp {
  bool distributed_optimizer = false;
  // The contiguous layouts, padding included, dense and experts' (0: no experts' parameters),
  // and the rank's share of each (the distributed optimizer's 1/group, else all).
  int64_t buffer_elements = 0;
  int64_t shard_elements = 0;
  int64_t expert_buffer_elements = 0;
  int64_t expert_shard_elements = 0;
  int64_t expert_data = 1;         // the expert-data-parallel group's ranks
  int64_t param_buffer_bytes = 0;  // param_data (distributed optimizer), else 0
  int64_t grad_buffer_bytes = 0;   // float32
  int64_t master_bytes = 0;        // float32 master params of what the rank steps (16-bit models)
  int64_t state_bytes = 0;         // the optimizer's float32 state over it
  // Per tensor id: 1 for a parameter that lives in param_data (distributed optimizer: the
  // trainable parameters). Buffers and frozen parameters stay tensors of their own.
  std::vector<char> in_param_buffer;
};

// Megatron's buffers for the rank's graph under config (sharding kMegatronDdp or
// kMegatronDistOpt).
StatusOr<MegatronDdp> PlanMegatronDdp(const Graph& graph, const RunConfig& config);

// The report's note on a Megatron rank.
void AddMegatronDdpNotes(const RunConfig& config, const MegatronDdp& view, Report* report);

}  // namespace memest

#endif  // MEMEST_ENGINE_PASSES_MEGATRON_DDP_H_
