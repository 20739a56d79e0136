// The planner's search space and its order (engine/plan/planner.h): the GPU counts and
// divisors it walks, the model states' lower bound that prunes a split unestimated, and the
// order plans are listed in.
#ifndef MEMEST_ENGINE_PLAN_PLAN_SPACE_H_
#define MEMEST_ENGINE_PLAN_PLAN_SPACE_H_

#include <cstdint>
#include <vector>

#include "engine/ir/config.h"
#include "engine/plan/planner.h"

namespace memest {

// n's divisors, ascending.
std::vector<int64_t> Divisors(int64_t n);

// The GPU counts tried: powers of two up to the budget, and the budget itself.
std::vector<int64_t> GpuCounts(int64_t max_gpus);

// The model states of one GPU's step: parameters, gradients, optimizer state.
struct States {
  int64_t params = 0, grads = 0, state = 0;
  int64_t total() const { return params + grads + state; }  // each below 2^62 / 4
};

// What any rank of a split keeps at least (plan_space.cc says how it is bounded).
int64_t LowerBound(const States& s, DataSharding sharding, int64_t data, int64_t tensor,
                   int64_t pipeline, int64_t expert, bool half);

// CPU offload, as the planner tries it: DeepSpeed's offload_optimizer (ZeRO-2 and -3) and
// offload_param (ZeRO-3, with the optimizer's), FSDP's fsdp_cpu_offload (FSDP1 and FSDP2).
struct Offload {
  bool optimizer = false, param = false, fsdp = false;
  bool any() const { return optimizer || param || fsdp; }
};

// The offloads a strategy takes (none for the others).
std::vector<Offload> OffloadsOf(DataSharding sharding);

// Sets the offload's flags in `p`.
void ApplyOffload(const Offload& o, ParallelismConfig* p);

// What any rank keeps at least of the model states with offload `o`: the 16-bit parameters
// ZeRO-2 keeps whole, or the partition ZeRO-3 keeps with the optimizer alone offloaded; 0
// when the parameters leave the GPU too.
int64_t OffloadLowerBound(const States& s, DataSharding sharding, const Offload& o,
                          int64_t data, int64_t tensor, int64_t pipeline);

// The model-state bytes one rank copies between host and GPU per step under offload `o`, from
// the one-GPU parameters and gradients (s) split over tensor x pipeline x data ranks, with
// `micro` micro-batches a step (docs/planning.md): FSDP copies each shard in for the forward
// and again for the backward and each gradient shard out, per micro-batch; ZeRO-3 with
// offload_param the same, and its gradient partition back in (partition_grads'
// `grad_buffer.to(device)`); ZeRO-3 with the optimizer alone the gradients out and back per
// micro-batch and the updated 16-bit partition in once a step; ZeRO-2 the gradients out per
// micro-batch and the updated 16-bit partition in once a step.
int64_t HostTransferBytes(const States& s, DataSharding sharding, const Offload& o,
                          int64_t data, int64_t tensor, int64_t pipeline, int64_t micro);

// Plan order: the smaller GPU, no recomputation first, the smaller bubble, fewer tensor and
// expert ranks, fewer bytes to and from the host, the larger micro-batch, the most headroom.
bool Before(const Plan& a, const Plan& b);

}  // namespace memest

#endif  // MEMEST_ENGINE_PLAN_PLAN_SPACE_H_
