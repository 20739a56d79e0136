#include "engine/passes/data_parallel.h"

#include <algorithm>
#include <functional>
#include <queue>
#include <utility>

#include "engine/ir/shape.h"
#include "engine/step/optimizers.h"

namespace memest {
namespace {

// DistributedDataParallel's _DEFAULT_FIRST_BUCKET_BYTES; its default bucket_cap_mb is 25.
constexpr int64_t kFirstBucketBytes = int64_t{1} << 20;
constexpr int64_t kDefaultBucketCapBytes = int64_t{25} << 20;

bool Trainable(const Tensor& t) { return t.role == TensorRole::kParameter && t.requires_grad; }

// compute_bucket_assignment_by_size: per dtype, append each tensor to its dtype's open bucket;
// once the bucket's bytes reach the current limit it closes and that dtype moves to the next
// limit (the last one repeats). A bucket can pass its limit by one whole parameter; parameters
// are never split. Buckets come out as they close, then the ones left open.
std::vector<DdpBucket> AssignBuckets(const Graph& g, const std::vector<int>& order,
                                     const std::vector<int64_t>& limits) {
  std::vector<DdpBucket> done;
  std::vector<std::pair<DdpBucket, size_t>> open;  // per dtype: the bucket, its limit's index
  for (int t : order) {
    const Tensor& p = g.tensors[t];
    size_t k = 0;
    while (k < open.size() && open[k].first.dtype != p.dtype) ++k;
    if (k == open.size()) open.push_back({DdpBucket{p.dtype, 0, {}}, 0});
    DdpBucket& b = open[k].first;
    b.params.push_back(t);
    // Parameters are model states, whose sum the graph's builder has checked.
    b.bytes += Bytes(p.shape, p.dtype);
    if (b.bytes >= limits[open[k].second]) {
      done.push_back(std::move(b));
      b = DdpBucket{p.dtype, 0, {}};
      open[k].second = std::min(open[k].second + 1, limits.size() - 1);
    }
  }
  for (auto& [b, limit] : open) {
    if (!b.params.empty()) done.push_back(std::move(b));
  }
  return done;
}

}  // namespace

int64_t RankView::BucketBytes() const {
  int64_t total = 0;
  for (const DdpBucket& b : buckets) {
    if (!AddBytes(&total, b.bytes)) return kMaxBytes;
  }
  return total;
}

std::vector<int> GradReadyOrder(const Graph& g) {
  std::vector<int> first_reader(g.tensors.size(), -1);
  for (size_t i = g.ops.size(); i-- > 0;) {
    for (int t : g.ops[i].inputs) first_reader[t] = static_cast<int>(i);
  }
  std::vector<int> order;
  std::vector<char> placed(g.tensors.size(), 0);
  for (size_t i = g.ops.size(); i-- > 0;) {
    const std::vector<int>& in = g.ops[i].inputs;
    for (auto it = in.rbegin(); it != in.rend(); ++it) {
      const int t = *it;
      if (!placed[t] && Trainable(g.tensors[t]) && first_reader[t] == static_cast<int>(i)) {
        placed[t] = 1;
        order.push_back(t);
      }
    }
  }
  for (size_t t = 0; t < g.tensors.size(); ++t) {
    if (!placed[t] && Trainable(g.tensors[t])) order.push_back(static_cast<int>(t));
  }
  return order;
}

std::vector<int64_t> PartitionLargestFirst(const Graph& g, const std::vector<int>& params,
                                           int64_t world) {
  std::vector<size_t> by_size(params.size());
  for (size_t k = 0; k < by_size.size(); ++k) by_size[k] = k;
  std::stable_sort(by_size.begin(), by_size.end(), [&](size_t a, size_t b) {
    return Numel(g.tensors[params[a]].shape) > Numel(g.tensors[params[b]].shape);
  });
  // The ranks that own something, by (elements, rank); the ranks not used yet own nothing and
  // come in order, so the least loaded rank is the lower of the heap's top and the next unused.
  using Load = std::pair<int64_t, int64_t>;
  std::priority_queue<Load, std::vector<Load>, std::greater<Load>> used;
  int64_t next_unused = 0;
  std::vector<int64_t> rank_of(params.size(), 0);
  for (size_t k : by_size) {
    Load least;
    if (next_unused < world && (used.empty() || used.top().first > 0 ||
                                used.top().second > next_unused)) {
      least = {0, next_unused++};
    } else {
      least = used.top();
      used.pop();
    }
    rank_of[k] = least.second;
    // Element counts are below 2^62 each and there are fewer than 2^31 parameters.
    least.first += Numel(g.tensors[params[k]].shape);
    used.push(least);
  }
  return rank_of;
}

StatusOr<RankView> PlanDataParallel(const Graph& g, const RunConfig& c) {
  RankView view;
  const ParallelismConfig& p = c.parallelism;
  if (p.sharding == DataSharding::kNone || c.mode != Mode::kTraining) return view;
  view.world = p.data;
  view.grads_in_buckets = p.gradient_as_bucket_view;
  if (IsDeepSpeedZero(p.sharding)) {
    MEMEST_ASSIGN_OR_RETURN(view.deepspeed, PlanDeepSpeedZero(g, c));
    view.rank = view.deepspeed->rank;
    view.optimizer_owns.assign(g.tensors.size(), 0);  // the flat partition is stepped instead
    return view;
  }
  if (p.sharding == DataSharding::kDeepSpeedZero3) {  // every rank alike (rank 0's partitions)
    MEMEST_ASSIGN_OR_RETURN(view.zero3, PlanDeepSpeedZero3(g, c));
    view.optimizer_owns.assign(g.tensors.size(), 0);  // the fp32 partitions are stepped
    return view;
  }
  if (p.sharding == DataSharding::kFsdp1) {  // rank 0 holds full shards, the last the padding
    MEMEST_ASSIGN_OR_RETURN(view.fsdp1, PlanFsdp1(g, c));
    return view;
  }
  if (p.sharding == DataSharding::kFsdp2) {  // rank 0 holds the largest shards
    MEMEST_ASSIGN_OR_RETURN(view.fsdp2, PlanFsdp2(g, c));
    return view;
  }
  if (p.sharding == DataSharding::kMegatronDdp || p.sharding == DataSharding::kMegatronDistOpt) {
    MEMEST_ASSIGN_OR_RETURN(view.megatron, PlanMegatronDdp(g, c));  // every rank alike
    view.optimizer_owns.assign(g.tensors.size(), 0);  // the float32 masters are stepped instead
    return view;
  }

  const std::vector<int> ready = GradReadyOrder(g);
  if (c.step == StepKind::kFirstStep) {
    // Construction: parameters in reverse definition order, one bucket per dtype.
    std::vector<int> defined;
    for (size_t t = g.tensors.size(); t-- > 0;) {
      if (Trainable(g.tensors[t])) defined.push_back(static_cast<int>(t));
    }
    view.buckets = AssignBuckets(g, defined, {kMaxBytes});
  } else {
    const int64_t cap = p.bucket_cap_bytes > 0 ? p.bucket_cap_bytes : kDefaultBucketCapBytes;
    // PyTorch 2.4+ (pytorch/pytorch#121640): a bucket_cap_mb the caller gives sizes the first
    // bucket too; 1.13 always starts with 1 MiB.
    const bool first_is_cap = p.bucket_cap_bytes > 0 && c.runtime == Runtime::kCuda;
    view.buckets = AssignBuckets(g, ready, {first_is_cap ? cap : kFirstBucketBytes, cap});
  }

  if (p.sharding == DataSharding::kZero1) {
    std::vector<int> params;  // model.parameters() order
    for (size_t t = 0; t < g.tensors.size(); ++t) {
      if (Trainable(g.tensors[t])) params.push_back(static_cast<int>(t));
    }
    const std::vector<int64_t> rank_of = PartitionLargestFirst(g, params, p.data);
    view.owned_elements.assign(std::min<int64_t>(p.data, std::max<size_t>(params.size(), 1)), 0);
    for (size_t k = 0; k < params.size(); ++k) {
      view.owned_elements[rank_of[k]] += Numel(g.tensors[params[k]].shape);
    }
    view.rank = std::max_element(view.owned_elements.begin(), view.owned_elements.end()) -
                view.owned_elements.begin();
    view.optimizer_owns.assign(g.tensors.size(), 0);
    for (size_t k = 0; k < params.size(); ++k) {
      if (rank_of[k] == view.rank) view.optimizer_owns[params[k]] = 1;
    }
  }
  return view;
}

DataParallelReport DataParallelReportOf(const RankView& view) {
  DataParallelReport r;
  r.world = view.world;
  r.rank = view.rank;
  for (const DdpBucket& b : view.buckets) r.bucket_bytes.push_back(b.bytes);
  r.owned_elements = view.owned_elements;
  if (view.deepspeed) r.host_bytes = view.deepspeed->HostBytes();
  if (view.zero3) r.host_bytes = view.zero3->HostBytes();
  if (view.fsdp2) r.host_bytes = view.fsdp2->host_bytes;
  if (view.fsdp1) r.host_bytes = view.fsdp1->host_bytes;
  return r;
}

void AddDataParallelNotes(const RunConfig& c, const RankView& view, Report* r) {
  const ParallelismConfig& p = c.parallelism;
  if (const auto& f = view.fsdp2) {
    AddFsdp2Notes(c, *f, r);
    return;
  }
  if (const auto& f = view.fsdp1) {
    int64_t largest = 0;
    for (size_t k = 0; k + 1 < f->units.size(); ++k) {
      largest = std::max(largest, f->units[k].full_bytes);
    }
    // FSDP1's names: HYBRID_SHARD and _HYBRID_SHARD_ZERO2 are FULL_SHARD and SHARD_GRAD_OP
    // within each shard group.
    const bool hybrid = p.data_shard > 0;
    const std::string strategy =
        p.reshard_after_forward
            ? std::string(hybrid ? "HYBRID_SHARD" : "FULL_SHARD") +
                  ": a block's full parameters are freed after its forward and gathered again "
                  "for its backward"
            : std::string(hybrid ? "_HYBRID_SHARD_ZERO2" : "SHARD_GRAD_OP") +
                  ": a block's full parameters stay from its forward to its backward";
    r->notes.push_back(
        "FSDP1 " + FsdpRanksText(p) + "; rank 0 estimated: "
        "FullyShardedDataParallel auto-wrapped by block, use_orig_params=False (each unit's "
        "parameters one flat shard, stepped as one tensor); " + strategy +
        "; the largest block gathers " + FormatBytes(largest) + ", the root " +
        FormatBytes(f->units.back().full_bytes) + " (kept to the end of backward); "
        "BACKWARD_PRE prefetching holds two blocks in backward; a unit's gradients are "
        "concatenated into one flat gradient and reduce-scattered");
    if (f->cpu_offload) {
      r->notes.push_back(
          "CPUOffload(offload_params=True): each unit's flat shard, its gradient (_cpu_grad) "
          "and the optimizer state are host memory (" + FormatBytes(f->host_bytes) +
          ", data_parallel.host_bytes; shards and gradients pinned, rounded up to a power of "
          "two by PyTorch's pinned allocator) and the optimizer steps on the CPU; each unshard "
          "copies the unit's shard to the GPU first, and the reduce-scattered shards stay on "
          "the GPU until backward ends");
    }
    r->notes.push_back(
        "FSDP1's streams: the unsharded flat parameters are allocated on its unshard stream, "
        "the mixed-precision and offloaded shard copies on its pre-unshard stream, the "
        "gradient's copies and the sharded gradients on its post-backward stream, each "
        "stream's cached blocks apart; not counted: its record_stream frees (the allocator "
        "reuses such a block only once the GPU has passed it, so the reserved memory can be "
        "higher; limit_all_gathers bounds it)");
    return;
  }
  if (const auto& mg = view.megatron) {
    AddMegatronDdpNotes(c, *mg, r);
    return;
  }
  if (const auto& z = view.deepspeed) {
    AddDeepSpeedZeroNotes(c, *z, r);
    return;
  }
  if (const auto& z = view.zero3) {
    AddDeepSpeedZero3Notes(c, *z, r);
    return;
  }
  std::string ddp = "DistributedDataParallel over " + std::to_string(view.world) +
                    " ranks: " + std::to_string(view.buckets.size()) + " gradient buckets (" +
                    FormatBytes(view.BucketBytes()) + "), made with DDP and kept";
  if (c.step == StepKind::kFirstStep) {
    ddp += "; the first iteration's layout (one bucket per dtype), rebuilt before the second";
  }
  ddp += p.gradient_as_bucket_view
             ? "; gradient_as_bucket_view: .grad is the bucket's view, autograd's gradient goes "
               "once copied"
             : "; .grad stays a tensor of its own beside its bucket's copy";
  if (c.grad_accum_steps > 1) {
    ddp += "; micro-batches before the last run under no_sync()";
  }
  r->notes.push_back(ddp);
  if (p.gradient_as_bucket_view && !c.zero_grad_set_to_none) {
    r->notes.push_back(
        "not in this estimate: the second step's forward, where DDP rebuilds its buckets while "
        ".grad still views the old ones (gradient_as_bucket_view with zero_grad(set_to_none="
        "False)); measured on 1.13 it holds up to one more copy of the gradients, and it is the "
        "run's peak: leave set_to_none=True, or keep that copy of headroom");
  }
  if (p.sharding == DataSharding::kZero1) {
    int64_t total = 0;
    int64_t least = view.owned_elements.empty() ? 0 : view.owned_elements[0];
    for (int64_t e : view.owned_elements) {
      total += e;  // parameter elements: below 2^62 in all
      least = std::min(least, e);
    }
    if (static_cast<int64_t>(view.owned_elements.size()) < view.world) least = 0;
    r->notes.push_back(
        "ZeroRedundancyOptimizer: rank " + std::to_string(view.rank) + ", estimated here, " +
        "steps " + std::to_string(view.owned_elements.empty() ? 0 : view.owned_elements[view.rank]) +
        " of " + std::to_string(total) + " parameter elements (the least loaded rank " +
        std::to_string(least) + "); parameters and gradients stay whole on every rank");
  }
}

int64_t CommunicatedBytesPerStep(const Graph& g, const RunConfig& c) {
  const ParallelismConfig& p = c.parallelism;
  const double m = static_cast<double>(c.grad_accum_steps);
  double params = 0, grads = 0, sent = 0, received = 0;
  double grads32 = 0;  // the trainable parameters' elements in float32 (Megatron's buffer)
  for (const Tensor& t : g.tensors) {
    const double bytes = static_cast<double>(Bytes(t.shape, t.dtype));
    if (t.role == TensorRole::kParameter) {
      params += bytes;
      if (t.requires_grad) grads += bytes;
      if (t.requires_grad) grads32 += 4.0 * static_cast<double>(Numel(t.shape));
    } else if (t.role == TensorRole::kInput && t.requires_grad) {
      received += bytes;  // a pipeline stage's received activation
    }
  }
  if (p.pipeline > 1 && g.loss >= 0 && !g.tensors[g.loss].shape.empty()) {
    sent = static_cast<double>(Bytes(g.tensors[g.loss].shape, g.tensors[g.loss].dtype));
  }
  double total = m * (sent + received);  // activations on, their gradients back
  const double d = static_cast<double>(p.data);
  const double share = (d - 1) / d;
  // The sharded optimizers gather the parameters they updated: the trainable ones, whose bytes
  // are the gradients' (a frozen base, under LoRA, never changes).
  const double updated = grads;
  switch (p.sharding) {
    case DataSharding::kNone: break;
    case DataSharding::kDdp: total += 2 * share * grads; break;
    case DataSharding::kZero1: total += 2 * share * grads + share * updated; break;
    case DataSharding::kDeepSpeedZero2: total += m * share * grads + share * updated; break;
    case DataSharding::kDeepSpeedZero1: total += share * grads + share * updated; break;
    case DataSharding::kDeepSpeedZero3: {
      // Forward gathers every parameter but the persistent ones (gathered once, after the
      // step); a steady step keeps about the last max_reuse_distance / 2 elements gathered into
      // backward and gathers the rest again, the first (recording) step all of them; the
      // 16-bit gradients are reduce-scattered.
      double persistent = 0, gathered = 0, elements = 0;
      for (const Tensor& t : g.tensors) {
        if (t.role != TensorRole::kParameter) continue;
        const double n = static_cast<double>(Numel(t.shape));
        const double bytes = static_cast<double>(Bytes(t.shape, t.dtype));
        if (n <= static_cast<double>(p.stage3_param_persistence_threshold)) {
          persistent += bytes;
        } else {
          gathered += bytes;
          elements += n;
        }
      }
      double again = 1;
      if (c.step == StepKind::kSteadyState && elements > 0) {
        again = std::max(0.0, elements - static_cast<double>(p.stage3_max_reuse_distance) / 2) /
                elements;
      }
      total += m * share * (gathered * (1 + again) + grads) + share * persistent;
      break;
    }
    case DataSharding::kMegatronDdp: total += 2 * share * grads32; break;
    case DataSharding::kMegatronDistOpt:  // float32 gradients scattered, parameters gathered
      total += share * grads32 + share * updated;
      break;
    case DataSharding::kFsdp1:
    case DataSharding::kFsdp2: {
      // All-gathers (forward and backward) and the reduce-scatter within the shard group; under
      // HSDP each sharded gradient is all-reduced across the replicas as well.
      const double reduce = p.fsdp_mixed_precision ? 2 : 1;  // float32 over 16-bit gradients
      const double s = static_cast<double>(ShardRanks(p)), r = d / s;
      total += m * (s - 1) / s * (2 * params + reduce * grads);
      total += m * 2 * (r - 1) / r * reduce * grads / s;
      break;
    }
  }
  return total >= static_cast<double>(kMaxBytes) ? kMaxBytes : static_cast<int64_t>(total);
}

}  // namespace memest
