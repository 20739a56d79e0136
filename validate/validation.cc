#include "validate/validation.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "engine/estimator.h"
#include "engine/ir/devices.h"
#include "engine/ir/text.h"
#include "engine/step/allocator.h"
#include "validate/op_work.h"

namespace memest::validate {

double Comparison::RelError() const {
  if (measured_bytes == 0) return predicted_bytes == 0 ? 0.0 : 1.0;
  return static_cast<double>(predicted_bytes - measured_bytes) / static_cast<double>(measured_bytes);
}

namespace {

// The device's own view of this process: what it held when the validation started (the
// context and library handles, where measured) plus everything taken since.
class DeviceMeter {
 public:
  Status Start(Device& device, const DeviceProbe& probe) {
    MEMEST_ASSIGN_OR_RETURN(DeviceMemInfo m, device.MemInfo());
    used_at_start_ = m.total_bytes - m.free_bytes;
    fixed_ = FixedBytes(probe);
    return Status::Ok();
  }
  // This process's use now; -1 where the fixed part could not be measured.
  StatusOr<int64_t> Sample(Device& device) {
    MEMEST_ASSIGN_OR_RETURN(DeviceMemInfo m, device.MemInfo());
    const int64_t taken = (m.total_bytes - m.free_bytes) - used_at_start_;
    return fixed_ < 0 ? -1 : fixed_ + std::max<int64_t>(0, taken);
  }
  // Context plus cuBLAS and cuDNN handles; -1 if any is unknown.
  static int64_t FixedBytes(const DeviceProbe& p) {
    if (p.context_bytes < 0 || p.cublas_handle_bytes < 0 || p.cudnn_handle_bytes < 0) return -1;
    return p.context_bytes + p.cublas_handle_bytes + p.cudnn_handle_bytes;
  }

 private:
  int64_t used_at_start_ = 0;
  int64_t fixed_ = -1;
};

struct Measured {
  int64_t allocated = 0, reserved = 0, device = -1;
  CategoryBytes by_category{};
  int64_t reserved_at_peak = 0;
};

// Replays a schedule on the device through PyTorch's caching policy.
class Replayer {
 public:
  Replayer(Device& device, const Graph& graph, const Schedule& schedule,
           const ValidateOptions& options)
      : dev_(device), g_(graph), s_(schedule), opt_(options) {
    const size_t n = static_cast<size_t>(schedule.num_buffers);
    handle_.assign(n, -1);
    category_.assign(n, Category::kTemporaries);
    bytes_.assign(n, 0);
  }
  // Every segment goes back to the device, whatever happened.
  ~Replayer() {
    (void)dev_.Synchronize();
    for (DevicePtr p : segments_) (void)dev_.Free(p);
  }

  Status Run(const DeviceProbe& probe) {
    MEMEST_RETURN_IF_ERROR(meter_.Start(dev_, probe));
    int64_t total_ops = 0;
    for (const StepContext& c : s_.contexts) total_ops += c.op >= 0;
    for (const Event& e : s_.events) {
      switch (e.kind) {
        case EventKind::kContext:
          MEMEST_RETURN_IF_ERROR(RunPendingOp());
          context_ = e.buffer;
          if (s_.contexts[context_].op >= 0) {
            pending_ = context_;
            if (++ops_seen_ % 32 == 0 || ops_seen_ == total_ops) {
              if (opt_.cancelled && opt_.cancelled()) return Cancelled("validation cancelled");
              if (opt_.progress) {
                opt_.progress({Progress::Stage::kReplaying, ops_seen_, total_ops,
                               std::string(PhaseName(s_.contexts[context_].phase))});
              }
            }
          }
          MEMEST_RETURN_IF_ERROR(SampleDevice());
          break;
        case EventKind::kAlloc:
          MEMEST_RETURN_IF_ERROR(Alloc(e.buffer, e.bytes, e.category, e.stream));
          if (e.category == Category::kWorkspace) cublas_workspaces_.push_back(e.buffer);
          break;
        case EventKind::kFree:
          MEMEST_RETURN_IF_ERROR(RunPendingOp());
          Free(e.buffer);
          break;
        case EventKind::kRetag:
          if (handle_[e.buffer] < 0) break;
          live_[static_cast<int>(category_[e.buffer])] -= Rounded(e.buffer);
          category_[e.buffer] = e.category;
          live_[static_cast<int>(e.category)] += Rounded(e.buffer);
          break;
      }
    }
    MEMEST_RETURN_IF_ERROR(RunPendingOp());
    MEMEST_RETURN_IF_ERROR(dev_.Synchronize());
    return SampleDevice();
  }

