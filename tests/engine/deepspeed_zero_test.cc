// DeepSpeed ZeRO stages 1 and 2, with and without optimizer offload (engine/passes/
// deepspeed_zero.h): the plan's bytes, and where the step simulator puts them. The closed forms
// are stage_1_and_2.py's (v0.16.0) for FourLinears in bf16 over 4 ranks: 2,238,656 parameters
// (no padding: a multiple of 2 x 4), P = 559,664 elements a rank. Rank 1 [559664, 1119328)
// meets l0.weight (488,912 of its elements), l0.bias and l1.weight (69,728, from 1,049,600):
// grads_in_partition holds those three whole, 2,098,176 elements, the most of any rank.
#include <gtest/gtest.h>

#include "engine/estimator.h"
#include "engine/passes/data_parallel.h"
#include "tests/engine/test_graphs.h"

namespace memest {
namespace {

using enginetest::Cat;
using enginetest::FourLinears;
using enginetest::PhasePeak;
using enginetest::PlainTraining;
using enginetest::WalkRank;

constexpr int64_t kParams = 2238656;  // elements
constexpr int64_t kP = 559664;        // a rank's partition
constexpr int64_t kG = 2098176;       // rank 1's grads_in_partition, elements
constexpr int64_t kBucket = int64_t{1} << 20;
constexpr int64_t kLargest = 1024 * 1024;   // l0.weight, l1.weight
constexpr int64_t kLargestSlice = 488912;   // l0.weight's part of rank 1's partition

RunConfig Zero(DataSharding stage, int64_t ranks = 4) {
  RunConfig c = PlainTraining();
  c.precision = Precision::kBf16Pure;
  c.optimizer.kind = OptimizerKind::kAdamW;
  c.parallelism.data = ranks;
  c.parallelism.sharding = stage;
  c.parallelism.reduce_bucket_elements = kBucket;
  return c;
}

// The peak of `phase` in micro-batch `mb`.
PeakPoint PeakOf(const Liveness& l, Phase phase, int mb) {
  for (const PeakPoint& p : l.phases) {
    if (p.phase == phase && p.micro_batch == mb) return p;
  }
  return PeakPoint{};
}

TEST(DeepSpeedZeroTest, Zero2PartitionsTheFlatStates) {
  const Graph g = FourLinears(DType::kBFloat16);
  const RankView v = PlanDataParallel(g, Zero(DataSharding::kDeepSpeedZero2)).value();
  ASSERT_TRUE(v.deepspeed.has_value());
  const DeepSpeedZero& z = *v.deepspeed;
  EXPECT_TRUE(z.partition_gradients);
  EXPECT_EQ(z.partition_elements, kP);
  EXPECT_EQ(z.master_bytes, 4 * kP);
  EXPECT_EQ(z.state_bytes, 8 * kP);
  EXPECT_EQ(z.ipg_bytes, 2 * kBucket);
  EXPECT_EQ(z.step_fp32_bytes, 4 * kP);
  EXPECT_EQ(z.grads_in_partition_bytes, 2 * kG);
  EXPECT_EQ(z.padding_bytes, 0);  // not the last rank
  EXPECT_EQ(z.step_scratch_bytes, 8 * kLargestSlice);  // the norm's float64 copy
  EXPECT_EQ(v.rank, 1);
  EXPECT_EQ(z.HostBytes(), 0);
  EXPECT_TRUE(v.buckets.empty());
  // Over 3 ranks the flat buffer pads 2,238,656 to 2,238,660 (a multiple of 6); a float32
  // model's master partition is a clone all the same, and its gradients need no float32 copy.
  RunConfig fp32 = Zero(DataSharding::kDeepSpeedZero2, 3);
  fp32.precision = Precision::kFp32;
  const DeepSpeedZero f = *PlanDataParallel(FourLinears(), fp32).value().deepspeed;
  EXPECT_EQ(f.partition_elements, 746220);
  EXPECT_EQ(f.master_bytes, 4 * 746220);
  EXPECT_EQ(f.step_fp32_bytes, 0);
}

// The step: the 16-bit parameters, the fp32 master and AdamW state of the partition, and
// grads_in_partition (averaged_gradients views it), then the largest of the float64 copy the
// norm takes of a slice (8 x 488,912) and flatten + .to(float32) (6 P): the norm's here.
TEST(DeepSpeedZeroTest, Zero2StepHoldsGradsInPartitionAndTheNormsCopy) {
  const Graph g = FourLinears(DType::kBFloat16);
  RunConfig c = Zero(DataSharding::kDeepSpeedZero2);
  const Liveness l = WalkRank(g, c);
  const int64_t states = 2 * kParams + 4 * kP + 8 * kP + 2 * kG;
  EXPECT_EQ(PhasePeak(l, Phase::kOptimizerStep).allocated_bytes, states + 8 * kLargestSlice);
  EXPECT_GT(8 * kLargestSlice, 6 * kP);
  EXPECT_EQ(Cat(PhasePeak(l, Phase::kBackward), Category::kCommunication), 2 * kBucket);
  EXPECT_EQ(l.at_end[static_cast<int>(Category::kGradients)], 0);
  EXPECT_EQ(l.at_end[static_cast<int>(Category::kOptimizerState)], 8 * kP);
  // overlap_comm: a second ipg buffer.
  c.parallelism.overlap_comm = true;
  EXPECT_EQ(Cat(PhasePeak(WalkRank(g, c), Phase::kBackward), Category::kCommunication),
            4 * kBucket);
}

// ZeRO-1: the same partition, but the gradients stay whole through backward; after it,
// reduce_gradients walks them in model order: l0.weight fills the bucket, l0.bias overflows
// it, its reduction makes grads_in_partition while every other gradient is still whole.
TEST(DeepSpeedZeroTest, Zero1ReducesWholeGradientsAfterBackward) {
  const Graph g = FourLinears(DType::kBFloat16);
  const RankView v = PlanDataParallel(g, Zero(DataSharding::kDeepSpeedZero1)).value();
  ASSERT_TRUE(v.deepspeed.has_value());
  EXPECT_FALSE(v.deepspeed->partition_gradients);
  EXPECT_EQ(v.deepspeed->grads_in_partition_bytes, 2 * kG);
  EXPECT_EQ(v.rank, 1);
  const PeakPoint one = PhasePeak(WalkRank(g, Zero(DataSharding::kDeepSpeedZero1)),
                                  Phase::kBackward);
  EXPECT_EQ(Cat(one, Category::kGradients), 2 * (kParams - kLargest) + 2 * kG);
  EXPECT_EQ(Cat(one, Category::kCommunication), 2 * kBucket);
  // ZeRO-2 never holds more than grads_in_partition and the gradients of the linear whose
  // backward just ran (l0's weight and bias).
  const PeakPoint two = PhasePeak(WalkRank(g, Zero(DataSharding::kDeepSpeedZero2)),
                                  Phase::kBackward);
  EXPECT_EQ(Cat(two, Category::kGradients), 2 * kG + 2 * (kLargest + 1024));
  EXPECT_LT(Cat(two, Category::kGradients), Cat(one, Category::kGradients));
  // The step is stage 2's.
  EXPECT_EQ(PhasePeak(WalkRank(g, Zero(DataSharding::kDeepSpeedZero1)), Phase::kOptimizerStep)
                .allocated_bytes,
            PhasePeak(WalkRank(g, Zero(DataSharding::kDeepSpeedZero2)), Phase::kOptimizerStep)
                .allocated_bytes);
}

// With gradient accumulation ZeRO-1 reduces nothing before the boundary: the second
// micro-batch's forward holds the whole 16-bit gradients and the ipg buffer the first
// backward made; ZeRO-2's holds averaged_gradients (grads_in_partition) and no ipg buffer.
TEST(DeepSpeedZeroTest, Zero1KeepsGradientsAndTheIpgBufferToTheBoundary) {
  const Graph g = FourLinears(DType::kBFloat16);
  RunConfig c = Zero(DataSharding::kDeepSpeedZero1);
  c.grad_accum_steps = 2;
  c.batch_size = 4;
  const PeakPoint one = PeakOf(WalkRank(g, c), Phase::kForward, 1);
  EXPECT_EQ(Cat(one, Category::kGradients), 2 * kParams);
  EXPECT_EQ(Cat(one, Category::kCommunication), 2 * kBucket);
  c.parallelism.sharding = DataSharding::kDeepSpeedZero2;
  const PeakPoint two = PeakOf(WalkRank(g, c), Phase::kForward, 1);
  EXPECT_EQ(Cat(two, Category::kGradients), 2 * kG);
  EXPECT_EQ(Cat(two, Category::kCommunication), 0);
}

// Offload: the master partition, its fp32 gradient, AdamW's state and the host staging buffer
// (the largest parameter, bf16) are host memory; with accumulation, a bf16 host copy of every
// gradient overlapping the partition. The GPU keeps its staging buffer, and takes the fp32
// partition back at the step.
TEST(DeepSpeedZeroTest, OffloadMovesTheOptimizerToTheHost) {
  const Graph g = FourLinears(DType::kBFloat16);
  for (DataSharding stage : {DataSharding::kDeepSpeedZero1, DataSharding::kDeepSpeedZero2}) {
    RunConfig c = Zero(stage);
    c.parallelism.offload_optimizer = true;
    const DeepSpeedZero z = *PlanDataParallel(g, c).value().deepspeed;
    EXPECT_EQ(z.master_bytes, 0);
    EXPECT_EQ(z.state_bytes, 0);
    EXPECT_EQ(z.host_master_bytes, 4 * kP);
    EXPECT_EQ(z.host_grad_bytes, 4 * kP);
    EXPECT_EQ(z.host_state_bytes, 8 * kP);
    EXPECT_EQ(z.host_staging_bytes, 2 * kLargest);
    EXPECT_EQ(z.HostBytes(), 16 * kP + 2 * kLargest);
    EXPECT_EQ(z.offload_buffer_bytes, 2 * kLargest);
    const Liveness l = WalkRank(g, c);
    EXPECT_EQ(PhasePeak(l, Phase::kOptimizerStep).allocated_bytes,
              2 * kParams + 2 * kLargest + 4 * kP);
    EXPECT_EQ(l.at_end[static_cast<int>(Category::kOptimizerState)], 0);
    EXPECT_EQ(l.at_end[static_cast<int>(Category::kMasterAndCasts)], 0);
    EXPECT_EQ(l.at_end[static_cast<int>(Category::kGradients)], 0);
    // At the boundary, a gradient overlapping the partition is checked for inf/NaN whole
    // (x.float(), two masks, their or, its float copy: 11 bytes an element of l1.weight),
    // beside the few KiB of backward's own gradients in flight.
    const PeakPoint back = PhasePeak(l, Phase::kBackward);
    EXPECT_GE(Cat(back, Category::kTemporaries), 11 * kLargest);
    EXPECT_LT(Cat(back, Category::kTemporaries), 11 * kLargest + 8192);
    EXPECT_EQ(Cat(back, Category::kCommunication), 2 * kBucket + 2 * kLargest);
    c.grad_accum_steps = 2;
    c.batch_size = 4;
    EXPECT_EQ(PlanDataParallel(g, c).value().deepspeed->host_accum_bytes, 2 * kG);
  }
}

TEST(DeepSpeedZeroTest, TheReportCarriesTheHostBytes) {
  ModelSpec model;
  model.source = PresetSpec{"gpt2-small", {{"layers", 2}, {"seq", 128}}};
  RunConfig c = Zero(DataSharding::kDeepSpeedZero1, 8);
  c.batch_size = 2;
  c.parallelism.offload_optimizer = true;
  const Report r = Estimate(model, c).value();
  ASSERT_TRUE(r.data_parallel.has_value());
  const Graph g = BuildStepGraph(model, c).value();
  const DeepSpeedZero z = *PlanDataParallel(g, c).value().deepspeed;
  EXPECT_EQ(r.data_parallel->host_bytes, z.HostBytes());
  EXPECT_GT(z.HostBytes(), 16 * z.partition_elements);
  EXPECT_EQ(r.breakdown[static_cast<int>(Category::kOptimizerState)], 0);
  c.parallelism.offload_optimizer = false;
  EXPECT_EQ(Estimate(model, c).value().data_parallel->host_bytes, 0);
}

TEST(DeepSpeedZeroTest, RefusesWhatItDoesNotRun) {
  for (DataSharding stage : {DataSharding::kDeepSpeedZero1, DataSharding::kDeepSpeedZero2}) {
    RunConfig c = Zero(stage, 2);
    c.precision = Precision::kBf16Amp;
    EXPECT_NE(ValidateRunConfig(c).message().find("config.precision"), std::string::npos);
    c = Zero(stage, 2);
    c.runtime = Runtime::kCpuTorch113;
    EXPECT_NE(ValidateRunConfig(c).message().find("config.parallelism.data_parallel"),
              std::string::npos);
    c = Zero(stage, 2);
    c.parallelism.gradient_as_bucket_view = true;
    EXPECT_NE(ValidateRunConfig(c).message().find("gradient_as_bucket_view"), std::string::npos);
    c = Zero(stage, 2);
    c.zero_grad_set_to_none = false;
    EXPECT_NE(ValidateRunConfig(c).message().find("config.zero_grad_keep_grads"),
              std::string::npos);
    c = Zero(stage, 2);
    c.parallelism.offload_optimizer = true;
    EXPECT_TRUE(ValidateRunConfig(c).ok());
  }
  RunConfig c = Zero(DataSharding::kDdp, 2);
  EXPECT_NE(ValidateRunConfig(c).message().find("reduce_bucket_size"), std::string::npos);
  // offload_optimizer belongs to DeepSpeed's ZeRO-1/2: named, with the strategy given.
  for (DataSharding other : {DataSharding::kDdp, DataSharding::kZero1, DataSharding::kFsdp2,
                             DataSharding::kFsdp1, DataSharding::kMegatronDistOpt}) {
    c = Zero(other, 2);
    c.parallelism.reduce_bucket_elements = 0;
    c.parallelism.offload_optimizer = true;
    const std::string m = ValidateRunConfig(c).message();
    EXPECT_NE(m.find("config.parallelism.offload_optimizer"), std::string::npos) << m;
    EXPECT_NE(m.find(DataShardingName(other)), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace memest
