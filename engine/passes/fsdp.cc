#include "engine/passes/fsdp.h"

#include <algorithm>
#include <utility>

#include "engine/ir/shape.h"
#include "engine/step/optimizers.h"

namespace memest {
namespace {

// torch.chunk on dim 0: every rank's padded shard has ceil(dim0 / N) rows (a 0-d parameter is
// one row).
Shape ShardShape(const Shape& s, int64_t world) {
  if (s.empty()) return {1};
  Shape out = s;
  out[0] = (s[0] + world - 1) / world;
  return out;
}

// The parameter's dim 0 padded to a multiple of N (_get_dim0_padded_size).
Shape PaddedShape(const Shape& s, int64_t world) {
  Shape out = ShardShape(s, world);
  out[0] *= world;
  return out;
}

// The group whose block holds `name`'s module (-1: the root's).
int BlockOf(const Graph& g, const std::string& name) {
  const size_t dot = name.rfind('.');
  const std::string scope = dot == std::string::npos ? "" : name.substr(0, dot);
  for (size_t b = 0; b < g.blocks.size(); ++b) {
    if (ScopeWithin(scope, g.blocks[b])) return static_cast<int>(b);
  }
  return -1;
}

Status Add(int64_t* total, const Shape& shape, DType dtype, const char* what) {
  const std::string field = std::string("model: an FSDP group's ") + what;
  MEMEST_ASSIGN_OR_RETURN(int64_t bytes, CheckedBytes(shape, dtype, field));
  if (!AddBytes(total, bytes)) return InvalidArgument(field + " would pass 2^62 bytes");
  return Status::Ok();
}

}  // namespace

void GroupByBlocks(const Graph& g, bool reshard_after_forward, std::vector<FsdpGroup>* groups,
                   std::vector<int>* group_of) {
  groups->assign(g.blocks.size() + 1, FsdpGroup{});
  FsdpGroup& root = groups->back();
  root.first_op = 0;
  root.last_op = static_cast<int>(g.ops.size()) - 1;
  root.reshard_after_forward = false;  // kept from its forward to its backward
  for (size_t b = 0; b < g.blocks.size(); ++b) {
    (*groups)[b].scope = g.blocks[b];
    (*groups)[b].reshard_after_forward = reshard_after_forward;
  }
  for (size_t i = 0; i < g.ops.size(); ++i) {
    for (size_t b = 0; b < g.blocks.size(); ++b) {
      if (!ScopeWithin(g.ops[i].scope, g.blocks[b])) continue;
      FsdpGroup& grp = (*groups)[b];
      if (grp.first_op < 0) grp.first_op = static_cast<int>(i);
      grp.last_op = static_cast<int>(i);
      break;
    }
  }
  group_of->assign(g.tensors.size(), -1);
  for (size_t t = 0; t < g.tensors.size(); ++t) {
    const Tensor& ten = g.tensors[t];
    if (ten.role != TensorRole::kParameter) continue;
    const int b = BlockOf(g, ten.name);
    // A block no op runs in (or a parameter outside every block) is the root's.
    const int k = b >= 0 && (*groups)[b].first_op >= 0 ? b : static_cast<int>(g.blocks.size());
    (*group_of)[t] = k;
    (*groups)[k].params.push_back(static_cast<int>(t));
  }
}

namespace {

// CPUOffloadPolicy's host memory: each shard pinned; each trainable one's gradient, copied to
// the host by a non-blocking .to("cpu") (pinned); the optimizer state over the shards and its
// step's scratch.
Status PlanCpuOffload(const Graph& g, const RunConfig& c, Fsdp2View& v) {
  v.cpu_offload = true;
  const int64_t state = CostsOf(c.optimizer, c.runtime).state;
  int64_t largest = 0;
  for (const FsdpGroup& grp : v.groups) {
    for (size_t j = 0; j < grp.params.size(); ++j) {
      const int64_t shard = grp.shard_bytes[j];
      MEMEST_ASSIGN_OR_RETURN(const int64_t pinned, PinnedHostBytes(shard));
      MEMEST_ASSIGN_OR_RETURN(v.host_bytes, CheckedAdd(v.host_bytes, pinned));
      if (!g.tensors[grp.params[j]].requires_grad) continue;
      largest = std::max(largest, shard);
      MEMEST_ASSIGN_OR_RETURN(v.host_bytes, CheckedAdd(v.host_bytes, pinned));
      MEMEST_ASSIGN_OR_RETURN(const int64_t states, CheckedMul(shard, state));
      MEMEST_ASSIGN_OR_RETURN(v.host_bytes, CheckedAdd(v.host_bytes, states));
    }
  }
  MEMEST_ASSIGN_OR_RETURN(const int64_t scratch, CpuStepScratchBytes(c, largest));
  MEMEST_ASSIGN_OR_RETURN(v.host_bytes, CheckedAdd(v.host_bytes, scratch));
  return Status::Ok();
}

}  // namespace

StatusOr<int64_t> CpuStepScratchBytes(const RunConfig& c, int64_t largest_shard_bytes) {
  const OptimizerCosts costs = CostsOf(c.optimizer, c.runtime);
  return CheckedMul(largest_shard_bytes, costs.loop_scratch + costs.loop_carry);
}

StatusOr<Fsdp2View> PlanFsdp2(const Graph& g, const RunConfig& c) {
  const ParallelismConfig& p = c.parallelism;
  const int64_t world = ShardRanks(p);  // HSDP: the shard group; replicas hold the same
  Fsdp2View v;
  GroupByBlocks(g, p.reshard_after_forward, &v.groups, &v.group_of);
  if (p.keep_last_block_gathered) {  // the last block that has parameters (the root is last)
    for (size_t k = v.groups.size() - 1; k-- > 0;) {
      if (v.groups[k].params.empty()) continue;
      v.groups[k].reshard_after_forward = false;
      break;
    }
  }
  v.shards.resize(g.tensors.size());
  // Mixed precision (MixedPrecisionPolicy(param_dtype=16-bit, reduce_dtype=float32)): the
  // graph computes in the 16-bit dtype, the shards and the reduction are float32.
  for (FsdpGroup& grp : v.groups) {
    for (int t : grp.params) {
      const Tensor& ten = g.tensors[t];
      const DType param = ten.dtype;
      const DType sharded = p.fsdp_mixed_precision ? DType::kFloat32 : param;
      const DType reduce = p.fsdp_mixed_precision ? DType::kFloat32 : param;
      v.sharded_dtype = sharded;
      v.reduce_dtype = reduce;
      Tensor& shard = v.shards[t];
      shard = ten;
      shard.shape = ShardShape(ten.shape, world);
      shard.dtype = sharded;
      const Shape padded = PaddedShape(ten.shape, world);
      int64_t unsharded = 0;
      MEMEST_RETURN_IF_ERROR(Add(&unsharded, padded, param, "unsharded parameters"));
      grp.unsharded_bytes.push_back(unsharded);
      int64_t shard_bytes = 0;
      MEMEST_RETURN_IF_ERROR(Add(&shard_bytes, shard.shape, sharded, "shards"));
      grp.shard_bytes.push_back(shard_bytes);
      MEMEST_RETURN_IF_ERROR(Add(&grp.flat_bytes, padded, param, "all-gather output"));
      int64_t cast = 0;
      if (sharded != param) {
        MEMEST_RETURN_IF_ERROR(Add(&cast, shard.shape, param, "all-gather input"));
        MEMEST_ASSIGN_OR_RETURN(grp.copy_in_bytes, CheckedAdd(grp.copy_in_bytes, cast));
      }
      grp.cast_bytes.push_back(cast);
      if (!ten.requires_grad) continue;
      MEMEST_RETURN_IF_ERROR(Add(&grp.reduce_input_bytes, padded, reduce, "reduce-scatter input"));
      MEMEST_RETURN_IF_ERROR(
          Add(&grp.reduce_output_bytes, shard.shape, reduce, "reduce-scatter output"));
      MEMEST_RETURN_IF_ERROR(Add(&grp.sharded_grad_bytes, shard.shape, sharded, "gradients"));
    }
  }
  if (p.fsdp_cpu_offload) MEMEST_RETURN_IF_ERROR(PlanCpuOffload(g, c, v));
  return v;
}

std::string FsdpRanksText(const ParallelismConfig& p) {
  std::string out = "over " + std::to_string(p.data) + " ranks";
  if (p.data_shard > 0) {
    out += ", HSDP: sharded within groups of " + std::to_string(p.data_shard) +
           ", replicated " + std::to_string(p.data / p.data_shard) +
           " times (the sharded gradients all-reduced across the replicas, in place)";
  }
  return out;
}

void AddFsdp2Notes(const RunConfig& c, const Fsdp2View& v, Report* r) {
  const FsdpGroup& root = v.groups.back();
  int64_t largest = 0;
  int blocks = 0;
  for (size_t k = 0; k + 1 < v.groups.size(); ++k) {
    if (v.groups[k].params.empty()) continue;
    ++blocks;
    largest = std::max(largest, v.groups[k].flat_bytes);
  }
  const ParallelismConfig& p = c.parallelism;
  r->notes.push_back(
      "FSDP2 " + FsdpRanksText(p) + "; rank 0 estimated (torch.chunk gives it "
      "the largest shards): fully_shard on " + std::to_string(blocks) + " blocks and the root; "
      "parameters, gradients and optimizer state are kept as dim-0 shards in " +
      std::string(DTypeName(v.sharded_dtype)) + ", gradients reduce-scattered in " +
      std::string(DTypeName(v.reduce_dtype)) + "; the largest block gathers " +
      FormatBytes(largest) + " (and its all-gather buffer as much again), the root " +
      FormatBytes(root.flat_bytes) + ", kept from forward to the end of backward; in backward "
      "a block and the one before it (prefetched) are gathered at once" +
      (!p.reshard_after_forward ? "; reshard_after_forward=False: every block stays gathered "
                                  "from its forward to its backward"
       : p.keep_last_block_gathered ? "; the last block keeps its parameters gathered from its "
                                      "forward to its backward (reshard_after_forward=False on "
                                      "it alone)"
                                    : ""));
  if (v.cpu_offload) {
    r->notes.push_back(
        "CPUOffloadPolicy: the shards, their gradients and the optimizer state are host memory (" +
        FormatBytes(v.host_bytes) + ", data_parallel.host_bytes; each shard and gradient "
        "pinned, rounded up to a power of two by PyTorch's pinned allocator) and the optimizer "
        "steps on the CPU; the GPU keeps no shard: each all-gather copies its shards in first, "
        "and each reduce-scatter's output goes to the host");
  }
  r->notes.push_back(
      "FSDP2's streams: the all-gather outputs (and their mixed-precision copy-in) are allocated "
      "on all_gather_copy_in_stream, the reduce-scatter outputs and the sharded gradients on "
      "reduce_scatter_stream; the caching allocator keeps each stream's cached blocks apart, "
      "which the reserved memory counts");
}

}  // namespace memest
