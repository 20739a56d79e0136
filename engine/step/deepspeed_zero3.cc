// DeepSpeed ZeRO-3's hooks on one rank's step (engine/step/rank_hooks.h; the buffers are planned
// by engine/passes/deepspeed_zero3.h, which says what stage3.py does). The gathering follows
// PartitionedParameterCoordinator (partitioned_param_coordinator.py, v0.16.0): fetch_sub_module
// with its prefetch along the recorded trace, release_sub_module with __params_to_release's
// reuse distance, and the inflight registry that keeps a coalesced all-gather's flat buffer
// until every parameter of it has been taken.
#include <algorithm>
#include <cstdint>
#include <deque>
#include <memory>
#include <queue>
#include <vector>

#include "engine/ir/shape.h"
#include "engine/passes/checkpoint.h"
#include "engine/step/rank_hooks.h"

namespace memest {
namespace {

enum class Status3 { kNotAvailable, kInflight, kAvailable };

// One all_gather_coalesced call.
struct Handle {
  std::vector<int> params;
  int flat = -1;       // N partitions of each parameter; -1 for one parameter (its storage)
  bool waited = false;
  int in_registry = 0; // parameters not yet taken by their module
};

class DeepSpeedZero3Hooks : public RankHooks {
 public:
  DeepSpeedZero3Hooks(const DeepSpeedZero3& z, const Graph& g, const RunConfig& c)
      : z_(z), g_(g), c_(c) {
    const size_t n = g.tensors.size();
    status_.assign(n, Status3::kNotAvailable);
    gathered_.assign(n, -1);
    handle_of_.assign(n, -1);
    active_.assign(n, 0);
    fetch_at_.assign(g.ops.size(), {});
    release_at_.assign(g.ops.size(), {});
    const int modules = static_cast<int>(z.modules.size());
    for (int k = 0; k < modules; ++k) {
      fetch_at_[z.modules[k].first_op].push_back(k);
      release_at_[z.modules[k].last_op].push_back(k);
      order_.push_back(k);
    }
    // Backward: pre-hooks as backward reaches a module's last op, post-hooks once its first
    // op's backward has run.
    by_last_.resize(modules);
    by_first_.resize(modules);
    for (int k = 0; k < modules; ++k) by_last_[k] = by_first_[k] = k;
    std::stable_sort(by_last_.begin(), by_last_.end(), [&](int a, int b) {
      return z.modules[a].last_op > z.modules[b].last_op;
    });
    std::stable_sort(by_first_.begin(), by_first_.end(), [&](int a, int b) {
      return z.modules[a].first_op > z.modules[b].first_op;
    });
    order_.insert(order_.end(), by_last_.begin(), by_last_.end());
    // For the reuse distance: the elements the trace visits before each step, and the steps
    // at which each parameter is used.
    traversed_before_.assign(order_.size() + 1, 0);
    uses_.assign(n, {});
    for (size_t s = 0; s < order_.size(); ++s) {
      int64_t numel = 0;  // saturated: a parameter shared by modules counts at each
      for (int t : z.modules[order_[s]].params) {
        numel = Sum(numel, z.numel[t]);
        uses_[t].push_back(static_cast<int>(s));
      }
      traversed_before_[s + 1] = Sum(traversed_before_[s], numel);
    }
    queued_.assign(n, 0);
    saver_of_.assign(n, -1);
    // Ops whose saved tensors are recomputed in backward, not kept from forward.
    recomputed_.assign(g.ops.size(), 0);
    CheckpointRegions regions = g.checkpoints;
    if (StatusOr<CheckpointRegions> policy = PlanCheckpoints(g, c.checkpoint); policy.ok()) {
      regions.insert(regions.end(), policy->begin(), policy->end());
    }
    for (const auto& [first, last] : regions) {
      for (int i = first; i <= last && i < static_cast<int>(g.ops.size()); ++i) recomputed_[i] = 1;
    }
  }

  // The rank keeps each parameter's partition (trainable ones in lp_param_buffer).
  int64_t ParameterBytes(int t, int64_t whole) const override {
    if (g_.tensors[t].role != TensorRole::kParameter) return whole;
    return Bytes(t, z_.partition[t]);  // at most the parameter's own bytes and a padding
  }

