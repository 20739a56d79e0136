// DeepSpeed ZeRO-3 on one rank (engine/passes/deepspeed_zero3.h, engine/step/deepspeed_zero3.cc):
// the partitions and the optimizer's buffers, the coordinator's gathering (recorded first step,
// prefetch, reuse distance, persistent parameters), the settings that make no sense. Exact
// accounting, so every byte below is a sum of the tensors named in its comment.
#include "engine/passes/deepspeed_zero3.h"

#include <gtest/gtest.h>

#include "engine/estimator.h"
#include "engine/passes/data_parallel.h"
#include "tests/engine/test_graphs.h"

namespace memest {
namespace {

using enginetest::AtEnd;
using enginetest::Cat;
using enginetest::FsdpStack;
using enginetest::PhasePeak;
using enginetest::PlainTraining;
using enginetest::WalkRank;

// FsdpStack's parameters (float32) and their partitions over 4 ranks: in.weight 4,096 -> 1,024;
// per block fc1.weight 4,032 -> 1,008, fc1.bias 63 -> 16, fc2.weight 4,032 -> 1,008; out.weight
// 512 -> 128.
constexpr int64_t kNumel = 4096 + 3 * (4032 + 63 + 4032) + 512;  // 28,989
constexpr int64_t kPartitions = 1024 + 3 * (1008 + 16 + 1008) + 128;  // 7,248
constexpr int64_t kBucket = 10'000;

RunConfig Zero3(StepKind step = StepKind::kSteadyState) {
  RunConfig c = PlainTraining();
  c.optimizer.kind = OptimizerKind::kAdamW;
  c.step = step;
  c.parallelism.data = 4;
  c.parallelism.sharding = DataSharding::kDeepSpeedZero3;
  c.parallelism.reduce_bucket_elements = kBucket;
  c.parallelism.stage3_param_persistence_threshold = 0;  // no persistent parameters
  return c;
}

// The trace's modules: the root, the containers (blocks, blocks.k: no parameters of their
// own) and the leaves, parents first; the linears whose input requires grad save their weight.
TEST(DeepSpeedZero3Test, ModulesArePartitionedAndGatheredByScope) {
  const DeepSpeedZero3 z = PlanDeepSpeedZero3(FsdpStack(), Zero3()).value();
  std::vector<std::string> scopes, owners;
  int saving = 0;
  for (const Zero3Module& m : z.modules) {
    scopes.push_back(m.scope);
    if (!m.params.empty()) owners.push_back(m.scope);
    for (int op : m.saver) saving += op >= 0 ? 1 : 0;
  }
  EXPECT_EQ(scopes, (std::vector<std::string>{"", "in", "blocks", "blocks.0", "blocks.0.fc1",
                                              "blocks.0.fc2", "blocks.1", "blocks.1.fc1",
                                              "blocks.1.fc2", "blocks.2", "blocks.2.fc1",
                                              "blocks.2.fc2", "out"}));
  EXPECT_EQ(owners.size(), 8u);  // in, 3 x (fc1, fc2), out
  EXPECT_EQ(z.modules[4].params.size(), 2u);  // fc1's weight and bias
  EXPECT_EQ(saving, 7);  // every linear but `in`, whose input (the data) needs no gradient
  EXPECT_EQ(z.trainable_partition_elements, kPartitions);
  EXPECT_EQ(z.master_bytes, 4 * kPartitions);
  EXPECT_EQ(z.state_bytes, 8 * kPartitions);          // AdamW's exp_avg and exp_avg_sq
  EXPECT_EQ(z.grad_partition_bytes, 4 * kPartitions);  // the model's dtype
  EXPECT_EQ(z.ipg_bytes, 4 * kBucket);
}

// The step ends with what ZeRO-3 keeps: partitions, fp32 masters, state, gradient partitions,
// the ipg bucket; no gathered parameter, no gradient of autograd's.
TEST(DeepSpeedZero3Test, StepEndsWithThePartitionedStates) {
  const Liveness l = WalkRank(FsdpStack(), Zero3());
  EXPECT_EQ(AtEnd(l, Category::kParameters), 4 * kPartitions);
  EXPECT_EQ(AtEnd(l, Category::kGradients), 4 * kPartitions);
  EXPECT_EQ(AtEnd(l, Category::kMasterAndCasts), 4 * kPartitions);
  EXPECT_EQ(AtEnd(l, Category::kOptimizerState), 8 * kPartitions);
  EXPECT_EQ(AtEnd(l, Category::kCommunication), 4 * kBucket);
}

// The first step records the trace: every module's parameters are released after its forward,
// but a linear's weight stays in memory, saved by autograd (a view of it) until that linear's
// backward: the fc1 weights' copies (4,032 elements; their bias goes), the lone fc2 and out
// weights' N-partition buffers (4 x 1,008 and 4 x 128), measured so on DeepSpeed 0.16
// (docs/parallelism-truth.md, section 11). Checkpointed blocks save nothing in forward. A
// steady step prefetches the whole (small) model and keeps it: its next use, in backward, is
// within the reuse distance.
TEST(DeepSpeedZero3Test, ASteadyStepKeepsASmallModelGathered) {
  const Graph g = FsdpStack();
  const Liveness first = WalkRank(g, Zero3(StepKind::kFirstStep));
  EXPECT_EQ(Cat(PhasePeak(first, Phase::kLoss), Category::kParameters),
            4 * (kPartitions + 3 * (4032 + 4032) + 512));
  RunConfig checkpointed = Zero3(StepKind::kFirstStep);
  checkpointed.checkpoint.policy = CheckpointPolicy::kEveryBlock;
  EXPECT_EQ(Cat(PhasePeak(WalkRank(g, checkpointed), Phase::kLoss), Category::kParameters),
            4 * (kPartitions + 512));
  const Liveness steady = WalkRank(g, Zero3());
  EXPECT_EQ(Cat(PhasePeak(steady, Phase::kLoss), Category::kParameters),
            4 * (kPartitions + kNumel));
}

// Without prefetch, the reuse distance decides alone: 9,000 elements keep `out` (used again at
// once) and blocks.2.fc2 (out's 512 twice before it), not blocks.2.fc1 (fc2 and out twice:
// 9,088). (The blocks are checkpointed, so no linear of theirs keeps its weight for backward.)
TEST(DeepSpeedZero3Test, TheReuseDistanceKeepsTheLastModules) {
  RunConfig c = Zero3();
  c.checkpoint.policy = CheckpointPolicy::kEveryBlock;
  c.parallelism.stage3_prefetch_bucket_size = 0;
  c.parallelism.stage3_max_reuse_distance = 9'000;
  const Liveness l = WalkRank(FsdpStack(), c);
  EXPECT_EQ(Cat(PhasePeak(l, Phase::kLoss), Category::kParameters),
            4 * (kPartitions + 512 + 4032));
  c.parallelism.stage3_max_reuse_distance = 1'000'000'000;
  EXPECT_EQ(Cat(PhasePeak(WalkRank(FsdpStack(), c), Phase::kLoss), Category::kParameters),
            4 * (kPartitions + kNumel));
}

// Persistent parameters (here all, at most 1e5 elements each) are gathered by the previous
// step's end and stay: N padded partitions each.
TEST(DeepSpeedZero3Test, PersistentParametersStayGathered) {
  RunConfig c = Zero3();
  c.parallelism.stage3_param_persistence_threshold = 100'000;
  const DeepSpeedZero3 z = PlanDeepSpeedZero3(FsdpStack(), c).value();
  EXPECT_EQ(z.persistent_bytes, 4 * 4 * kPartitions);
  const Liveness l = WalkRank(FsdpStack(), c);
  EXPECT_EQ(AtEnd(l, Category::kParameters), 4 * kPartitions + z.persistent_bytes);
  EXPECT_EQ(Cat(PhasePeak(l, Phase::kLoss), Category::kParameters),
            4 * kPartitions + z.persistent_bytes);
}

// Backward's gradients pass through the ipg bucket: at its peak no gradient of autograd's
// beyond the one being copied.
TEST(DeepSpeedZero3Test, GradientsLeaveThroughTheBucket) {
  const Liveness l = WalkRank(FsdpStack(), Zero3());
  const PeakPoint& bwd = PhasePeak(l, Phase::kBackward);
  EXPECT_LE(Cat(bwd, Category::kGradients), 4 * kPartitions + 4 * 4096);
}

// Two micro-batches end where one does (the first step's second one runs on the recorded
// trace): nothing gathered, no flat buffer, no saved weight is left behind.
TEST(DeepSpeedZero3Test, MicroBatchesLeaveNothingBehind) {
  for (StepKind step : {StepKind::kFirstStep, StepKind::kSteadyState}) {
    RunConfig one = Zero3(step);
    RunConfig two = one;
    two.batch_size = 2;
    two.grad_accum_steps = 2;
    const Liveness a = WalkRank(FsdpStack(), one), b = WalkRank(FsdpStack(), two);
    EXPECT_EQ(a.at_end, b.at_end);
    EXPECT_EQ(AtEnd(b, Category::kCommunication), 4 * kBucket);  // the ipg bucket alone
    EXPECT_EQ(AtEnd(b, Category::kParameters), 4 * kPartitions);
  }
}

// Autograd keeps a gathered weight only through a view of it: F.linear's weight.t(), or a
// model's W.t() into a matmul. addmm(bias, x, W) saves the parameter itself, whose data DeepSpeed
// swaps for an empty tensor: freed at the release. With one rank nothing is gathered at all.
TEST(DeepSpeedZero3Test, OnlyAViewOfTheWeightKeepsItsGather) {
  auto model = [](bool view) {
    GraphBuilder b;
    int h = b.Input("x", {4, 64}, DType::kFloat32);
    {
      ScopeGuard s(b, "first");
      h = b.Add1("linear", {h, b.Parameter("weight", {64, 64}, DType::kFloat32)});
    }
    ScopeGuard s(b, "second");
    const int w = b.Parameter("weight", {64, 64}, DType::kFloat32);
    h = view ? b.Add1("matmul", {h, b.Add1("transpose", {w}, {{"dim0", int64_t{0}},
                                                              {"dim1", int64_t{1}}})})
             : b.Add1("addmm", {b.Parameter("bias", {64}, DType::kFloat32), h, w});
    b.BeginLoss();
    b.SetLoss(b.Add1("sum", {h}));
    return b.Finish().value();
  };
  const RunConfig c = Zero3(StepKind::kFirstStep);
  // Partitions: 64 x 64 / 4 = 1,024 each (and the bias' 16).
  EXPECT_EQ(Cat(PhasePeak(WalkRank(model(true), c), Phase::kLoss), Category::kParameters),
            4 * (2 * 1024 + 4096));
  EXPECT_EQ(Cat(PhasePeak(WalkRank(model(false), c), Phase::kLoss), Category::kParameters),
            4 * (2 * 1024 + 16));
  RunConfig one = c;
  one.parallelism.data = 1;
  EXPECT_EQ(Cat(PhasePeak(WalkRank(model(true), one), Phase::kLoss), Category::kParameters),
            4 * 2 * 4096);
}

// Bytes sent per step: (N-1)/N of the parameters gathered in forward, again in backward when
// released (the first step; a steady step keeps a model under half the reuse distance), and
// of the gradients reduce-scattered; persistent parameters once, after the step.
TEST(DeepSpeedZero3Test, CommunicatedBytesFollowTheGathers) {
  const Graph g = FsdpStack();
  const double p = 4.0 * kNumel, share = 3.0 / 4;
  EXPECT_NEAR(static_cast<double>(CommunicatedBytesPerStep(g, Zero3())), share * 2 * p, 1.0);
  EXPECT_NEAR(static_cast<double>(CommunicatedBytesPerStep(g, Zero3(StepKind::kFirstStep))),
              share * 3 * p, 1.0);
  RunConfig persistent = Zero3();
  persistent.parallelism.stage3_param_persistence_threshold = 100'000;  // every parameter
  EXPECT_NEAR(static_cast<double>(CommunicatedBytesPerStep(g, persistent)), share * 2 * p, 1.0);
  persistent.grad_accum_steps = 2;
  persistent.batch_size = 2;
  EXPECT_NEAR(static_cast<double>(CommunicatedBytesPerStep(g, persistent)), share * 3 * p, 1.0);
}

TEST(DeepSpeedZero3Test, SettingsThatMakeNoSenseAreRefused) {
  RunConfig c = Zero3();
  c.runtime = Runtime::kCuda;
  EXPECT_TRUE(ValidateRunConfig(c).ok()) << ValidateRunConfig(c).message();
  RunConfig ddp = c;
  ddp.parallelism.sharding = DataSharding::kDdp;
  ddp.parallelism.reduce_bucket_elements = 0;
  ddp.parallelism.stage3_param_persistence_threshold = 100'000;  // the default: fine
  EXPECT_TRUE(ValidateRunConfig(ddp).ok()) << ValidateRunConfig(ddp).message();
  ddp.parallelism.stage3_max_reuse_distance = 5;
  EXPECT_NE(ValidateRunConfig(ddp).message().find("config.parallelism.stage3_max_reuse_distance"),
            std::string::npos);
  RunConfig negative = c;
  negative.parallelism.stage3_prefetch_bucket_size = -1;
  EXPECT_NE(ValidateRunConfig(negative).message().find("stage3_prefetch_bucket_size"),
            std::string::npos);
  RunConfig cpu = c;
  cpu.runtime = Runtime::kCpuTorch113;
  EXPECT_NE(ValidateRunConfig(cpu).message().find("CUDA"), std::string::npos);
}

// A preset: ZeRO-3 keeps less between steps than ZeRO-2 (the 16-bit parameters partitioned
// too) and says what it counts.
TEST(DeepSpeedZero3Test, EstimateOfAPresetPartitionsTheParameters) {
  ModelSpec model;
  model.source = PresetSpec{"gpt2-small", {{"layers", 4}, {"seq", 128}}};
  RunConfig c;
  c.batch_size = 2;
  c.precision = Precision::kBf16Pure;
  c.parallelism.data = 8;
  c.parallelism.sharding = DataSharding::kDeepSpeedZero3;
  const Report z3 = Estimate(model, c).value();
  RunConfig z2c = c;
  z2c.parallelism.sharding = DataSharding::kDeepSpeedZero2;
  const Report z2 = Estimate(model, z2c).value();
  EXPECT_LT(z3.end_of_step[static_cast<int>(Category::kParameters)],
            z2.end_of_step[static_cast<int>(Category::kParameters)] / 4);
  bool noted = false;
  for (const std::string& n : z3.notes) noted |= n.rfind("DeepSpeed ZeRO-3 over 8 ranks", 0) == 0;
  EXPECT_TRUE(noted);
}

}  // namespace
}  // namespace memest
