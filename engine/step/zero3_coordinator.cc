#include "engine/step/zero3_coordinator.h"

#include <algorithm>

#include "engine/passes/checkpoint.h"

namespace memest {

int64_t SaturatedSum(int64_t a, int64_t b) { return AddBytes(&a, b) ? a : kMaxBytes; }

int64_t SaturatedProduct(int64_t a, int64_t b) {
  return b != 0 && a > kMaxBytes / b ? kMaxBytes : a * b;
}

int64_t Zero3Bytes(const DeepSpeedZero3& z, int t, int64_t elements) {
  return SaturatedProduct(elements, z.bytes[t]);
}

int64_t Zero3Gathered(const DeepSpeedZero3& z, int t) {
  return Zero3Bytes(z, t, SaturatedProduct(z.partition[t], z.world));
}

Zero3Coordinator::Zero3Coordinator(const DeepSpeedZero3& z, const Graph& g, const RunConfig& c)
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
      numel = SaturatedSum(numel, z.numel[t]);
      uses_[t].push_back(static_cast<int>(s));
    }
    traversed_before_[s + 1] = SaturatedSum(traversed_before_[s], numel);
  }
  queued_.assign(n, 0);
  // record_parameters: each step's parameters by ds_id, the queue each forward starts from.
  for (int k = 0; k < static_cast<int>(order_.size()); ++k) {
    std::vector<int> params = z.modules[order_[k]].params;
    std::sort(params.begin(), params.end());
    for (int t : params) trace_.push_back({t, k});
  }
  for (size_t t = 0; t < z.persistent.size(); ++t) {
    if (z.persistent[t]) persistent_.push_back(static_cast<int>(t));
  }
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

void Zero3Coordinator::ForwardOpStarts(RankMemory& m, int op) {
  if (op == 0) {
    DropInflight(m);
    ResetStep();
  }
  for (int k : fetch_at_[op]) Fetch(m, k);
}

void Zero3Coordinator::ForwardOpEnds(RankMemory& m, int op) {
  for (int k : release_at_[op]) Release(m, k, /*forward=*/true);
}

