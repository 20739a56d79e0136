// FSDP1 (torch.distributed.fsdp.FullyShardedDataParallel, use_orig_params=False) as one rank
// sees it (docs/parallelism.md; read from torch/distributed/fsdp/_flat_param.py and
// _runtime_utils.py, PyTorch 2.x; facts in the FSDP1 section).
//
// Wrapped as HF accelerate and the FSDP tutorial wrap a transformer (auto_wrap_policy on the
// block class): each block is a unit and the root the rest (engine/passes/fsdp.h,
// GroupByBlocks). A unit's parameters are one FlatParameter, flattened without padding between
// them and sharded as a whole: each rank keeps ceil(numel / N) elements (rank 0 a full shard,
// the last the padding), in the parameters' own dtype (float32 under a mixed-precision policy).
// Around the step:
// - unshard (forward, and backward when resharded): with mixed precision a `_mp_shard` (the
//   shard cast to param_dtype) first, then `_full_param_padded` (N shards, param_dtype), into
//   which the shards are all-gathered; the parameters are views of it; `_mp_shard` goes.
//   FULL_SHARD frees a unit's full parameters after its forward (never the root's);
//   SHARD_GRAD_OP keeps them until its backward. In backward a unit's pre-backward also
//   unshards the unit before it (BackwardPrefetch.BACKWARD_PRE, the default since 2.0).
// - gradients: the parameters' gradients meet in the FlatParameter's (a flat gradient of the
//   unit's numel, autograd's concatenation of them); its post-backward hook frees the full
//   parameters, makes a reduce-dtype copy when that differs, a padded copy when numel does not
//   divide by N, and `new_sharded_grad` (one shard, reduce dtype) that the gradient is
//   reduce-scattered into; the unsharded gradients go; a shard in the parameters' dtype is made
//   when the reduce dtype differs; it becomes (or is added into) the sharded gradient.
// - the optimizer steps the sharded FlatParameters: its state has a shard's shape per unit.
// CPUOffload(offload_params=True) (parallelism.fsdp_cpu_offload; _flat_param.py
// init_flat_param_attributes, pre_unshard, prepare_gradient_for_optim; _runtime_utils.py
// _offload_grad): each unit's `_local_shard` is pinned host memory, and so is `_cpu_grad`
// (zeros like it); the optimizer's state is made on the host and the step runs on the CPU.
// Unshard first copies the shard to the GPU (`flat_param_to(device)`, or under mixed precision
// `_local_shard.to(device)` cast into `_mp_shard`), freed once the all-gather has it. The
// reduce-scattered shard stays on the GPU as `_saved_grad_shard` after its copy to
// `_cpu_grad`, until the end of backward (prepare_gradient_for_optim deletes it).
#ifndef MEMEST_ENGINE_PASSES_FSDP1_H_
#define MEMEST_ENGINE_PASSES_FSDP1_H_

#include <cstdint>
#include <vector>

#include "engine/ir/config.h"
#include "engine/ir/graph.h"
#include "engine/ir/status.h"
#include "engine/passes/fsdp.h"

namespace memest {

// One FSDP1 unit's buffers on the estimated rank (bytes).
struct Fsdp1Unit {
  FsdpGroup group;          // scope, forward ops, parameters, reshard_after_forward
  int64_t numel = 0;        // the FlatParameter's elements
  int64_t shard = 0;        // ceil(numel / N)
  int64_t full_bytes = 0;   // _full_param_padded: N shards in param_dtype
  int64_t mp_shard_bytes = 0;     // _mp_shard (mixed precision), else 0
  int64_t flat_grad_bytes = 0;    // the unsharded flat gradient, param_dtype
  int64_t reduce_copy_bytes = 0;  // its reduce-dtype copy, when the dtypes differ
  int64_t pad_bytes = 0;          // its padded copy, when numel does not divide by N
  int64_t sharded_grad_bytes = 0; // new_sharded_grad: one shard, reduce dtype
  int64_t grad_cast_bytes = 0;    // the shard cast to the parameters' dtype, when they differ
  int64_t offload_copy_bytes = 0; // CPU offload: the shard's copy to the GPU (its own dtype)
  Tensor flat_shard;              // [shard] in the parameters' dtype: kept and stepped
};

struct Fsdp1View {
  std::vector<Fsdp1Unit> units;  // blocks in forward order, then the root
  std::vector<int> unit_of;      // per tensor id (parameters): its unit
  std::vector<int> first_param;  // per unit: the parameter its flat shard is counted under
  bool cpu_offload = false;      // CPUOffload(offload_params=True)
  int64_t host_bytes = 0;        // its pinned shards and gradients and the optimizer state
};

StatusOr<Fsdp1View> PlanFsdp1(const Graph& graph, const RunConfig& config);

}  // namespace memest

#endif  // MEMEST_ENGINE_PASSES_FSDP1_H_
