#include "engine/plan/planner.h"

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <variant>
#include <utility>

#include "engine/estimator.h"
#include "engine/models/hf_config.h"
#include "engine/models/hf_quantization.h"
#include "engine/ir/devices.h"
#include "engine/passes/tensor_parallel.h"
#include "engine/plan/plan_space.h"

namespace memest {
namespace {

constexpr int64_t kMaxPlanGpus = int64_t{1} << 16;
// Tensor-parallel groups stay within one node (NVLink), as Megatron-LM's recipes keep them, and
// at 8 ranks: the run's gpus_per_node (8 by default) or fewer.
constexpr int64_t kMaxPlanTensor = 8;

// One split of the job, before its micro-batch is chosen.
struct Split {
  const DeviceInfo* device;
  int64_t data, tensor, pipeline;
  DataSharding sharding;
  CheckpointPolicy checkpoint;
  int64_t virtual_stages = 1;  // Megatron's interleaved 1F1B: model chunks per stage
  int64_t expert = 1;          // Megatron's expert-parallel ranks, out of the data ranks
  Offload offload;             // CPU offload (only where nothing fits without)
  int64_t data_shard = 0;      // FSDP's hybrid sharding: the shard group's data ranks
  int64_t context = 1;         // context-parallel ranks (ring attention)
  const States* states = nullptr;  // the device's one-GPU model states
};

class Planner {
 public:
  Planner(const PlanQuery& q, Budget* budget, PlanStats* stats)
      : q_(q), budget_(budget), stats_(stats) {}

  // The estimate of `s` at micro-batch `mb`: the worst rank's required bytes and the report's
  // costs; nullopt when the configuration is refused (it cannot run that way).
  StatusOr<std::optional<Plan>> Try(const Split& s, int64_t mb) {
    RunConfig c = q_.run;
    const int64_t share = q_.run.batch_size / s.data;
    c.batch_size = share;
    c.grad_accum_steps = share / mb;
    c.device = s.device->name;
    c.device_capacity_bytes = 0;
    c.checkpoint.policy = s.checkpoint;
    c.parallelism.data = s.data;
    c.parallelism.sharding = s.sharding;
    c.parallelism.pipeline = s.pipeline;
    c.parallelism.pipeline_virtual_stages = s.virtual_stages;
    c.parallelism.tensor = s.tensor;
    c.parallelism.sequence_parallel = s.tensor > 1;
    if (s.tensor == 1) c.parallelism.tensor_layers = TensorParallelLayers::kMegatron;
    c.parallelism.expert = s.expert;
    c.parallelism.data_shard = s.data_shard;
    c.parallelism.context = s.context;
    ApplyOffload(s.offload, &c.parallelism);
    if (!ValidateRunConfig(c).ok()) return std::optional<Plan>();
    MEMEST_RETURN_IF_ERROR(budget_->status());
    const Graph* graph = GraphFor(c);
    if (graph == nullptr) {
      MEMEST_RETURN_IF_ERROR(budget_->status());
      return std::optional<Plan>();  // the model cannot be built at this micro-batch
    }
    if (s.pipeline > 2) {  // screened by the end stages first: a failure costs 2/p of a full one
      ++stats_->estimates;
      EstimateOptions screen = Quiet();
      screen.end_stages_only = true;
      StatusOr<Report> r = EstimateGraph(*graph, c, screen);
      MEMEST_RETURN_IF_ERROR(budget_->status());
      if (!r.ok() || !r->fit || !r->fit->fits) return std::optional<Plan>();
    }
    ++stats_->estimates;
    StatusOr<Report> r = EstimateGraph(*graph, c, Quiet());
    MEMEST_RETURN_IF_ERROR(budget_->status());
    if (!r.ok() || !r->fit || !r->fit->fits) return std::optional<Plan>();
    const int64_t host = r->data_parallel ? r->data_parallel->host_bytes : 0;
    if (host > q_.host_bytes_per_gpu) return std::optional<Plan>();  // 0 without offload
    return std::optional<Plan>(MakePlan(s, c, mb, *r));
  }

