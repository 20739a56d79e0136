#include "engine/passes/fsdp1.h"

#include <string>
#include <utility>

#include "engine/ir/shape.h"

namespace memest {
namespace {

StatusOr<int64_t> Times(int64_t elements, DType dtype, const char* what) {
  MEMEST_ASSIGN_OR_RETURN(int64_t bytes, CheckedMul(elements, DTypeSize(dtype)));
  if (bytes > kMaxTensorBytes) {
    return InvalidArgument(std::string("model: an FSDP unit's ") + what + " would pass 2^62 bytes");
  }
  return bytes;
}

}  // namespace

StatusOr<Fsdp1View> PlanFsdp1(const Graph& g, const RunConfig& c) {
  const ParallelismConfig& p = c.parallelism;
  const int64_t world = ShardRanks(p);  // HSDP: the shard group; replicas hold the same
  std::vector<FsdpGroup> groups;
  Fsdp1View v;
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
    v.first_param.push_back(u.group.params.empty() ? -1 : u.group.params.front());
    v.units.push_back(std::move(u));
  }
  return v;
}

}  // namespace memest