  // The optimizer steps the fp32 partitions; no parameter has state of its own.
  const Tensor* OptimizerParam(const Graph& /*g*/, int /*t*/) const override { return nullptr; }

  // What initialisation made and keeps: the fp32 masters, the gradient partitions, the ipg
  // bucket; in a steady step also the optimizer state and the persistent parameters the last
  // step gathered.
  void StepStarts(RankMemory& m) override {
    m.Allocate(z_.master_bytes, Category::kMasterAndCasts);
    m.Allocate(z_.grad_partition_bytes, Category::kGradients);
    m.Allocate(z_.ipg_bytes, Category::kCommunication);
    if (c_.step == StepKind::kSteadyState) {
      if (z_.state_bytes > 0) m.Allocate(z_.state_bytes, Category::kOptimizerState);
      GatherPersistent(m, /*transient=*/false);
    }
  }

  void ForwardOpStarts(RankMemory& m, int op) override {
    if (op == 0) {
      DropInflight(m);
      ResetStep();
    }
    for (int k : fetch_at_[op]) Fetch(m, k);
  }

  void ForwardOpEnds(RankMemory& m, int op) override {
    for (int k : release_at_[op]) Release(m, k, /*forward=*/true);
  }

  void BackwardStarts(RankMemory& /*m*/) override { pre_ = post_ = 0; }

  void BackwardReaches(RankMemory& m, int op) override {
    FreeSavedAbove(m, op);
    const int modules = static_cast<int>(z_.modules.size());
    while (post_ < modules && z_.modules[by_first_[post_]].first_op > op) {
      Release(m, by_first_[post_++], /*forward=*/false);
    }
    while (pre_ < modules && z_.modules[by_last_[pre_]].last_op >= op) Fetch(m, by_last_[pre_++]);
  }

  // The recomputed forward gathers the region's modules (their next use, the region's
  // backward, is near: they stay, as the trace's reuse distance keeps them); each is released
  // once backward has passed its first op. (While the first step records, the recomputation
  // releases each module after its forward and backward gathers it again: less at once.)
  void BackwardRecomputes(RankMemory& m, int first_op, int /*last_op*/) override {
    const int modules = static_cast<int>(z_.modules.size());
    while (pre_ < modules && z_.modules[by_last_[pre_]].last_op >= first_op) {
      Fetch(m, by_last_[pre_++]);
    }
  }

  // reduce_independent_p_g_buckets_and_remove_grads: a bucket that would overflow is reduced
  // first; the gradient is copied into the ipg bucket and autograd's tensor goes (one larger
  // than the bucket keeps its own until its reduction).
  void GradReady(RankMemory& m, int t) override {
    const int64_t n = z_.numel[t];
    if (!bucket_.empty() && ipg_used_ + n > z_.ipg_elements) Reduce(m);
    bucket_.push_back(t);
    ipg_used_ += n;
    if (ipg_used_ <= z_.ipg_elements) m.ReleaseGrad(t, false);
  }

  // The last modules' post-backward hooks, then the epilogue's reduction of the last bucket.
  void BackwardEnds(RankMemory& m) override {
    FreeSavedAbove(m, -1);
    const int modules = static_cast<int>(z_.modules.size());
    while (post_ < modules) Release(m, by_first_[post_++], /*forward=*/false);
    Reduce(m);
  }