  // The model states of one GPU's step at the smallest micro-batch: a lower bound, divided by
  // N, of what any split over N GPUs keeps per GPU.
  StatusOr<States> ModelStates(const DeviceInfo& d) {
    RunConfig c = q_.run;
    c.grad_accum_steps = c.batch_size;
    c.device = d.name;
    c.parallelism.tensor_layers = TensorParallelLayers::kMegatron;  // one GPU: no tensor ranks
    c.checkpoint.policy = CheckpointPolicy::kEveryBlock;
    MEMEST_ASSIGN_OR_RETURN(Graph g, BuildStepGraph(q_.model, c, q_.max_ops, budget_));
    if (g.blocks.empty()) c.checkpoint.policy = CheckpointPolicy::kNone;
    ++stats_->estimates;
    MEMEST_ASSIGN_OR_RETURN(Report r, EstimateGraph(g, c, Quiet()));
    blocks_ = static_cast<int64_t>(g.blocks.size());
    ParallelismConfig two;
    two.tensor = 2;
    two.sequence_parallel = true;
    tensor_ok_ = ShardTensorParallel(g, two).ok();
    // Megatron's MoELayer comes from a Hugging Face config with experts (engine/models/hf_moe.cc).
    const auto* hf = std::get_if<HfConfigSpec>(&q_.model.source);
    experts_ = hf != nullptr && HfConfigRoutesExperts(hf->config);
    megatron_tensor_ok_ = tensor_ok_;
    if (experts_) {  // its MoELayer splits otherwise than the Hugging Face one
      c.parallelism.sharding = DataSharding::kMegatronDdp;
      c.parallelism.data = 2;
      const Graph* megatron = GraphFor(c);
      megatron_tensor_ok_ = megatron != nullptr && ShardTensorParallel(*megatron, two).ok();
    }
    States s;
    s.params = r.end_of_step[static_cast<int>(Category::kParameters)];
    s.grads = r.end_of_step[static_cast<int>(Category::kGradients)];
    s.state = r.end_of_step[static_cast<int>(Category::kOptimizerState)];
    return s;
  }

  int64_t blocks() const { return blocks_; }
  // Whether the default tensor-parallel plan splits the model (engine/passes/tensor_parallel.h)
  // as `sharding` builds it (Megatron's MoELayer for a model with experts).
  bool tensor_ok(DataSharding sharding) const {
    return experts_ && IsMegatron(sharding) ? megatron_tensor_ok_ : tensor_ok_;
  }
  // Whether the model has mixture-of-experts layers (Megatron's expert parallelism splits them).
  bool experts() const { return experts_; }

 private:
  EstimateOptions Quiet() const {
    EstimateOptions o;
    o.max_ops = q_.max_ops;
    o.advice = false;
    o.budget = budget_;
    return o;
  }

  // The graph of one micro-batch: it depends on the micro-batch, the device (its attention
  // kernels) and, for a model with experts, whether Megatron trains it (its MoELayer), not on
  // the split otherwise, so each is built once. Null when it cannot be built.
  const Graph* GraphFor(const RunConfig& c) {
    const bool megatron_moe = experts_ && IsMegatron(c.parallelism.sharding);
    const auto key = std::make_tuple(c.device, c.micro_batch(), megatron_moe);
    auto it = graphs_.find(key);
    if (it == graphs_.end()) {
      StatusOr<Graph> g = BuildStepGraph(q_.model, c, q_.max_ops, budget_);
      if (!g.ok()) return nullptr;
      it = graphs_.emplace(key, std::move(*g)).first;
    }
    return &it->second;
  }

  Plan MakePlan(const Split& s, const RunConfig& c, int64_t mb, const Report& r) const {
    Plan p;
    p.device = s.device->name;
    p.gpus = s.data * s.tensor * s.context * s.pipeline;
    p.parallelism = c.parallelism;
    p.micro_batch = mb;
    p.grad_accum_steps = c.grad_accum_steps;
    p.checkpoint = s.checkpoint;
    p.required_bytes = r.fit->required_bytes;
    p.capacity_bytes = r.fit->capacity_bytes;
    p.headroom_bytes = r.fit->headroom_bytes;
    p.recompute_fraction = r.recompute_fraction;
    if (s.pipeline > 1) {  // idle time (p - 1) / v of a micro-batch's, against m of work
      const double m = static_cast<double>(c.grad_accum_steps);
      const double idle =
          static_cast<double>(s.pipeline - 1) / static_cast<double>(s.virtual_stages);
      p.bubble_fraction = idle / (m + idle);
    }
    p.communicated_bytes = r.communicated_bytes_per_step;
    if (s.offload.any()) {
      p.host_bytes = r.data_parallel->host_bytes;
      p.host_transfer_bytes = HostTransferBytes(*s.states, s.sharding, s.offload, s.data,
                                                s.tensor, s.pipeline, c.grad_accum_steps);
    }
    return p;
  }

