// DeepSpeed ZeRO-3's PartitionedParameterCoordinator (partitioned_param_coordinator.py,
// v0.16.0) on one rank's step, for engine/step/deepspeed_zero3.cc's hooks: fetch_sub_module
// with its prefetch along the recorded trace, release_sub_module with __params_to_release's
// reuse distance, the inflight registry that keeps a coalesced all-gather's flat buffer until
// every parameter of it has been taken, the persistent parameters, and the gathered weights
// that autograd keeps past their release.
#ifndef MEMEST_ENGINE_STEP_ZERO3_COORDINATOR_H_
#define MEMEST_ENGINE_STEP_ZERO3_COORDINATOR_H_

#include <cstdint>
#include <deque>
#include <queue>
#include <vector>

#include "engine/ir/config.h"
#include "engine/ir/graph.h"
#include "engine/passes/deepspeed_zero3.h"
#include "engine/step/rank_hooks.h"

namespace memest {

// Bytes, saturated at kMaxBytes (an allocation that large fails the estimate rather than
// wrapping): `elements` of tensor t's dtype; N partitions of tensor t.
int64_t Zero3Bytes(const DeepSpeedZero3& z, int t, int64_t elements);
int64_t Zero3Gathered(const DeepSpeedZero3& z, int t);
int64_t SaturatedSum(int64_t a, int64_t b);
int64_t SaturatedProduct(int64_t a, int64_t b);  // a, b >= 0

class Zero3Coordinator {
 public:
  Zero3Coordinator(const DeepSpeedZero3& z, const Graph& g, const RunConfig& c);

  // The step's points (engine/step/rank_hooks.h) where modules are fetched and released.
  void ForwardOpStarts(RankMemory& m, int op);
  void ForwardOpEnds(RankMemory& m, int op);
  void BackwardStarts() { pre_ = post_ = 0; }
  void BackwardReaches(RankMemory& m, int op);
  void BackwardRecomputes(RankMemory& m, int first_op);
  void BackwardEnds(RankMemory& m);
  // step(): _partition_all_parameters (everything gathered goes).
  void ReleaseAll(RankMemory& m);
  // _post_step (transient) or a steady step's start: the persistent parameters gathered.
  void GatherPersistent(RankMemory& m, bool transient);

 private:
  enum class Status3 { kNotAvailable, kInflight, kAvailable };
  struct Handle {  // one all_gather_coalesced call
    std::vector<int> params;
    int flat = -1;        // N partitions of each parameter; -1 for one parameter (its storage)
    bool waited = false;
    int in_registry = 0;  // parameters not yet taken by their module
  };
  struct Entry {
    int param;
    int step;
  };
  struct SavedWeight {
    int op;      // the matmul whose backward frees it
    int buffer;
    bool operator<(const SavedWeight& o) const { return op < o.op; }  // a max-heap by op
  };

  void ResetStep();
  void AllGather(RankMemory& m, const std::vector<int>& params);
  int CopyToDevice(RankMemory& m, const std::vector<int>& params);
  void AvailableOnOneRank(RankMemory& m, int t);
  void Pop(RankMemory& m, int t);
  void Fetch(RankMemory& m, int k);
  void Release(RankMemory& m, int k, bool forward);
  void FreeSavedAbove(RankMemory& m, int op);
  void DropInflight(RankMemory& m);
  bool ReusedSoon(int t) const;

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
  std::vector<Entry> trace_;      // the recorded parameter order: each step's, by tensor id
  std::vector<int> persistent_;   // the persistent parameters
  std::deque<Entry> queue_;
  std::vector<int> most_recent_;
  std::vector<int64_t> traversed_before_;  // per trace step
  std::vector<std::vector<int>> uses_;     // per tensor: its trace steps
  std::vector<char> queued_;               // per tensor: in the prefetch being assembled
  std::vector<char> recomputed_;           // per op: inside a checkpointed region
  std::priority_queue<SavedWeight> saved_;  // gathered storage autograd keeps
  int64_t n_available_ = 0;
  int step_id_ = 0;
  int micro_batch_ = 0;
  bool complete_ = false;
};

}  // namespace memest

#endif  // MEMEST_ENGINE_STEP_ZERO3_COORDINATOR_H_
