#include "engine/plan/plan_space.h"

#include <algorithm>
#include <limits>
#include <tuple>

namespace memest {

std::vector<int64_t> Divisors(int64_t n) {
  std::vector<int64_t> out;
  for (int64_t k = 1; k * k <= n; ++k) {
    if (n % k != 0) continue;
    out.push_back(k);
    if (k != n / k) out.push_back(n / k);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<int64_t> GpuCounts(int64_t max_gpus) {
  std::vector<int64_t> out;
  for (int64_t n = 1; n <= max_gpus; n *= 2) out.push_back(n);
  if (out.back() != max_gpus) out.push_back(max_gpus);
  return out;
}

// What any rank of a split keeps at least: its stage's share (the worst stage holds at least
// the average) of what its strategy keeps whole, and of what it shards over the data ranks.
// ZeRO-2's fp32 master copy and optimizer state only add to this, as do buckets and
// activations. `half`: the model's parameters are 16-bit, whose gradients Megatron keeps in
// float32 (twice their bytes) and whose float32 master and state take at least three times the
// 16-bit state the one-GPU estimate counts (Adam: 12 bytes against 4).
// Expert parallelism splits part of what stays whole over `expert` ranks (the experts), and
// shards their share over data / expert ranks, at least as much per rank as over data: dividing
// all of it by `expert` keeps the bound below.
int64_t LowerBound(const States& s, DataSharding sharding, int64_t data, int64_t tensor,
                   int64_t pipeline, int64_t expert, bool half) {
  int64_t whole = s.total(), sharded = 0;
  switch (sharding) {
    case DataSharding::kNone:
    case DataSharding::kDdp: break;
    case DataSharding::kZero1:
    case DataSharding::kDeepSpeedZero1:  // the planner's splits keep the optimizer on the GPU
      whole = s.params + s.grads;
      sharded = s.state;
      break;
    case DataSharding::kMegatronDistOpt:  // float32 gradients whole, master and state sharded
      whole = s.params + (half ? 2 : 1) * s.grads;
      sharded = (half ? 3 : 1) * s.state;
      break;
    case DataSharding::kMegatronDdp:
      whole = s.params + (half ? 2 : 1) * s.grads + (half ? 3 : 1) * s.state;
      break;
    case DataSharding::kDeepSpeedZero2: whole = s.params; sharded = s.grads + s.state; break;
    case DataSharding::kDeepSpeedZero3:  // 16-bit partitions; float32 masters and state
      whole = 0;
      sharded = s.params + s.grads + (half ? 3 : 1) * s.state;
      break;
    case DataSharding::kFsdp1:
    case DataSharding::kFsdp2: whole = 0; sharded = s.total(); break;
  }
  return (whole / (pipeline * expert) + sharded / (pipeline * data)) / tensor;
}

std::vector<Offload> OffloadsOf(DataSharding sharding) {
  switch (sharding) {
    case DataSharding::kDeepSpeedZero2: return {Offload{true, false, false}};
    case DataSharding::kDeepSpeedZero3:
      return {Offload{true, false, false}, Offload{true, true, false}};
    case DataSharding::kFsdp1:
    case DataSharding::kFsdp2: return {Offload{false, false, true}};
    default: return {};
  }
}

void ApplyOffload(const Offload& o, ParallelismConfig* p) {
  p->offload_optimizer = o.optimizer;
  p->offload_param = o.param;
  p->fsdp_cpu_offload = o.fsdp;
}

int64_t OffloadLowerBound(const States& s, DataSharding sharding, const Offload& o,
                          int64_t data, int64_t tensor, int64_t pipeline) {
  if (o.param || o.fsdp) return 0;
  const int64_t params = s.params / (pipeline * tensor);
  return sharding == DataSharding::kDeepSpeedZero2 ? params : params / data;
}

namespace {

int64_t SaturatingTimes(int64_t micro, int64_t bytes) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  return bytes > 0 && micro > kMax / bytes ? kMax : micro * bytes;
}

}  // namespace

int64_t HostTransferBytes(const States& s, DataSharding sharding, const Offload& o,
                          int64_t data, int64_t tensor, int64_t pipeline, int64_t micro) {
  const int64_t split = data * tensor * pipeline;
  const int64_t p = s.params / split, g = s.grads / split;  // each below 2^62 / 4
  if (o.fsdp) return SaturatingTimes(micro, 2 * p + g);
  if (o.param) return SaturatingTimes(micro, 2 * p + 2 * g);
  const int64_t per_step = p;  // the updated 16-bit partition
  const int64_t out = SaturatingTimes(micro, sharding == DataSharding::kDeepSpeedZero3 ? 2 * g : g);
  return out > std::numeric_limits<int64_t>::max() - per_step ? out : out + per_step;
}

bool Before(const Plan& a, const Plan& b) {
  const bool ra = a.recompute_fraction > 0, rb = b.recompute_fraction > 0;
  return std::make_tuple(a.capacity_bytes, ra, a.bubble_fraction, a.parallelism.tensor,
                         a.parallelism.expert, a.host_transfer_bytes, -a.micro_batch,
                         -a.headroom_bytes) <
         std::make_tuple(b.capacity_bytes, rb, b.bubble_fraction, b.parallelism.tensor,
                         b.parallelism.expert, b.host_transfer_bytes, -b.micro_batch,
                         -b.headroom_bytes);
}

}  // namespace memest
