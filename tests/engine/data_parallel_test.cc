// One data-parallel rank's view (engine/passes/data_parallel.h): DDP's gradient buckets, their
// assignment and gradient_as_bucket_view, and ZeroRedundancyOptimizer's partition, through the
// step simulator.
#include "engine/passes/data_parallel.h"

#include <gtest/gtest.h>

#include "engine/estimator.h"
#include "tests/engine/test_graphs.h"

namespace memest {
namespace {

using enginetest::Cat;
using enginetest::FourLinears;
using enginetest::PhasePeak;
using enginetest::PlainTraining;

constexpr int64_t kParamBytes = (1024 * 1024 * 2 + 128 * 1024 + 64 * 128) * 4 + (1024 * 2 + 128 + 64) * 4;

RunConfig Ddp(int64_t ranks) {
  RunConfig c = PlainTraining();
  c.runtime = Runtime::kCpuTorch113;  // exact bytes: no allocator rounding
  c.parallelism.data = ranks;
  c.parallelism.sharding = DataSharding::kDdp;
  return c;
}

std::vector<int64_t> BucketBytes(const RankView& v) {
  std::vector<int64_t> out;
  for (const DdpBucket& b : v.buckets) out.push_back(b.bytes);
  return out;
}

// Measured on 1.13 (bucket_cap_mb=5): after the rebuild, [b3, W3, b2, W2, b1, W1] close the
// 1 MiB first bucket once W1's 4 MiB is in (4,756,224 B), and [b0, W0] make the second
// (4,198,400 B); the first iteration runs with one bucket of everything (8,954,624 B).
TEST(DataParallelTest, DdpBucketsFollowTheReadyOrderAndTheFirstBucketCap) {
  const Graph g = FourLinears();
  RunConfig c = Ddp(2);
  c.parallelism.bucket_cap_bytes = 5 << 20;
  const RankView steady = PlanDataParallel(g, c).value();
  EXPECT_EQ(BucketBytes(steady), (std::vector<int64_t>{4756224, 4198400}));
  EXPECT_EQ(steady.BucketBytes(), kParamBytes);
  c.step = StepKind::kFirstStep;
  EXPECT_EQ(BucketBytes(PlanDataParallel(g, c).value()), (std::vector<int64_t>{8954624}));
  // PyTorch 2.4+ on CUDA: a cap the caller gives sizes the first bucket too, so 5 MiB takes
  // everything in one; 1 MiB gives 1.13's layout.
  c.step = StepKind::kSteadyState;
  c.runtime = Runtime::kCuda;
  EXPECT_EQ(BucketBytes(PlanDataParallel(g, c).value()), (std::vector<int64_t>{8954624}));
  c.parallelism.bucket_cap_bytes = 1 << 20;
  EXPECT_EQ(BucketBytes(PlanDataParallel(g, c).value()),
            (std::vector<int64_t>{4756224, 4198400}));
  // Not given: 25 MiB with a first bucket of 1 MiB.
  c.parallelism.bucket_cap_bytes = 0;
  EXPECT_EQ(BucketBytes(PlanDataParallel(g, c).value()),
            (std::vector<int64_t>{4756224, 4198400}));
}

// The buckets are one more copy of the gradients, there from the start of the step; .grad
// tensors are made by backward as on one GPU. With gradient_as_bucket_view, each .grad is
// copied into its bucket and autograd's tensor goes: the step ends with the buckets alone.
TEST(DataParallelTest, BucketsAddACopyOfTheGradientsUnlessGradientsAreTheirViews) {
  const Graph g = FourLinears();
  auto walk = [&](const RunConfig& cfg, const RankView& v) {
    ScheduleOptions o;
    o.rank = &v;
    return WalkSchedule(BuildSchedule(g, cfg, {}, o).value(), g, false, Accounting::kExact).value();
  };
  RunConfig one = PlainTraining();
  one.runtime = Runtime::kCpuTorch113;
  one.zero_grad_set_to_none = false;
  const Liveness single = walk(one, RankView{});

  RunConfig c = Ddp(4);
  c.zero_grad_set_to_none = false;
  const RankView view = PlanDataParallel(g, c).value();
  const Liveness ddp = walk(c, view);
  EXPECT_EQ(Cat(PhasePeak(ddp, Phase::kData), Category::kCommunication), kParamBytes);
  EXPECT_EQ(Cat(PhasePeak(ddp, Phase::kData), Category::kGradients), kParamBytes);
  EXPECT_EQ(ddp.peak.allocated_bytes, single.peak.allocated_bytes + kParamBytes);

  c.parallelism.gradient_as_bucket_view = true;
  const RankView as_view = PlanDataParallel(g, c).value();
  const Liveness views = walk(c, as_view);
  EXPECT_EQ(Cat(PhasePeak(views, Phase::kData), Category::kGradients), 0);
  EXPECT_EQ(views.at_end[static_cast<int>(Category::kGradients)], 0);
  EXPECT_EQ(views.at_end[static_cast<int>(Category::kCommunication)], kParamBytes);
  EXPECT_LT(views.peak.allocated_bytes, ddp.peak.allocated_bytes);
}

// ZeroRedundancyOptimizer: largest first, to the least loaded rank (the lowest on a tie).
TEST(DataParallelTest, ZeroOnePartitionsWholeParametersLargestFirst) {
  const Graph g = FourLinears();
  std::vector<int> params;
  for (size_t t = 0; t < g.tensors.size(); ++t) {
    if (g.tensors[t].role == TensorRole::kParameter) params.push_back(static_cast<int>(t));
  }
  // Order: l0.weight, l0.bias, l1.weight, l1.bias, l2.weight, l2.bias, l3.weight, l3.bias.
  // By size: l0.w, l1.w (1 Mi each) -> ranks 0, 1; l2.w (128 Ki) -> 2; l3.w (8 Ki) -> 2;
  // l0.b, l1.b (1 Ki) -> 2, 2; l2.b (128) -> 2; l3.b (64) -> 2.
  EXPECT_EQ(PartitionLargestFirst(g, params, 3),
            (std::vector<int64_t>{0, 2, 1, 2, 2, 2, 2, 2}));
  // More ranks than parameters: each takes one, the rest own nothing.
  EXPECT_EQ(PartitionLargestFirst(g, params, 100),
            (std::vector<int64_t>{0, 4, 1, 5, 2, 6, 3, 7}));
}

// Under ZeRO-1 the estimate is the rank with the most optimizer elements: its Adam state, and
// no one else's.
TEST(DataParallelTest, ZeroOneKeepsTheOptimizerStateOfTheOwnedParameters) {
  const Graph g = FourLinears();
  RunConfig c = Ddp(2);
  c.parallelism.sharding = DataSharding::kZero1;
  c.optimizer.kind = OptimizerKind::kAdam;
  const RankView view = PlanDataParallel(g, c).value();
  // l0.weight -> 0, l1.weight -> 1, l2.weight -> 0 (a tie at 1 Mi: the lower rank), then
  // l3.weight and every bias -> 1: rank 0 steps 1,179,648 elements, rank 1 1,059,008.
  EXPECT_EQ(view.owned_elements, (std::vector<int64_t>{1179648, 1059008}));
  EXPECT_EQ(view.rank, 0);
  ScheduleOptions o;
  o.rank = &view;
  const Liveness l =
      WalkSchedule(BuildSchedule(g, c, {}, o).value(), g, false, Accounting::kExact).value();
  // exp_avg and exp_avg_sq of l0.weight and l2.weight, and 1.13's float32 step tensor each.
  EXPECT_EQ(l.at_end[static_cast<int>(Category::kOptimizerState)], 2 * 4 * 1179648 + 2 * 4);
}

TEST(DataParallelTest, SettingsThatMakeNoSenseAreRefused) {
  RunConfig c = PlainTraining();
  c.parallelism.data = 8;
  EXPECT_NE(ValidateRunConfig(c).message().find("config.parallelism.data"), std::string::npos);
  c.parallelism.sharding = DataSharding::kDdp;
  EXPECT_TRUE(ValidateRunConfig(c).ok());
  c.parallelism.data = 0;
  EXPECT_NE(ValidateRunConfig(c).message().find("config.parallelism.data: must be in"),
            std::string::npos);
  c.parallelism.data = 2;
  c.mode = Mode::kInference;
  c.optimizer = OptimizerConfig{};
  c.zero_grad_set_to_none = true;
  EXPECT_NE(ValidateRunConfig(c).message().find("config.parallelism"), std::string::npos);
  RunConfig none = PlainTraining();
  none.parallelism.gradient_as_bucket_view = true;
  EXPECT_NE(ValidateRunConfig(none).message().find("gradient_as_bucket_view"),
            std::string::npos);
}

// A DDP estimate's report names the rank and the buckets, and its advice measures
// gradient_as_bucket_view.
TEST(DataParallelTest, EstimateReportsTheRankAndAdvisesBucketViews) {
  ModelSpec model;
  model.source = PresetSpec{"gpt2-small", {{"layers", 2}, {"seq", 128}}};
  RunConfig c;
  c.batch_size = 2;
  c.parallelism.data = 4;
  c.parallelism.sharding = DataSharding::kDdp;
  const Report r = Estimate(model, c).value();
  ASSERT_TRUE(r.data_parallel.has_value());
  EXPECT_EQ(r.data_parallel->world, 4);
  EXPECT_EQ(r.data_parallel->rank, 0);
  int64_t buckets = 0;
  for (int64_t b : r.data_parallel->bucket_bytes) buckets += b;
  EXPECT_EQ(buckets, r.trainable_parameter_count * 4);  // float32 parameters
  // The saving is what the same step with gradient_as_bucket_view measures.
  RunConfig views = c;
  views.parallelism.gradient_as_bucket_view = true;
  const Report alt = Estimate(model, views, EstimateOptions{EstimateOptions{}.max_ops, false}).value();
  bool advised = false;
  for (const Advice& a : r.advice) {
    if (a.kind != "ddp_buckets") continue;
    advised = true;
    EXPECT_EQ(a.saving_bytes, r.peak.allocated_bytes - alt.peak.allocated_bytes);
    EXPECT_GT(a.saving_bytes, 0);
  }
  EXPECT_TRUE(advised);
  c.parallelism = ParallelismConfig{};
  EXPECT_FALSE(Estimate(model, c).value().data_parallel.has_value());
}

}  // namespace
}  // namespace memest
