// FSDP2 (torch.distributed.fsdp.fully_shard, PyTorch 2.x) as one rank sees it
// (docs/parallelism.md; read from torch/distributed/fsdp/_fully_shard/).
//
// With CPUOffloadPolicy (offload_policy, pin_memory=True; _fsdp_param.py, _fsdp_collectives.py):
// each padded shard is moved to pinned host memory at fully_shard; an all-gather input is the
// shard copied to the GPU (`.to(device)`, then cast to param_dtype under mixed precision, the
// GPU copy freed once cast), the inputs alive until the copy-in into the all-gather buffer;
// foreach_reduce copies each sharded gradient to the host (`.to("cpu", non_blocking=True)`:
// pinned) and keeps none on the GPU; the optimizer steps the host shards on the CPU.
//
// fully_shard is applied to each of the model's repeated blocks and to the root (torchtitan's
// and the FSDP2 tutorial's wrapping): one parameter group per block, and the root's group holds
// every parameter outside the blocks (embeddings, the final norm, the head). Each parameter is
// sharded on dim 0 by torch.chunk: every rank keeps a zero-padded shard of ceil(dim0/N) rows,
// and rank 0's shard is the largest, so rank 0 is the rank estimated. Around the step:
// - forward: a group's pre-forward all-gathers it: with a mixed-precision policy a copy-in
//   buffer (the shard cast to param_dtype) first, then one flat output of N padded shards, then
//   a tensor per parameter copied out of it (the unsharded parameters). The flat output is kept
//   until the next group's copy-out (implicit prefetch). After its forward a group with
//   reshard_after_forward frees its unsharded parameters; the root keeps its own until backward
//   ends.
// - backward: when backward reaches a group it is all-gathered again if it was freed (the flat
//   output freed right after its copy-out) and the group before it in forward order is
//   prefetched. The group's post-backward (after its first op's backward) takes the unsharded
//   gradients, frees its unsharded parameters, drops the previous group's reduce-scatter input,
//   copies the gradients into a new reduce-scatter input (reduce dtype, padded) and frees them,
//   and reduce-scatters into an output of 1/N of it: the sharded gradients (a copy in the
//   sharded dtype when that differs; added into the existing ones on a later micro-batch).
// - the optimizer steps the shards: its state has the shard's shape, in the sharded dtype.
#ifndef MEMEST_ENGINE_PASSES_FSDP_H_
#define MEMEST_ENGINE_PASSES_FSDP_H_

#include <cstdint>
#include <string>
#include <vector>

#include "engine/ir/config.h"
#include "engine/ir/graph.h"
#include "engine/ir/status.h"
#include "engine/report/report.h"

namespace memest {

// One fully_shard parameter group (all bytes on the estimated rank).
struct FsdpGroup {
  std::string scope;         // the block's scope; "" for the root
  int first_op = -1;         // the group's forward ops: [first_op, last_op]; the root's: all
  int last_op = -1;
  bool reshard_after_forward = true;
  std::vector<int> params;   // tensor ids, in model.parameters() order
  std::vector<int64_t> unsharded_bytes;  // per parameter: dim 0 padded to N, param dtype
  int64_t flat_bytes = 0;        // the all-gather output: N padded shards, param dtype
  int64_t copy_in_bytes = 0;     // the shard cast to param_dtype (mixed precision), else 0
  std::vector<int64_t> shard_bytes;  // per parameter: its padded shard, sharded dtype
  std::vector<int64_t> cast_bytes;   // per parameter: the shard in param_dtype (mixed precision)
  int64_t reduce_input_bytes = 0;   // dim-0 padded gradients, reduce dtype
  int64_t reduce_output_bytes = 0;  // 1/N of that
  int64_t sharded_grad_bytes = 0;   // the sharded gradients, sharded dtype
};

struct Fsdp2View {
  std::vector<FsdpGroup> groups;  // blocks in forward order, then the root
  std::vector<int> group_of;      // per tensor id: its group (-1: not a trainable parameter)
  // Per tensor id (parameters only): the rank's padded shard, in the sharded dtype; what the
  // rank keeps and what its optimizer state takes the shape of.
  std::vector<Tensor> shards;
  DType sharded_dtype = DType::kFloat32;
  DType reduce_dtype = DType::kFloat32;
  // CPUOffloadPolicy (pin_memory=True): the shards, their gradients and the optimizer state are
  // host memory, host_bytes of it (each shard and each gradient pinned on its own, rounded up
  // to a power of two by PyTorch's pinned allocator; the state unpinned).
  bool cpu_offload = false;
  int64_t host_bytes = 0;
};

// FSDP's wrapping (FSDP1's auto_wrap_policy on the block class, FSDP2's fully_shard calls): one
// group per block that runs ops, and the root's last with every parameter outside them; each
// parameter's group in `group_of` (-1 for what is not a parameter). Sizes are left to the
// caller.
void GroupByBlocks(const Graph& graph, bool reshard_after_forward,
                   std::vector<FsdpGroup>* groups, std::vector<int>* group_of);

// The FSDP2 view of `graph` under config.parallelism (sharding kFsdp2).
StatusOr<Fsdp2View> PlanFsdp2(const Graph& graph, const RunConfig& config);

// Under CPU offload the optimizer steps the host shards with torch.optim's for-loop (its
// default for CPU tensors: foreach only where every parameter is on CUDA): its scratch, one
// shard at a time, is host memory too; the largest shard's, in bytes.
StatusOr<int64_t> CpuStepScratchBytes(const RunConfig& config, int64_t largest_shard_bytes);

// "over N ranks", or under HSDP "over N ranks, HSDP: sharded within groups of S, replicated R
// times (the sharded gradients all-reduced across the replicas, in place)".
std::string FsdpRanksText(const ParallelismConfig& p);

// The report's notes on an FSDP2 rank: what it keeps, what it gathers, what is left out.
void AddFsdp2Notes(const RunConfig& config, const Fsdp2View& view, Report* report);

}  // namespace memest

#endif  // MEMEST_ENGINE_PASSES_FSDP_H_
