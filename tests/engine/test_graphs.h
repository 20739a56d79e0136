// Small graphs and helpers shared by the engine tests.
#ifndef MEMEST_TESTS_ENGINE_TEST_GRAPHS_H_
#define MEMEST_TESTS_ENGINE_TEST_GRAPHS_H_

#include <string>
#include <vector>

#include "engine/ir/config.h"
#include "engine/ir/graph.h"
#include "engine/models/model.h"
#include "engine/passes/data_parallel.h"
#include "engine/step/liveness.h"
#include "engine/step/schedule.h"

namespace memest {
namespace enginetest {

// The tensor of `g` named `name`, or nullptr.
inline const Tensor* Named(const Graph& g, const std::string& name) {
  for (const Tensor& t : g.tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

// The kinds of the ops of `g` in `scope`, in order.
inline std::vector<std::string> KindsIn(const Graph& g, const std::string& scope) {
  std::vector<std::string> kinds;
  for (const Op& op : g.ops) {
    if (op.scope == scope) kinds.push_back(op.kind);
  }
  return kinds;
}

// The context front ends build a micro-batch in.
inline BuildContext MakeContext(int64_t micro_batch = 8, Mode mode = Mode::kTraining,
                                DType dtype = DType::kFloat32) {
  BuildContext c;
  c.micro_batch = micro_batch;
  c.mode = mode;
  c.param_dtype = dtype;
  return c;
}

// An fp32 SGD step (no optimizer state, no scratch) with no cuBLAS workspace, whose loop holds
// only the loss (hold_outputs = false): the arithmetic of a test then involves only the graph's
// own tensors.
inline RunConfig PlainTraining() {
  RunConfig c;
  c.optimizer.kind = OptimizerKind::kSgd;
  c.optimizer.impl = OptimizerImpl::kForLoop;
  c.hold_outputs = false;
  return c;
}

inline Liveness Walk(const Graph& g, const RunConfig& c, const CheckpointRegions& regions = {}) {
  const Schedule s = BuildSchedule(g, c, regions, ScheduleOptions{}).value();
  return WalkSchedule(s, g, c.expandable_segments).value();
}

inline int64_t SavedBytes(const Graph& g, const RunConfig& c, const std::string& scope,
                          const CheckpointRegions& regions = {}) {
  const Schedule s = BuildSchedule(g, c, regions, ScheduleOptions{}).value();
  int64_t n = 0;
  for (const LayerRow& r : s.layers) {
    if (ScopeWithin(r.scope, scope)) n += r.saved_bytes;
  }
  return n;
}

inline const PeakPoint& PhasePeak(const Liveness& l, Phase p) {
  for (const PeakPoint& pp : l.phases) {
    if (pp.phase == p) return pp;
  }
  static PeakPoint none;
  return none;
}

inline int64_t Cat(const PeakPoint& p, Category c) { return p.by_category[static_cast<int>(c)]; }

// The schedule of one data-parallel rank (config.parallelism's view of `g`).
inline Schedule RankSchedule(const Graph& g, const RunConfig& c) {
  const RankView view = PlanDataParallel(g, c).value();
  ScheduleOptions o;
  o.rank = &view;
  return BuildSchedule(g, c, {}, o).value();
}

// The step of one data-parallel rank, exact accounting.
inline Liveness WalkRank(const Graph& g, const RunConfig& c) {
  return WalkSchedule(RankSchedule(g, c), g, false, Accounting::kExact).value();
}

inline int64_t AtEnd(const Liveness& l, Category c) { return l.at_end[static_cast<int>(c)]; }

// Linear(1024, 1024) x 2, Linear(1024, 128), Linear(128, 64), float32: the model measured on
// PyTorch 1.13 with gloo for DDP's buckets (/work/briefs/parallel-facts.md, section 1).
inline Graph FourLinears(DType dtype = DType::kFloat32) {
  GraphBuilder b;
  int h = b.Input("x", {2, 1024}, dtype);
  const int64_t dims[][2] = {{1024, 1024}, {1024, 1024}, {128, 1024}, {64, 128}};
  for (int k = 0; k < 4; ++k) {
    const std::string s = "l" + std::to_string(k);
    h = b.Add1("linear", {h, b.Parameter(s + ".weight", {dims[k][0], dims[k][1]}, dtype),
                          b.Parameter(s + ".bias", {dims[k][0]}, dtype)});
  }
  b.BeginLoss();
  b.SetLoss(b.Add1("sum", {h}));
  return b.Finish().value();
}

constexpr int kFsdpStackBlocks = 3;

// The FSDP tests' model (fsdp1_test.cc, fsdp2_test.cc): x -> in (Linear 64->64, the root's) -> 3 blocks of Linear(64->63) + ReLU + Linear(63->64)
// -> out (Linear 64->8, the root's) -> sum. Dim 0 of 63 does not split over 4 ranks.
inline Graph FsdpStack(DType dtype = DType::kFloat32) {
  GraphBuilder b;
  int h = b.Input("x", {4, 64}, dtype);
  {
    ScopeGuard s(b, "in");
    h = b.Add1("linear", {h, b.Parameter("weight", {64, 64}, dtype)});
  }
  for (int k = 0; k < kFsdpStackBlocks; ++k) {
    ScopeGuard s(b, "blocks." + std::to_string(k));
    b.MarkBlock();
    {
      ScopeGuard f(b, "fc1");
      h = b.Add1("linear", {h, b.Parameter("weight", {63, 64}, dtype),
                            b.Parameter("bias", {63}, dtype)});
    }
    h = b.Add1("relu", {h});
    ScopeGuard f(b, "fc2");
    h = b.Add1("linear", {h, b.Parameter("weight", {64, 63}, dtype)});
  }
  {
    ScopeGuard s(b, "out");
    h = b.Add1("linear", {h, b.Parameter("weight", {8, 64}, dtype)});
  }
  b.BeginLoss();
  b.SetLoss(b.Add1("sum", {h}));
  return b.Finish().value();
}

}  // namespace enginetest
}  // namespace memest

#endif  // MEMEST_TESTS_ENGINE_TEST_GRAPHS_H_