  const Measured& peak() const { return peak_; }
  const std::vector<std::pair<Phase, Measured>>& phases() const { return phases_; }
  std::vector<OpRun>& ops() { return ops_; }

 private:
  // As the plan's walk: an empty tensor holds no memory; a block comes from its stream's pool.
  Status Alloc(int buffer, int64_t bytes, Category c, int stream) {
    if (bytes == 0) return Status::Ok();
    const int h = policy_.Malloc(bytes, stream);
    if (h < 0) {  // the plan's own walk kept every total within kMaxBytes
      return Internal("the allocator model refused " + std::to_string(bytes) + " bytes at " +
                      Where() + " that the plan's walk accepted");
    }
    handle_[buffer] = h;
    while (static_cast<int>(segments_.size()) < policy_.segments()) {
      const int64_t size = policy_.SegmentBytes(static_cast<int>(segments_.size()));
      StatusOr<DevicePtr> p = dev_.Malloc(size);
      if (!p.ok()) {
        policy_.Free(h);
        handle_[buffer] = -1;
        return Status(p.status().code(), "out of device memory at " + Where() + ": " +
                                             p.status().message());
      }
      segments_.push_back(*p);
    }
    bytes_[buffer] = bytes;
    category_[buffer] = c;
    live_[static_cast<int>(c)] += Rounded(buffer);
    MEMEST_RETURN_IF_ERROR(dev_.Touch(Ptr(buffer), bytes));
    Observe();
    return Status::Ok();
  }

  void Free(int buffer) {
    if (handle_[buffer] < 0) return;
    policy_.Free(handle_[buffer]);
    handle_[buffer] = -1;
    live_[static_cast<int>(category_[buffer])] -= Rounded(buffer);
  }

  // A buffer's bytes as the allocator counts them.
  int64_t Rounded(int buffer) const { return CachingAllocatorModel::RoundSize(bytes_[buffer]); }

  DevicePtr Ptr(int buffer) const {
    const auto loc = policy_.Locate(handle_[buffer]);
    return segments_[loc.segment] + static_cast<DevicePtr>(loc.offset);
  }
  BufferView View(int buffer) const {
    if (buffer < 0 || buffer >= static_cast<int>(handle_.size()) || handle_[buffer] < 0) return {};
    return {Ptr(buffer), bytes_[buffer]};
  }

  std::string Where() const {
    if (context_ < 0) return "the start of the step";
    const StepContext& c = s_.contexts[context_];
    std::string w = std::string(PhaseName(c.phase));
    if (c.op >= 0) {
      w += " op " + std::to_string(c.op) + " (" + g_.ops[c.op].kind +
           (g_.ops[c.op].scope.empty() ? "" : " in " + Quote(g_.ops[c.op].scope)) + ")";
    }
    return w;
  }

  Measured& PhaseEntry() {
    const Phase ph = context_ >= 0 ? s_.contexts[context_].phase : Phase::kData;
    for (auto& [p, m] : phases_) {
      if (p == ph) return m;
    }
    phases_.emplace_back(ph, Measured{});
    return phases_.back().second;
  }