void Zero3Coordinator::BackwardReaches(RankMemory& m, int op) {
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
void Zero3Coordinator::BackwardRecomputes(RankMemory& m, int first_op) {
  const int modules = static_cast<int>(z_.modules.size());
  while (pre_ < modules && z_.modules[by_last_[pre_]].last_op >= first_op) {
    Fetch(m, by_last_[pre_++]);
  }
}

// reset_step at the model's forward: the first forward records the trace, later ones
// (another micro-batch, a later step) run on the complete one.
void Zero3Coordinator::ResetStep() {
  ++micro_batch_;
  complete_ = !(c_.step == StepKind::kFirstStep && micro_batch_ == 1);
  step_id_ = 0;
  queue_.assign(trace_.begin(), trace_.end());
  most_recent_.assign(g_.tensors.size(), -1'000'000'000);
}

// _post_step: the persistent parameters gathered, each into a buffer of its N partitions it
// views (_allgather_params_coalesced); a lone one through _allgather_params (a flat buffer,
// then a copy of the parameter's size).
// With offload_param, a coalesced gather first copies every host partition to the GPU (freed
// when the call returns); the lone one's flat buffer takes its partition by copy_.
void Zero3Coordinator::GatherPersistent(RankMemory& m, bool transient) {
  if (z_.world == 1) {
    for (int t : persistent_) AvailableOnOneRank(m, t);
    return;
  }
  const int copies = persistent_.size() > 1 ? CopyToDevice(m, persistent_) : -1;
  for (int t : persistent_) {
    const int64_t full = Zero3Gathered(z_, t);
    if (persistent_.size() == 1) {
      const int flat = transient ? m.Allocate(full, Category::kCommunication) : -1;
      gathered_[t] = m.Allocate(Zero3Bytes(z_, t, z_.numel[t]), Category::kParameters);
      if (flat >= 0) m.Deallocate(flat);
    } else {
      gathered_[t] = m.Allocate(full, Category::kParameters);
    }
    status_[t] = Status3::kAvailable;
  }
  if (copies >= 0) m.Deallocate(copies);
}

// One rank: the parameter views its partition (NoGatherHandle), or with offload_param a GPU
// copy of it.
void Zero3Coordinator::AvailableOnOneRank(RankMemory& m, int t) {
  if (z_.on_host[t]) {
    gathered_[t] = m.Allocate(Zero3Bytes(z_, t, z_.numel[t]), Category::kParameters);
  }
  status_[t] = Status3::kAvailable;
}

// offload_param: `ds_tensor.to(device)` of each host partition among `params`, made at once
// (one buffer id for them all; -1 when none is on the host).
int Zero3Coordinator::CopyToDevice(RankMemory& m, const std::vector<int>& params) {
  int64_t bytes = 0;
  for (int t : params) {
    if (z_.on_host[t]) bytes = SaturatedSum(bytes, Zero3Bytes(z_, t, z_.partition[t]));
  }
  return bytes > 0 ? m.Allocate(bytes, Category::kCommunication) : -1;
}

// __all_gather_params: one call over the parameters not yet available. With one rank
// DeepSpeed points each parameter at its partition (_no_gather_coalesced: nothing is made, or
// with offload_param a GPU copy of it).
void Zero3Coordinator::AllGather(RankMemory& m, const std::vector<int>& params) {
  std::vector<int> todo;
  int64_t flat = 0;
  for (int t : params) {
    if (status_[t] != Status3::kNotAvailable) continue;
    todo.push_back(t);
    n_available_ += z_.numel[t];
    flat = SaturatedSum(flat, Zero3Gathered(z_, t));
  }
  if (todo.empty()) return;
  if (z_.world == 1) {
    for (int t : todo) AvailableOnOneRank(m, t);
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
  const int copies = CopyToDevice(m, todo);  // the partitions sent, from the host
  if (copies >= 0) m.Deallocate(copies);
  const int id = static_cast<int>(handles_.size());
  for (int t : todo) {
    status_[t] = Status3::kInflight;
    handle_of_[t] = id;
  }
  handles_.push_back(std::move(h));
}

// The parameter leaves the inflight registry (its module took it, or it was released).
void Zero3Coordinator::Pop(RankMemory& m, int t) {
  const int id = handle_of_[t];
  if (id < 0) return;
  handle_of_[t] = -1;
  Handle& h = handles_[id];
  if (!h.waited) {  // AllGatherCoalescedHandle.wait: a contiguous copy of each parameter
    h.waited = true;
    for (int p : h.params) {
      if (h.flat >= 0 && status_[p] == Status3::kInflight) {
        gathered_[p] = m.Allocate(Zero3Bytes(z_, p, z_.numel[p]), Category::kParameters);
      }
      if (status_[p] == Status3::kInflight) status_[p] = Status3::kAvailable;
    }
  }
  if (--h.in_registry == 0 && h.flat >= 0) {
    m.Deallocate(h.flat);
    h.flat = -1;
  }
}

void Zero3Coordinator::Fetch(RankMemory& m, int k) {
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
void Zero3Coordinator::Release(RankMemory& m, int k, bool forward) {
  const Zero3Module& mod = z_.modules[k];
  for (int t : mod.params) --active_[t];
  for (size_t j = 0; j < mod.params.size(); ++j) {
    const int t = mod.params[j];
    const bool goes =
        !complete_ || (!z_.persistent[t] && most_recent_[t] <= step_id_ && !ReusedSoon(t));
    if (!goes || status_[t] != Status3::kAvailable || active_[t] > 0) continue;
    Pop(m, t);
    const int saver = forward && mod.saver[j] >= 0 && !recomputed_[mod.saver[j]] ? mod.saver[j]
                                                                                 : -1;
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
void Zero3Coordinator::FreeSavedAbove(RankMemory& m, int op) {
  while (!saved_.empty() && saved_.top().op > op) {
    m.Deallocate(saved_.top().buffer);
    saved_.pop();
  }
}

// What no module took (an invariant of the trace, kept safe): the inflight registry's flat
// buffers go with it (release_and_reset_all, _clean_inflight_param_registry).
void Zero3Coordinator::DropInflight(RankMemory& m) {
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
bool Zero3Coordinator::ReusedSoon(int t) const {
  const std::vector<int>& u = uses_[t];
  auto next = std::lower_bound(u.begin(), u.end(), step_id_);
  return next != u.end() &&
         traversed_before_[*next] - traversed_before_[step_id_] < z_.max_reuse_elements;
}

void Zero3Coordinator::BackwardEnds(RankMemory& m) {
  FreeSavedAbove(m, -1);
  const int modules = static_cast<int>(z_.modules.size());
  while (post_ < modules) Release(m, by_first_[post_++], /*forward=*/false);
}

void Zero3Coordinator::ReleaseAll(RankMemory& m) {
  DropInflight(m);
  for (size_t t = 0; t < gathered_.size(); ++t) {
    if (gathered_[t] >= 0) m.Deallocate(gathered_[t]);
    gathered_[t] = -1;
    status_[t] = Status3::kNotAvailable;
  }
  n_available_ = 0;
}

}  // namespace memest