  const PlanQuery& q_;
  Budget* budget_;
  PlanStats* stats_;
  int64_t blocks_ = 0;
  bool tensor_ok_ = false;
  bool megatron_tensor_ok_ = false;
  bool experts_ = false;
  // By device, micro-batch, Megatron's MoELayer or not, and that layer under tensor parallelism.
  std::map<std::tuple<std::string, int64_t, bool>, Graph> graphs_;
};

// A 1F1B plan whose bubble is at least this is tried interleaved as well (the estimates of a
// pipeline's interleaved schedule are the planner's costliest).
constexpr double kInterleaveBubble = 0.10;

// The largest of candidates[0, limit) at which split `s` fits, by bisection (a split that fits
// at a micro-batch fits at every smaller one); *fitting: how many of them fit. An error is the
// budget's or the deadline's.
StatusOr<std::optional<Plan>> LargestThatFits(Planner& planner, const Split& s,
                                              const std::vector<int64_t>& candidates,
                                              size_t limit, size_t* fitting) {
  std::optional<Plan> best;
  size_t lo = 0, hi = limit;  // the answer's index is in [lo, hi); hi: none
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    MEMEST_ASSIGN_OR_RETURN(std::optional<Plan> at, planner.Try(s, candidates[mid]));
    if (at) {
      best = std::move(at);
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  *fitting = lo;
  return best;
}

Status CheckQuery(const PlanQuery& q) {
  if (q.run.mode != Mode::kTraining) {
    return InvalidArgument("config.mode: plans split a training step over GPUs; an inference "
                           "replica is one GPU's estimate");
  }
  if (q.max_gpus < 1 || q.max_gpus > kMaxPlanGpus) {
    return InvalidArgument("max_gpus: must be in [1, " + std::to_string(kMaxPlanGpus) +
                           "], got " + std::to_string(q.max_gpus));
  }
  if (q.host_bytes_per_gpu < 0) {
    return InvalidArgument("host_memory_per_gpu_bytes: must not be negative, got " +
                           std::to_string(q.host_bytes_per_gpu));
  }
  if (q.max_plans < 1) {
    return InvalidArgument("max_plans: must be positive, got " + std::to_string(q.max_plans));
  }
  if (q.run.grad_accum_steps != 1) {
    return InvalidArgument("config.grad_accum_steps: the planner chooses the micro-batch; give "
                           "the global batch in config.batch_size and leave this unset");
  }
  if (q.run.checkpoint.policy != CheckpointPolicy::kNone ||
      q.run.parallelism.data != 1 || q.run.parallelism.pipeline != 1 ||
      q.run.parallelism.tensor != 1 || q.run.parallelism.data_shard != 0 ||
      q.run.parallelism.expert != 1 ||
      q.run.parallelism.sharding != DataSharding::kNone) {
    return InvalidArgument(std::string("config.") +
                           (q.run.checkpoint.policy != CheckpointPolicy::kNone ? "checkpoint"
                                                                                : "parallelism") +
                           ": the planner chooses it; leave it unset");
  }
  if (q.devices.empty() && q.run.device.empty()) {
    return InvalidArgument("devices: name at least one GPU type (or config.device_name)");
  }
  // config.parallelism.tensor_layers says how a plan's tensor parallelism runs (DTensor's
  // layers only over FSDP2 or none): the planner's own choices are checked plan by plan.
  RunConfig run = q.run;
  run.parallelism.tensor_layers = TensorParallelLayers::kMegatron;
  return ValidateRunConfig(run);
}

}  // namespace

Status PlanJob(const PlanQuery& query, Budget* budget,
               const std::function<bool(const Plan&)>& emit, PlanStats* stats) {
  Budget unlimited;
  if (budget == nullptr) budget = &unlimited;
  // A quantized checkpoint's config.json plans as its quantization (hf_quantization.h).
  PlanQuery q = query;
  MEMEST_ASSIGN_OR_RETURN(q.model, ResolveCheckpointQuantization(query.model, &q.run));
  MEMEST_RETURN_IF_ERROR(CheckQuery(q));
  PlanStats own;
  if (stats == nullptr) stats = &own;
  std::vector<DeviceInfo> devices;
  for (const std::string& name : q.devices.empty() ? std::vector<std::string>{q.run.device}
                                                   : q.devices) {
    if (name == "all") {  // every GPU of the catalog that runs CUDA
      for (const DeviceInfo& d : ListDevices()) {
        if (d.cuda) devices.push_back(d);
      }
      continue;
    }
    StatusOr<DeviceInfo> d = FindDevice(name);
    if (!d.ok()) return InvalidArgument("devices: " + d.status().message());
    devices.push_back(*d);
  }
  Planner planner(q, budget, stats);
  std::vector<States> states;  // per device: the one-GPU model states
  for (const DeviceInfo& d : devices) {
    MEMEST_ASSIGN_OR_RETURN(States s, planner.ModelStates(d));
    states.push_back(s);
  }
  const bool half = DTypeSize(ParameterDType(q.run.precision)) == 2;
  const std::vector<DataSharding> strategies = {DataSharding::kDdp, DataSharding::kZero1,
                                                DataSharding::kDeepSpeedZero2,
                                                DataSharding::kDeepSpeedZero3,
                                                DataSharding::kFsdp1, DataSharding::kFsdp2,
                                                DataSharding::kMegatronDistOpt};
  int64_t found = 0;
  for (int64_t n : GpuCounts(q.max_gpus)) {
    std::vector<Plan> fits;
    // The budget or the deadline ran out: what fits so far, then why it stopped.
    auto stopped = [&](Status why) {
      std::stable_sort(fits.begin(), fits.end(), Before);
      for (const Plan& f : fits) {
        ++stats->plans;
        if (!emit(f) || ++found >= q.max_plans) break;
      }
      return why;
    };
    // The splits of n GPUs that fit over `contexts` context-parallel degrees, without offload,
    // or with it.
    auto search = [&](const std::vector<int64_t>& contexts, bool offload) -> Status {
    for (size_t k = 0; k < devices.size(); ++k) {
      const DeviceInfo& d = devices[k];
      if (!offload && states[k].total() / n > d.capacity_bytes) {  // context splits none
        if (contexts.front() == 1) ++stats->skipped_counts;
        continue;
      }
      const int64_t max_tensor = std::min(kMaxPlanTensor, q.run.parallelism.gpus_per_node);
      for (int64_t t = 1; t <= max_tensor && t <= n; t *= 2) {
      if (n % t != 0 || (t > 1 && !planner.tensor_ok(DataSharding::kNone) &&
                         !planner.tensor_ok(DataSharding::kMegatronDdp))) {
        continue;
      }
      for (int64_t cp : contexts) {
      if (n % (t * cp) != 0) continue;
      for (int64_t p : Divisors(n / (t * cp))) {
        if (p > 1 && (planner.blocks() == 0 || planner.blocks() % p != 0)) continue;
        const int64_t data = n / (t * cp * p);
        if (q.run.batch_size % data != 0) continue;
        const std::vector<int64_t> mbs = Divisors(q.run.batch_size / data);
        // Megatron's expert parallelism (without context ranks, which it does not model)
        // over powers of two dividing the data ranks; FSDP's hybrid sharding
        // within a node's data ranks when the data ranks span nodes; with offload, each
        // strategy's offloads (DeepSpeed's on one rank too).
        struct Candidate {
          DataSharding sharding;
          int64_t expert = 1;
          Offload offload;
          int64_t data_shard = 0;
        };
        std::vector<Candidate> sharded;
        const int64_t node_data = q.run.parallelism.gpus_per_node % (t * cp) == 0
                                      ? q.run.parallelism.gpus_per_node / (t * cp) : 0;
        if (offload) {
          for (DataSharding sh : strategies) {
            const bool deepspeed = sh == DataSharding::kDeepSpeedZero2 ||
                                   sh == DataSharding::kDeepSpeedZero3;
            if (data == 1 && !deepspeed) continue;
            for (const Offload& o : OffloadsOf(sh)) sharded.push_back({sh, 1, o});
          }
        } else {
          if (data == 1) sharded.push_back({DataSharding::kNone});
          for (DataSharding sh : data == 1 ? std::vector<DataSharding>{} : strategies) {
            sharded.push_back({sh});
            const bool fsdp = sh == DataSharding::kFsdp1 || sh == DataSharding::kFsdp2;
            if (fsdp && node_data > 1 && node_data < data && data % node_data == 0) {
              sharded.push_back({sh, 1, Offload{}, node_data});
            }
            if (!IsMegatron(sh) || cp > 1 || !planner.experts()) continue;
            for (int64_t e = 2; e <= data && e <= kMaxExpertParallel; e *= 2) {
              if (data % e == 0) sharded.push_back({sh, e});
            }
          }
        }
        for (const Candidate& cand : sharded) {
          const DataSharding sh = cand.sharding;
          if (t > 1 && !planner.tensor_ok(sh)) continue;
          const int64_t e = cand.expert;
          const Offload& o = cand.offload;
          // Megatron folds the context ranks into its gradients' and optimizer's sharding.
          const int64_t shard =
              cand.data_shard > 0 ? cand.data_shard : (IsMegatron(sh) ? data * cp : data);
          const int64_t bound = o.any() ? OffloadLowerBound(states[k], sh, o, data, t, p)
                                        : LowerBound(states[k], sh, shard, t, p, e, half);
          if (bound > d.capacity_bytes) continue;
          std::vector<CheckpointPolicy> policies = {CheckpointPolicy::kEveryBlock};
          if (planner.blocks() == 0) policies = {CheckpointPolicy::kNone};
          else policies.push_back(CheckpointPolicy::kNone);
          size_t limit = mbs.size();  // micro-batches [0, limit) may fit
          for (CheckpointPolicy ck : policies) {
            Split s{&d, data, t, p, sh, ck};
            s.expert = e;
            s.offload = o;
            s.data_shard = cand.data_shard;
            s.context = cp;
            s.states = &states[k];
            // The largest micro-batch that fits (the small ones, a pipeline's costliest
            // estimates, only when the larger do not fit); none at all with every block
            // checkpointed means none without checkpointing either, and without it the
            // largest is no larger than with it.
            size_t fitting = 0;
            StatusOr<std::optional<Plan>> best = LargestThatFits(planner, s, mbs, limit, &fitting);
            if (!best.ok()) return stopped(best.status());
            if (!*best) break;
            fits.push_back(**best);
            limit = fitting;
            // Interleaved 1F1B (two model chunks a stage) shrinks the bubble and holds more
            // micro-batches' activations on the first stage: its micro-batch is at most this
            // one. Megatron interleaves when the micro-batches divide by the stages.
            if (p > 1 && planner.blocks() % (2 * p) == 0 &&
                (*best)->bubble_fraction >= kInterleaveBubble) {
              Split v = s;
              v.virtual_stages = 2;
              std::vector<int64_t> cands;
              for (size_t j = 0; j < fitting; ++j) {
                if ((q.run.batch_size / data / mbs[j]) % p == 0) cands.push_back(mbs[j]);
              }
              size_t unused = 0;
              StatusOr<std::optional<Plan>> inter =
                  LargestThatFits(planner, v, cands, cands.size(), &unused);
              if (!inter.ok()) return stopped(inter.status());
              if (*inter) fits.push_back(**inter);
            }
          }
        }
      }
      }
      }
    }
    return Status::Ok();
    };
    // Context parallelism (ring attention over 2, 4 or 8 ranks), then CPU offload, each only
    // where nothing fits without it.
    MEMEST_RETURN_IF_ERROR(search({1}, false));
    if (fits.empty()) MEMEST_RETURN_IF_ERROR(search({2, 4, 8}, false));
    if (fits.empty() && q.host_bytes_per_gpu > 0) MEMEST_RETURN_IF_ERROR(search({1}, true));
    std::stable_sort(fits.begin(), fits.end(), Before);
    for (const Plan& p : fits) {
      ++stats->plans;
      if (!emit(p) || ++found >= q.max_plans) return Status::Ok();
    }
  }
  return Status::Ok();
}

}  // namespace memest