  void Observe() {
    const int64_t a = policy_.allocated(), r = policy_.reserved();
    if (a > peak_.allocated) {
      peak_.allocated = a;
      peak_.by_category = live_;
      peak_.reserved_at_peak = r;
    }
    peak_.reserved = std::max(peak_.reserved, r);
    Measured& ph = PhaseEntry();
    ph.allocated = std::max(ph.allocated, a);
    ph.reserved = std::max(ph.reserved, r);
  }

  Status SampleDevice() {
    MEMEST_ASSIGN_OR_RETURN(int64_t used, meter_.Sample(dev_));
    peak_.device = std::max(peak_.device, used);
    Measured& ph = PhaseEntry();
    ph.device = std::max(ph.device, used);
    if (context_ >= 0) Observe();
    return Status::Ok();
  }

  // Runs the kernels of the op whose context is open, once its allocations are made.
  Status RunPendingOp() {
    if (pending_ < 0) return Status::Ok();
    const int ctx = pending_;
    pending_ = -1;
    const StepContext& c = s_.contexts[ctx];
    const bool backward = c.phase == Phase::kBackward && ctx < static_cast<int>(s_.operands.size()) &&
                          !s_.operands[ctx].input_grads.empty();
    OpRun run;
    run.op = c.op;
    run.kind = g_.ops[c.op].kind;
    run.scope = g_.ops[c.op].scope;
    run.phase = c.phase;
    run.recompute = c.recompute;
    OpWork work;
    if (ctx < static_cast<int>(s_.operands.size())) {
      work = WorkOfOp(g_, c.op, backward, s_.operands[ctx], [this](int b) { return View(b); });
    } else {
      work.reason = "no operands recorded";
    }
    run.memory_only = work.reason;
    for (Work& w : work.work) {
      int ws_buffer = -1;
      if (w.kind == WorkKind::kGemm) {
        // cuBLAS gets the workspace the schedule allocated for it from the caching allocator,
        // as PyTorch hands it over: one per handle, the forward thread's, then autograd's.
        if (!cublas_workspaces_.empty()) {
          const size_t k = c.phase == Phase::kBackward && cublas_workspaces_.size() > 1 ? 1 : 0;
          const BufferView ws = View(cublas_workspaces_[k]);
          w.workspace = ws.ptr;
          w.workspace_bytes = ws.bytes;
        }
      } else {
        MEMEST_ASSIGN_OR_RETURN(const int64_t ws, dev_.WorkspaceBytes(w));
        if (ws > 0) {  // through the allocator, as PyTorch allocates cuDNN's workspace
          ws_buffer = static_cast<int>(handle_.size());
          handle_.push_back(-1);
          category_.push_back(Category::kWorkspace);
          bytes_.push_back(0);
          MEMEST_RETURN_IF_ERROR(Alloc(ws_buffer, ws, Category::kWorkspace, /*stream=*/0));
          w.workspace = Ptr(ws_buffer);
          w.workspace_bytes = ws;
          run.workspace_bytes = std::max(run.workspace_bytes, ws);
          MEMEST_RETURN_IF_ERROR(SampleDevice());
        }
      }
      StatusOr<Timing> t = dev_.Run(w, opt_.repeats);
      if (!t.ok()) return t.status().Prefixed(Where() + ": " + WorkKindName(w.kind) + ": ");
      run.milliseconds += t->median_ms;
      run.work.push_back(w.kind);
      if (ws_buffer >= 0) Free(ws_buffer);
    }
    ops_.push_back(std::move(run));
    return Status::Ok();
  }

