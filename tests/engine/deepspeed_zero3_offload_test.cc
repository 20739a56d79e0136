// DeepSpeed ZeRO-3 with offload (engine/passes/deepspeed_zero3.h says what DeepSpeed 0.16.0
// does): what stays on the GPU, what moves to host memory, and the copies that offload adds.
// The hooks are driven step by step through a RankMemory that logs every allocation, so each
// byte below is the tensor its comment names.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "engine/estimator.h"
#include "engine/passes/data_parallel.h"
#include "engine/passes/deepspeed_zero3.h"
#include "engine/step/rank_hooks.h"
#include "tests/engine/test_graphs.h"

namespace memest {
namespace {

using enginetest::AtEnd;
using enginetest::FourLinears;
using enginetest::PlainTraining;
using enginetest::WalkRank;

// FourLinears (float32): 2,238,656 elements, every tensor divisible by 4 ranks; l0.weight's
// partition (262,144 elements) is the largest.
constexpr int64_t kElements = 2 * (1024 * 1024 + 1024) + 128 * 1024 + 128 + 64 * 128 + 64;
constexpr int64_t kPartitionElements = kElements / 4;  // 559,664
constexpr int64_t kLargestPartition = 1024 * 1024 / 4;
constexpr int64_t kBucket = 3'000'000;  // the whole model in one reduction, at the end

RunConfig Zero3(bool optimizer, bool param, StepKind step = StepKind::kSteadyState) {
  RunConfig c = PlainTraining();
  c.optimizer.kind = OptimizerKind::kAdamW;
  c.step = step;
  c.parallelism.data = 4;
  c.parallelism.sharding = DataSharding::kDeepSpeedZero3;
  c.parallelism.reduce_bucket_elements = kBucket;
  c.parallelism.stage3_param_persistence_threshold = 0;
  c.parallelism.offload_optimizer = optimizer;
  c.parallelism.offload_param = param;
  return c;
}

// A RankMemory that logs allocations and keeps the live total and its peak.
class LoggedMemory : public RankMemory {
 public:
  struct Alloc {
    int64_t bytes;
    Category category;
  };
  using RankMemory::Allocate;
  int Allocate(int64_t bytes, Category category, int /*stream*/) override {
    log.push_back({bytes, category});
    live.push_back(bytes);
    now += bytes;
    peak = std::max(peak, now);
    return static_cast<int>(live.size()) - 1;
  }
  void Deallocate(int buffer) override {
    now -= live[buffer];
    live[buffer] = 0;
  }
  bool HasOwnGrad(int /*t*/) const override { return false; }  // every .grad in the bucket
  void ReleaseGrad(int /*t*/, bool /*into_rank_buffer*/) override {}
  bool LastMicroBatch() const override { return last; }