  void OptimizerStepStarts(RankMemory& m) override {
    // _partition_all_parameters: release_and_reset_all.
    DropInflight(m);
    for (size_t t = 0; t < gathered_.size(); ++t) {
      if (gathered_[t] >= 0) m.Deallocate(gathered_[t]);
      gathered_[t] = -1;
      status_[t] = Status3::kNotAvailable;
    }
    n_available_ = 0;
    const int64_t s = z_.trainable_partition_elements;
    if (z_.element_bytes == 2 && ParameterDType(c_.precision) == DType::kFloat16) {
      Transient(m, s);  // has_overflow: isinf(...) then isnan(...), each a bool per element
    }
    Transient(m, Times(z_.largest_partition, 8));  // the norm: g.double() of each partition
    // _prepare_fp32_grad_for_sub_group: flatten (a model-dtype copy), .to(float32); the update;
    // the fp32 gradient goes (the largest sub-group's are the step's peak).
    // The first step's FusedAdam makes its state inside optimizer.step(), once the flatten
    // has gone (fp32: the flatten is the fp32 gradient).
    const int64_t sg = z_.largest_sub_group;
    int grad = m.Allocate(Times(sg, z_.element_bytes), Category::kTemporaries);
    if (z_.element_bytes != 4) {
      const int fp32 = m.Allocate(Times(sg, 4), Category::kTemporaries);
      m.Deallocate(grad);
      grad = fp32;
    }
    if (c_.step == StepKind::kFirstStep && z_.state_bytes > 0) {
      m.Allocate(z_.state_bytes, Category::kOptimizerState);
    }
    m.Deallocate(grad);
    GatherPersistent(m, /*transient=*/true);  // _post_step
  }

 private:
  // Bytes of `elements` of tensor t's dtype, saturated (an allocation that large fails the
  // estimate as too large rather than wrapping).
  int64_t Bytes(int t, int64_t elements) const {
    return elements > kMaxBytes / z_.bytes[t] ? kMaxBytes : elements * z_.bytes[t];
  }
  // Bytes of N partitions of tensor t (a gather's, a reduce-scatter's share).
  int64_t Gathered(int t) const {
    return z_.partition[t] > kMaxBytes / z_.world ? kMaxBytes
                                                  : Bytes(t, z_.partition[t] * z_.world);
  }
  static int64_t Sum(int64_t a, int64_t b) { return AddBytes(&a, b) ? a : kMaxBytes; }
  static int64_t Times(int64_t elements, int64_t bytes) {
    return elements > kMaxBytes / bytes ? kMaxBytes : elements * bytes;
  }
  void Transient(RankMemory& m, int64_t bytes) {
    if (bytes > 0) m.Deallocate(m.Allocate(bytes, Category::kTemporaries));
  }

