#include "engine/passes/fsdp1.h"

#include <algorithm>
#include <string>
#include <utility>

#include "engine/ir/shape.h"
#include "engine/step/optimizers.h"

namespace memest {
namespace {

StatusOr<int64_t> Times(int64_t elements, DType dtype, const char* what) {
  MEMEST_ASSIGN_OR_RETURN(int64_t bytes, CheckedMul(elements, DTypeSize(dtype)));
  if (bytes > kMaxTensorBytes) {
    return InvalidArgument(std::string("model: an FSDP unit's ") + what + " would pass 2^62 bytes");
  }
  return bytes;
}

// CPUOffload: the pinned `_local_shard` and `_cpu_grad` (each rounded up by PyTorch's pinned
// allocator), the optimizer's state over the shard when it trains (and *stepped, the largest
// such shard's bytes, for its step's scratch); the unshard's GPU copy.
Status PlanCpuOffload(const Graph& g, const RunConfig& c, Fsdp1Unit* u, Fsdp1View* v,
                      int64_t* stepped) {
  v->cpu_offload = true;
  MEMEST_ASSIGN_OR_RETURN(u->offload_copy_bytes, Times(u->shard, u->flat_shard.dtype, "shard"));
  MEMEST_ASSIGN_OR_RETURN(const int64_t pinned, PinnedHostBytes(u->offload_copy_bytes));
  MEMEST_ASSIGN_OR_RETURN(const int64_t both, CheckedMul(pinned, 2));
  MEMEST_ASSIGN_OR_RETURN(v->host_bytes, CheckedAdd(v->host_bytes, both));
  bool trains = false;
  for (int t : u->group.params) trains |= g.tensors[t].requires_grad;
  if (!trains) return Status::Ok();
  *stepped = std::max(*stepped, u->offload_copy_bytes);
  MEMEST_ASSIGN_OR_RETURN(
      const int64_t states,
      CheckedMul(u->offload_copy_bytes, CostsOf(c.optimizer, c.runtime).state));
  MEMEST_ASSIGN_OR_RETURN(v->host_bytes, CheckedAdd(v->host_bytes, states));
  return Status::Ok();
}

}  // namespace

StatusOr<Fsdp1View> PlanFsdp1(const Graph& g, const RunConfig& c) {
  const ParallelismConfig& p = c.parallelism;
  const int64_t world = ShardRanks(p);  // HSDP: the shard group; replicas hold the same
  std::vector<FsdpGroup> groups;
  Fsdp1View v;
  int64_t stepped = 0;  // offloaded: the largest shard the CPU optimizer steps
  GroupByBlocks(g, p.reshard_after_forward, &groups, &v.unit_of);
  for (FsdpGroup& grp : groups) {
    Fsdp1Unit u;
    u.group = std::move(grp);
    DType param = DType::kFloat32;
    for (int t : u.group.params) {
      u.numel += Numel(g.tensors[t].shape);  // parameters: below 2^62 in all, the builder checked
      param = g.tensors[t].dtype;
    }
    const DType orig = p.fsdp_mixed_precision ? DType::kFloat32 : param;
    const DType reduce = p.fsdp_mixed_precision ? DType::kFloat32 : param;
    u.shard = (u.numel + world - 1) / world;
    const int64_t padded = u.shard * world;
    MEMEST_ASSIGN_OR_RETURN(u.full_bytes, Times(padded, param, "full parameters"));
    if (orig != param) {
      MEMEST_ASSIGN_OR_RETURN(u.mp_shard_bytes, Times(u.shard, param, "_mp_shard"));
    }
    MEMEST_ASSIGN_OR_RETURN(u.flat_grad_bytes, Times(u.numel, param, "gradient"));
    if (reduce != param) {
      MEMEST_ASSIGN_OR_RETURN(u.reduce_copy_bytes, Times(u.numel, reduce, "gradient copy"));
    }
    if (u.numel % world != 0) {
      MEMEST_ASSIGN_OR_RETURN(u.pad_bytes, Times(padded, reduce, "padded gradient"));
    }
    MEMEST_ASSIGN_OR_RETURN(u.sharded_grad_bytes, Times(u.shard, reduce, "sharded gradient"));
    if (reduce != orig) {
      MEMEST_ASSIGN_OR_RETURN(u.grad_cast_bytes, Times(u.shard, orig, "sharded gradient"));
    }
    u.flat_shard.name = u.group.scope.empty() ? "_fsdp_wrapped_module.flat_param"
                                              : u.group.scope + ".flat_param";
    u.flat_shard.shape = {u.shard};
    u.flat_shard.dtype = orig;
    u.flat_shard.role = TensorRole::kParameter;
    u.flat_shard.requires_grad = true;
    if (p.fsdp_cpu_offload && !u.group.params.empty()) {
      MEMEST_RETURN_IF_ERROR(PlanCpuOffload(g, c, &u, &v, &stepped));
    }
    v.first_param.push_back(u.group.params.empty() ? -1 : u.group.params.front());
    v.units.push_back(std::move(u));
  }
  if (v.cpu_offload) {
    MEMEST_ASSIGN_OR_RETURN(const int64_t scratch, CpuStepScratchBytes(c, stepped));
    MEMEST_ASSIGN_OR_RETURN(v.host_bytes, CheckedAdd(v.host_bytes, scratch));
  }
  return v;
}

}  // namespace memest