  std::vector<Alloc> log;
  std::vector<int64_t> live;
  int64_t now = 0, peak = 0;
  bool last = true;
};

// Walks the hooks through one step of `g` (forward, every gradient in reverse, backward's end)
// and returns the memory's rise during the end of backward (the bucket's reduction).
int64_t ReductionRise(const Graph& g, const RunConfig& c, LoggedMemory& m) {
  const RankView view = PlanDataParallel(g, c).value();
  std::unique_ptr<RankHooks> hooks = MakeRankHooks(&view, g, c);
  hooks->StepStarts(m);
  for (int op = 0; op < static_cast<int>(g.ops.size()); ++op) {
    hooks->ForwardOpStarts(m, op);
    hooks->ForwardOpEnds(m, op);
  }
  hooks->BackwardStarts(m);
  for (int t = static_cast<int>(g.tensors.size()) - 1; t >= 0; --t) {
    if (g.tensors[t].role == TensorRole::kParameter) hooks->GradReady(m, t);
  }
  const int64_t before = m.now;
  m.peak = m.now;
  hooks->BackwardEnds(m);
  return m.peak - before;
}

// offload_optimizer: the GPU keeps the partitions and the ipg bucket, nothing of the
// optimizer's; the host holds the fp32 master and gradient, AdamW's state, the gradient
// partitions (float32 here) and the pinned fp32 staging buffer of the largest partition.
TEST(DeepSpeedZero3OffloadTest, OffloadOptimizerLeavesTheGpuThePartitionsAndTheBucket) {
  const Graph g = FourLinears();
  const RunConfig c = Zero3(true, false);
  const Liveness l = WalkRank(g, c);
  EXPECT_EQ(AtEnd(l, Category::kParameters), 4 * kPartitionElements);
  EXPECT_EQ(AtEnd(l, Category::kCommunication), 4 * kBucket);
  for (Category k : {Category::kGradients, Category::kMasterAndCasts,
                     Category::kOptimizerState, Category::kTemporaries}) {
    EXPECT_EQ(AtEnd(l, k), 0) << static_cast<int>(k);
  }
  const DeepSpeedZero3 z = PlanDeepSpeedZero3(g, c).value();
  EXPECT_EQ(z.host_master_bytes, 4 * kPartitionElements);
  EXPECT_EQ(z.host_grad_bytes, 4 * kPartitionElements);
  EXPECT_EQ(z.host_state_bytes, 8 * kPartitionElements);
  EXPECT_EQ(z.host_grad_partition_bytes, 4 * kPartitionElements);
  EXPECT_EQ(z.host_pinned_bytes, 1 << 20);  // 4 x 262,144 bytes: a power of two already
  EXPECT_EQ(z.HostBytes(), 20 * kPartitionElements + (1 << 20));
  // The step on the CPU: the GPU's step phase holds what it held before, nothing more.
  const PeakPoint& step = enginetest::PhasePeak(l, Phase::kOptimizerStep);
  EXPECT_EQ(step.allocated_bytes, 4 * kPartitionElements + 4 * kBucket);
}

// partition_grads sends each reduced partition to the host and takes it back to the GPU; at the
// boundary its norm makes a float64 copy and (16-bit models) its fp32 copy goes to the pinned
// buffer. The largest partition's round trip rises above the reduce-scatter's concatenation.
TEST(DeepSpeedZero3OffloadTest, EachReducedPartitionComesBackToBeNormedAndCast) {
  const int64_t cat = 4 * kElements;  // reduce_scatter_coalesced's torch.cat, float32
  {
    LoggedMemory m;
    EXPECT_EQ(ReductionRise(FourLinears(), Zero3(false, false), m), cat);
  }
  {
    LoggedMemory m;  // float32: the copy (4 bytes) and its float64 norm (8); no cast
    EXPECT_EQ(ReductionRise(FourLinears(), Zero3(true, false), m),
              cat + 12 * kLargestPartition);
  }
  RunConfig bf16 = Zero3(true, false);
  bf16.precision = Precision::kBf16Pure;
  const Graph g16 = FourLinears(DType::kBFloat16);
  {
    LoggedMemory m;  // the copy (2 bytes) beside the float64 norm (8), then the fp32 cast (4)
    EXPECT_EQ(ReductionRise(g16, bf16, m), 2 * kElements + 10 * kLargestPartition);
  }
  {
    LoggedMemory m;  // before the accumulation boundary: the copy only
    m.last = false;
    EXPECT_EQ(ReductionRise(g16, bf16, m), 2 * kElements + 2 * kLargestPartition);
  }
}

// offload_param: no partition stays on the GPU; the trainable ones are one pinned host buffer
// (2,238,656 bytes, rounded up to 2^22). Gathering a module copies its partitions to the GPU
// beside the flat buffer they are gathered into.
TEST(DeepSpeedZero3OffloadTest, OffloadParamCopiesEachPartitionToTheGpuToGatherIt) {
  const Graph g = FourLinears();
  const RunConfig c = Zero3(false, true, StepKind::kFirstStep);
  const DeepSpeedZero3 z = PlanDeepSpeedZero3(g, c).value();
  EXPECT_EQ(z.host_param_bytes, int64_t{1} << 22);
  EXPECT_EQ(z.HostBytes(), int64_t{1} << 22);
  const Liveness l = WalkRank(g, c);
  EXPECT_EQ(AtEnd(l, Category::kParameters), 0);
  EXPECT_EQ(AtEnd(l, Category::kGradients), 4 * kPartitionElements);  // still on the GPU
  LoggedMemory m;
  ReductionRise(g, c, m);
  // The first forward fetches l0 alone (the recorded step prefetches nothing): its weight and
  // bias gathered into one flat buffer of 4 partitions each, then their two partitions copied
  // from the host (freed when the call returns), then each parameter's contiguous copy.
  const int64_t l0 = 1024 * 1024 + 1024;
  std::vector<int64_t> sizes;
  for (const LoggedMemory::Alloc& a : m.log) sizes.push_back(a.bytes);
  const auto at = std::find(sizes.begin(), sizes.end(), 4 * l0);
  ASSERT_NE(at, sizes.end());
  ASSERT_LT(at + 3, sizes.end());
  EXPECT_EQ(at[1], 4 * l0 / 4);  // the partitions sent
  EXPECT_EQ(at[2], 4 * 1024 * 1024);
  EXPECT_EQ(at[3], 4 * 1024);
}

// On one rank ZeRO-3 points each parameter at its partition; with offload_param the partition
// is on the host, so each fetch makes a GPU copy of the whole parameter, freed on release.
TEST(DeepSpeedZero3OffloadTest, OnOneRankOffloadParamCopiesWholeParameters) {
  const Graph g = FourLinears();
  RunConfig c = Zero3(true, true, StepKind::kFirstStep);
  c.parallelism.data = 1;
  LoggedMemory m;
  ReductionRise(g, c, m);
  std::vector<int64_t> params;
  for (const LoggedMemory::Alloc& a : m.log) {
    if (a.category == Category::kParameters) params.push_back(a.bytes);
  }
  EXPECT_EQ(params, (std::vector<int64_t>{4 * 1024 * 1024, 4 * 1024, 4 * 1024 * 1024, 4 * 1024,
                                          4 * 128 * 1024, 4 * 128, 4 * 64 * 128, 4 * 64}));
  RunConfig kept = c;
  kept.parallelism.offload_param = false;
  LoggedMemory none;
  ReductionRise(g, kept, none);
  for (const LoggedMemory::Alloc& a : none.log) EXPECT_NE(a.category, Category::kParameters);
}

// The options make sense only where DeepSpeed has them; each refusal names its field.
TEST(DeepSpeedZero3OffloadTest, OffloadParamBelongsToZero3) {
  RunConfig c = Zero3(true, true);
  c.runtime = Runtime::kCuda;
  EXPECT_TRUE(ValidateRunConfig(c).ok()) << ValidateRunConfig(c).message();
  c.parallelism.sharding = DataSharding::kDeepSpeedZero2;
  c.parallelism.stage3_param_persistence_threshold = 100'000;  // the default
  const std::string m = ValidateRunConfig(c).message();
  EXPECT_NE(m.find("config.parallelism.offload_param"), std::string::npos) << m;
  EXPECT_NE(m.find("deepspeed-zero2"), std::string::npos) << m;
}

// A preset end to end: both offloads take the optimizer and the parameters off the GPU, put
// them in data_parallel.host_bytes, and say so.
TEST(DeepSpeedZero3OffloadTest, EstimateOfAPresetReportsHostMemory) {
  ModelSpec model;
  model.source = PresetSpec{"gpt2-small", {{"layers", 4}, {"seq", 128}}};
  RunConfig c;
  c.batch_size = 2;
  c.precision = Precision::kBf16Pure;
  c.parallelism.data = 8;
  c.parallelism.sharding = DataSharding::kDeepSpeedZero3;
  const Report plain = Estimate(model, c).value();
  c.parallelism.offload_optimizer = true;
  c.parallelism.offload_param = true;
  const Report off = Estimate(model, c).value();
  EXPECT_EQ(plain.data_parallel->host_bytes, 0);
  EXPECT_GT(off.data_parallel->host_bytes, 0);
  EXPECT_LT(off.peak.allocated_bytes, plain.peak.allocated_bytes);
  for (Category k : {Category::kMasterAndCasts, Category::kOptimizerState}) {
    EXPECT_GT(plain.end_of_step[static_cast<int>(k)], 0);
    EXPECT_EQ(off.end_of_step[static_cast<int>(k)], 0);
  }
  bool noted = false;
  for (const std::string& n : off.notes) noted |= n.rfind("host memory ", 0) == 0;
  EXPECT_TRUE(noted);
}

}  // namespace
}  // namespace memest