  // reset_step at the model's forward: the first forward records the trace, later ones
  // (another micro-batch, a later step) run on the complete one.
  void ResetStep() {
    ++micro_batch_;
    complete_ = !(c_.step == StepKind::kFirstStep && micro_batch_ == 1);
    step_id_ = 0;
    queue_.clear();
    for (int k = 0; k < static_cast<int>(order_.size()); ++k) {
      std::vector<int> params = z_.modules[order_[k]].params;
      std::sort(params.begin(), params.end());  // record_parameters: by ds_id
      for (int t : params) queue_.push_back({t, k});
    }
    most_recent_.assign(g_.tensors.size(), -1'000'000'000);
  }

  // _post_step: the persistent parameters gathered, each into a buffer of its N partitions it
  // views (_allgather_params_coalesced); a lone one through _allgather_params (a flat buffer,
  // then a copy of the parameter's size).
  void GatherPersistent(RankMemory& m, bool transient) {
    std::vector<int> ps;
    for (size_t t = 0; t < z_.persistent.size(); ++t) {
      if (z_.persistent[t]) ps.push_back(static_cast<int>(t));
    }
    if (z_.world == 1) return;  // one rank: parameters view their partitions, nothing is made
    for (int t : ps) {
      const int64_t full = Gathered(t);
      if (ps.size() == 1) {
        const int flat = transient ? m.Allocate(full, Category::kCommunication) : -1;
        gathered_[t] = m.Allocate(Bytes(t, z_.numel[t]), Category::kParameters);
        if (flat >= 0) m.Deallocate(flat);
      } else {
        gathered_[t] = m.Allocate(full, Category::kParameters);
      }
      status_[t] = Status3::kAvailable;
    }
  }

  // __all_gather_params: one call over the parameters not yet available. With one rank
  // DeepSpeed points each parameter at its partition (_no_gather_coalesced): nothing is made.
  void AllGather(RankMemory& m, const std::vector<int>& params) {
    std::vector<int> todo;
    int64_t flat = 0;
    for (int t : params) {
      if (status_[t] != Status3::kNotAvailable) continue;
      todo.push_back(t);
      n_available_ += z_.numel[t];
      flat = Sum(flat, Gathered(t));
    }
    if (todo.empty()) return;
    if (z_.world == 1) {
      for (int t : todo) status_[t] = Status3::kAvailable;
      return;
    }
    Handle h;
    h.params = todo;
    h.in_registry = static_cast<int>(todo.size());
    if (todo.size() == 1) {
      gathered_[todo[0]] = m.Allocate(flat, Category::kParameters);
    } else {
      h.flat = m.Allocate(flat, Category::kCommunication);
    }
    const int id = static_cast<int>(handles_.size());
    for (int t : todo) {
      status_[t] = Status3::kInflight;
      handle_of_[t] = id;
    }
    handles_.push_back(std::move(h));
  }

  // The parameter leaves the inflight registry (its module took it, or it was released).
  void Pop(RankMemory& m, int t) {
    const int id = handle_of_[t];
    if (id < 0) return;
    handle_of_[t] = -1;
    Handle& h = handles_[id];
    if (!h.waited) {  // AllGatherCoalescedHandle.wait: a contiguous copy of each parameter
      h.waited = true;
      for (int p : h.params) {
        if (h.flat >= 0 && status_[p] == Status3::kInflight) {
          gathered_[p] = m.Allocate(Bytes(p, z_.numel[p]), Category::kParameters);
        }
        if (status_[p] == Status3::kInflight) status_[p] = Status3::kAvailable;
      }
    }
    if (--h.in_registry == 0 && h.flat >= 0) {
      m.Deallocate(h.flat);
      h.flat = -1;
    }
  }

  void Fetch(RankMemory& m, int k) {
    const Zero3Module& mod = z_.modules[k];
    AllGather(m, mod.params);
    for (int t : mod.params) {
      ++active_[t];
      Pop(m, t);
    }
    if (complete_) {
      // The module's own entries leave the queue, then the prefetch scans on.
      size_t due = 0;
      for (int t : mod.params) due += most_recent_[t] < step_id_ ? 1 : 0;
      for (size_t d = 0; d < due && !queue_.empty(); ++d) {
        most_recent_[queue_.front().param] = queue_.front().step;
        queue_.pop_front();
      }
      if (z_.prefetch_elements > 0) {
        const int64_t limit =
            std::min(z_.max_live_elements - n_available_, z_.prefetch_elements);
        std::vector<int> prefetch;
        int64_t numel = 0;
        while (!queue_.empty() && numel < limit) {
          const Entry e = queue_.front();
          queue_.pop_front();
          most_recent_[e.param] = std::max(most_recent_[e.param], e.step);
          if (status_[e.param] == Status3::kNotAvailable && !queued_[e.param]) {
            queued_[e.param] = 1;
            prefetch.push_back(e.param);
            numel += z_.numel[e.param];
          }
        }
        for (int t : prefetch) queued_[t] = 0;
        AllGather(m, prefetch);
      }
    }
    ++step_id_;
  }

  // release_sub_module: in a complete trace, __params_to_release keeps persistent parameters,
  // those the prefetcher has scanned a later use of, and those used again within the reuse
  // distance; while recording, every parameter goes. A weight that a linear of the module
  // saved in forward (outside a checkpointed region) keeps its storage until that op's
  // backward: the parameter is released (DeepSpeed gathers it again), its memory is not.
  void Release(RankMemory& m, int k, bool forward) {
    const Zero3Module& mod = z_.modules[k];
    std::vector<int> release;
    for (int t : mod.params) {
      if (!complete_ || (!z_.persistent[t] && most_recent_[t] <= step_id_ && !ReusedSoon(t))) {
        release.push_back(t);
      }
    }
    for (int t : mod.params) --active_[t];
    for (size_t j = 0; j < mod.params.size(); ++j) {
      const int op = mod.saver[j];
      saver_of_[mod.params[j]] = op >= 0 && !recomputed_[op] ? op : -1;
    }
    for (int t : release) {
      if (status_[t] != Status3::kAvailable || active_[t] > 0) continue;
      Pop(m, t);
      const int saver = forward ? saver_of_[t] : -1;
      if (saver >= 0 && gathered_[t] >= 0) {
        saved_.push({saver, gathered_[t]});
      } else if (gathered_[t] >= 0) {
        m.Deallocate(gathered_[t]);
      }
      gathered_[t] = -1;
      status_[t] = Status3::kNotAvailable;
      n_available_ -= z_.numel[t];
    }
  }

  // Autograd's saved weights whose op's backward has run (the walk is at `op`, below them).
  void FreeSavedAbove(RankMemory& m, int op) {
    while (!saved_.empty() && saved_.top().op > op) {
      m.Deallocate(saved_.top().buffer);
      saved_.pop();
    }
  }

  // What no module took (an invariant of the trace, kept safe): the inflight registry's flat
  // buffers go with it (release_and_reset_all, _clean_inflight_param_registry).
  void DropInflight(RankMemory& m) {
    for (Handle& h : handles_) {
      if (h.flat >= 0) m.Deallocate(h.flat);
      h.flat = -1;
      h.in_registry = 0;
    }
    handles_.clear();
    std::fill(handle_of_.begin(), handle_of_.end(), -1);
  }

  // The trace walk of __params_to_release: from the current step on, a module's parameters
  // are kept while fewer than max_reuse_distance elements have been walked before it.
  bool ReusedSoon(int t) const {
    const std::vector<int>& u = uses_[t];
    auto next = std::lower_bound(u.begin(), u.end(), step_id_);
    return next != u.end() &&
           traversed_before_[*next] - traversed_before_[step_id_] < z_.max_reuse_elements;
  }

  // __reduce_and_partition_ipg_grads: reduce_scatter_coalesced cats the bucket's gradients,
  // each padded to N partitions, into one new buffer (a lone gradient that divides by N is
  // used as it is); the partitions are copied (added) into the gradient partitions; the
  // gradients go.
  void Reduce(RankMemory& m) {
    if (bucket_.empty()) return;
    int64_t bytes = 0;
    for (int t : bucket_) bytes = Sum(bytes, Gathered(t));
    const bool in_place = bucket_.size() == 1 && z_.numel[bucket_[0]] % z_.world == 0;
    const int cat = in_place ? -1 : m.Allocate(bytes, Category::kCommunication);
    for (int t : bucket_) {
      if (m.HasOwnGrad(t)) m.ReleaseGrad(t, false);
    }
    if (cat >= 0) m.Deallocate(cat);
    bucket_.clear();
    ipg_used_ = 0;
  }

  struct Entry {
    int param;
    int step;
  };
  struct SavedWeight {
    int op;      // the matmul whose backward frees it
    int buffer;
    bool operator<(const SavedWeight& o) const { return op < o.op; }  // a max-heap by op
  };

  const DeepSpeedZero3& z_;
  const Graph& g_;
  const RunConfig& c_;
  std::vector<std::vector<int>> fetch_at_, release_at_;  // per op: modules
  std::vector<int> order_;              // the trace: module per step id (forward, backward)
  std::vector<int> by_last_, by_first_; // backward's pre- and post-hook order
  int pre_ = 0, post_ = 0;
  std::vector<Status3> status_;
  std::vector<int> gathered_;   // per tensor: the buffer its gathered data lives in
  std::vector<int> handle_of_;  // per tensor: its handle in the inflight registry
  std::vector<int> active_;     // per tensor: modules running that use it
  std::vector<Handle> handles_;
  std::deque<Entry> queue_;
  std::vector<int> most_recent_;
  std::vector<int64_t> traversed_before_;  // per trace step
  std::vector<std::vector<int>> uses_;     // per tensor: its trace steps
  std::vector<char> queued_;               // per tensor: in the prefetch being assembled
  std::vector<char> recomputed_;           // per op: inside a checkpointed region
  std::priority_queue<SavedWeight> saved_;  // gathered storage autograd keeps
  std::vector<int> saver_of_;               // per tensor: the releasing module's saver op
  int64_t n_available_ = 0;
  int step_id_ = 0;
  int micro_batch_ = 0;
  bool complete_ = false;
  std::vector<int> bucket_;
  int64_t ipg_used_ = 0;
};

}  // namespace

std::unique_ptr<RankHooks> MakeDeepSpeedZero3Hooks(const RankView& view, const Graph& graph,
                                                   const RunConfig& config) {
  return std::make_unique<DeepSpeedZero3Hooks>(*view.zero3, graph, config);
}

}  // namespace memest