  Device& dev_;
  const Graph& g_;
  const Schedule& s_;
  const ValidateOptions& opt_;
  CachingAllocatorModel policy_;
  DeviceMeter meter_;
  std::vector<DevicePtr> segments_;
  std::vector<int> handle_;
  std::vector<Category> category_;
  std::vector<int64_t> bytes_;  // as requested; the allocator counts them rounded
  CategoryBytes live_{};
  std::vector<int> cublas_workspaces_;  // the schedule's cuBLAS workspace buffers, in order
  int context_ = -1, pending_ = -1;
  int64_t ops_seen_ = 0;
  Measured peak_;
  std::vector<std::pair<Phase, Measured>> phases_;
  std::vector<OpRun> ops_;
};

Comparison Compare(std::string name, int64_t predicted, int64_t measured) {
  Comparison c;
  c.name = std::move(name);
  c.predicted_bytes = predicted;
  c.measured_bytes = std::max<int64_t>(0, measured);
  c.measured = measured >= 0;
  return c;
}

struct Plan {
  std::unique_ptr<Graph> graph;
  PlannedStep step;
};

StatusOr<Plan> PlanFor(const ModelSpec& model, const RunConfig& config, int64_t max_ops) {
  Plan p;
  MEMEST_ASSIGN_OR_RETURN(Graph g, BuildStepGraph(model, config, max_ops));
  p.graph = std::make_unique<Graph>(std::move(g));
  MEMEST_ASSIGN_OR_RETURN(p.step, PlanStep(*p.graph, config, /*record_operands=*/true));
  return p;
}

// The largest micro-batch below config's whose predicted reserved peak fits `free`, or 0.
StatusOr<int64_t> LargestFittingMicroBatch(const ModelSpec& model, RunConfig config, int64_t free,
                                           int64_t max_ops) {
  int64_t lo = 0, hi = config.micro_batch() - 1;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    config.batch_size = mid * config.grad_accum_steps;
    MEMEST_ASSIGN_OR_RETURN(Plan p, PlanFor(model, config, max_ops));
    if (p.step.live.peak_reserved <= free) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

}  // namespace

StatusOr<Validation> Validate(const ModelSpec& model, const RunConfig& requested, Device& device,
                              const ValidateOptions& options) {
  auto progress = [&](Progress::Stage stage, std::string message) {
    if (options.progress) options.progress({stage, 0, 0, std::move(message)});
  };
  if (options.repeats < 1) {
    return InvalidArgument("repeats: must be at least 1, got " + std::to_string(options.repeats));
  }
  if (requested.runtime != Runtime::kCuda) {
    return FailedPrecondition("config.runtime: Validate replays a CUDA step; the cpu-1.13 runtime "
                              "has nothing to validate on a GPU");
  }
  if (requested.expandable_segments) {
    return FailedPrecondition("config.expandable_segments: Validate replays PyTorch's default "
                              "segments; expandable segments are estimated but not validated");
  }
  MEMEST_RETURN_IF_ERROR(ValidateRunConfig(requested));
  if (!requested.device.empty()) {
    StatusOr<DeviceInfo> named = FindDevice(requested.device);
    if (named.ok() && !named->cuda) {
      return FailedPrecondition("config.device_name: " + named->name +
                                " runs PyTorch through ROCm, and Validate replays the step with "
                                "CUDA; Estimate takes it");
    }
  }

  progress(Progress::Stage::kProbing, "measuring the device");
  Validation v;
  MEMEST_ASSIGN_OR_RETURN(v.device, device.Probe());
  v.config = requested;
  if (v.config.device.empty() && v.config.device_capacity_bytes == 0) {
    v.config.device_capacity_bytes = v.device.total_bytes;  // the card this runs on
  }

  progress(Progress::Stage::kPlanning, "planning the step");
  MEMEST_ASSIGN_OR_RETURN(DeviceMemInfo mem, device.MemInfo());
  MEMEST_ASSIGN_OR_RETURN(Plan plan, PlanFor(model, v.config, options.max_ops));
  const int64_t need = plan.step.live.peak_reserved;
  if (need > mem.free_bytes) {
    const std::string shortfall =
        "the predicted peak reserved " + FormatBytes(need) + " does not fit the " +
        FormatBytes(mem.free_bytes) + " free on " + v.device.name + " (device " +
        std::to_string(v.device.ordinal) + "): short by " + FormatBytes(need - mem.free_bytes);
    if (!options.scale_batch_to_fit) {
      return FailedPrecondition(shortfall + "; set scale_batch_to_fit (memest validate "
                                            "--scale-batch-to-fit) to validate the largest "
                                            "micro-batch that fits");
    }
    MEMEST_ASSIGN_OR_RETURN(int64_t mb, LargestFittingMicroBatch(model, v.config, mem.free_bytes,
                                                                     options.max_ops));
    if (mb == 0) return FailedPrecondition(shortfall + ", and so does a micro-batch of 1");
    v.scaled_down = true;
    v.scaled_down_note = shortfall + "; validated micro-batch " + std::to_string(mb) +
                         " instead of " + std::to_string(v.config.micro_batch());
    v.config.batch_size = mb * v.config.grad_accum_steps;
    MEMEST_ASSIGN_OR_RETURN(plan, PlanFor(model, v.config, options.max_ops));
  }
  v.estimate = ReportStep(*plan.graph, v.config, plan.step);

  progress(Progress::Stage::kReplaying, "replaying " + std::to_string(plan.step.schedule.events.size()) +
                                            " allocation events");
  Measured peak;
  {
    Replayer replay(device, *plan.step.graph, plan.step.schedule, options);
    MEMEST_RETURN_IF_ERROR(replay.Run(v.device));
    progress(Progress::Stage::kFinishing, "returning device memory");
    peak = replay.peak();
    for (const auto& [phase, m] : replay.phases()) {
      PhaseComparison pc;
      pc.phase = phase;
      int64_t pa = 0, pr = 0;
      for (const PeakPoint& p : v.estimate.phases) {
        if (p.phase == phase) pa = p.allocated_bytes, pr = p.reserved_bytes;
      }
      pc.allocated = Compare("allocated", pa, m.allocated);
      pc.reserved = Compare("reserved", pr, m.reserved);
      pc.measured_device_bytes = m.device;
      v.phases.push_back(pc);
    }
    v.ops = std::move(replay.ops());
  }  // every segment is back on the device here

  CategoryBytes measured = peak.by_category;
  int64_t counted = 0;
  for (int64_t b : measured) counted += b;
  measured[static_cast<int>(Category::kAllocatorOverhead)] = std::max<int64_t>(0, peak.reserved_at_peak - counted);
  const int64_t fixed = DeviceMeter::FixedBytes(v.device);
  for (int c = 0; c < kNumCategories; ++c) {
    const Category cat = static_cast<Category>(c);
    const int64_t m = cat == Category::kCudaContext ? fixed : measured[c];
    v.categories.push_back(Compare(CategoryName(cat), v.estimate.breakdown[c], m));
  }
  v.peak_allocated = Compare("peak allocated", v.estimate.peak.allocated_bytes, peak.allocated);
  v.peak_reserved = Compare("peak reserved", v.estimate.peak_reserved_bytes, peak.reserved);
  v.device_total = Compare("device total (nvidia-smi)",
                           v.estimate.peak_reserved_bytes +
                               v.estimate.breakdown[static_cast<int>(Category::kCudaContext)],
                           peak.device);
  for (const OpRun& r : v.ops) {
    v.step_milliseconds += r.milliseconds;
    (r.memory_only.empty() ? v.ops_run : v.ops_memory_only) += 1;
  }
  v.notes.push_back("allocated and reserved are the predicted schedule replayed through PyTorch's "
                    "caching policy on real memory, plus the workspace cuDNN really asked for");
  if (fixed < 0) {
    v.notes.push_back("the CUDA context and library handles could not be measured on this "
                      "device, so neither could the device total");
  }
  for (const std::string& n : v.device.notes) v.notes.push_back(n);
  if (v.scaled_down) v.notes.push_back(v.scaled_down_note);
  return v;
}

}  // namespace memest::validate
