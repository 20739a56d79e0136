// FSDP2 with CPUOffloadPolicy (engine/passes/fsdp.h says what PyTorch does): the shards, their
// gradients and the optimizer state leave the GPU for pinned host memory, and each all-gather
// copies its shards in first. Exact accounting (no allocator rounding), so every byte below is
// a sum of the tensors named in its comment.
#include <gtest/gtest.h>

#include "engine/estimator.h"
#include "engine/passes/fsdp.h"
#include "tests/engine/test_graphs.h"

namespace memest {
namespace {

using enginetest::AtEnd;
using enginetest::Cat;
using enginetest::PhasePeak;
using enginetest::PlainTraining;
using enginetest::WalkRank;

// FsdpStack over 4 ranks (fsdp2_test.cc): a block's shards fc1.weight 16 x 64, fc1.bias 16,
// fc2.weight 16 x 63 (2,048 elements) of 8,192 gathered; the root's in.weight 16 x 64 and
// out.weight 2 x 64 of 4,608 gathered.
constexpr int64_t kBlockShard = 2048;
constexpr int64_t kBlockGathered = 8192;
constexpr int64_t kRootGathered = 4608;

RunConfig Offloaded() {
  RunConfig c = PlainTraining();
  c.optimizer.kind = OptimizerKind::kSgdMomentum;
  c.parallelism.data = 4;
  c.parallelism.sharding = DataSharding::kFsdp2;
  c.parallelism.fsdp_cpu_offload = true;
  return c;
}

// The GPU keeps nothing of the model states between steps; the host holds each shard and each
// gradient pinned (float32: 4,096, 64 and 4,032 -> 4,096 bytes per block, 4,096 and 512 for
// the root) and SGD's momentum over the shards (unpinned).
TEST(Fsdp2OffloadTest, ModelStatesLiveInPinnedHostMemory) {
  const Graph g = enginetest::FsdpStack();
  const RunConfig c = Offloaded();
  const Liveness l = WalkRank(g, c);
  for (Category k : {Category::kParameters, Category::kGradients, Category::kOptimizerState,
                     Category::kCommunication}) {
    EXPECT_EQ(AtEnd(l, k), 0) << static_cast<int>(k);
  }
  const Fsdp2View v = PlanFsdp2(g, c).value();
  const int64_t pinned = 3 * (4096 + 64 + 4096) + 4096 + 512;  // 29,376
  const int64_t momentum = (3 * kBlockShard + 16 * 64 + 2 * 64) * 4;
  EXPECT_EQ(v.host_bytes, 2 * pinned + momentum);
}

// In forward a block's all-gather copies its shards to the GPU (the inputs), makes its flat
// output, and frees the inputs; the step's forward peak is that moment, beside the previous
// block's output (kept until this block's copy-out) and the root's gathered parameters.
TEST(Fsdp2OffloadTest, EachAllGatherCopiesItsShardsToTheGpuFirst) {
  const Graph g = enginetest::FsdpStack();
  const Liveness l = WalkRank(g, Offloaded());
  const PeakPoint& fwd = PhasePeak(l, Phase::kForward);
  EXPECT_EQ(Cat(fwd, Category::kParameters), kRootGathered * 4);
  EXPECT_EQ(Cat(fwd, Category::kCommunication), (2 * kBlockGathered + kBlockShard) * 4);
}

// Under MixedPrecisionPolicy each input is the float32 shard copied in, then cast to bfloat16
// (the copy freed once cast): the inputs are bfloat16 beside the bfloat16 flat outputs.
TEST(Fsdp2OffloadTest, MixedPrecisionCastsEachShardAfterItsCopy) {
  const Graph g = enginetest::FsdpStack(DType::kBFloat16);
  RunConfig c = Offloaded();
  c.precision = Precision::kBf16Pure;
  c.parallelism.fsdp_mixed_precision = true;
  const Liveness l = WalkRank(g, c);
  const PeakPoint& fwd = PhasePeak(l, Phase::kForward);
  EXPECT_EQ(Cat(fwd, Category::kParameters), kRootGathered * 2);
  EXPECT_EQ(Cat(fwd, Category::kCommunication), (2 * kBlockGathered + kBlockShard) * 2);
}

// The option is FSDP's (fsdp1_offload_test.cc has FSDP1's); elsewhere it is refused, naming
// the field and the strategy.
TEST(Fsdp2OffloadTest, CpuOffloadBelongsToFsdp) {
  RunConfig c = Offloaded();
  c.runtime = Runtime::kCuda;
  EXPECT_TRUE(ValidateRunConfig(c).ok()) << ValidateRunConfig(c).message();
  c.parallelism.sharding = DataSharding::kDeepSpeedZero3;
  const std::string m = ValidateRunConfig(c).message();
  EXPECT_NE(m.find("config.parallelism.fsdp_cpu_offload"), std::string::npos) << m;
  EXPECT_NE(m.find("deepspeed-zero3"), std::string::npos) << m;
  RunConfig hsdp = Offloaded();
  hsdp.runtime = Runtime::kCuda;
  hsdp.parallelism.data_shard = 2;  // HSDP keeps the reduce-scatter output: refused
  EXPECT_NE(ValidateRunConfig(hsdp).message().find("config.parallelism.fsdp_cpu_offload"),
            std::string::npos);
}

// A preset end to end: the host memory is reported and noted, and the GPU's peak drops.
TEST(Fsdp2OffloadTest, EstimateOfAPresetReportsHostMemory) {
  ModelSpec model;
  model.source = PresetSpec{"gpt2-small", {{"layers", 4}, {"seq", 128}}};
  RunConfig c;
  c.batch_size = 2;
  c.parallelism.data = 8;
  c.parallelism.sharding = DataSharding::kFsdp2;
  const Report plain = Estimate(model, c).value();
  c.parallelism.fsdp_cpu_offload = true;
  const Report off = Estimate(model, c).value();
  EXPECT_EQ(plain.data_parallel->host_bytes, 0);
  EXPECT_GT(off.data_parallel->host_bytes, 0);
  EXPECT_LT(off.peak.allocated_bytes, plain.peak.allocated_bytes);
  EXPECT_EQ(off.end_of_step[static_cast<int>(Category::kOptimizerState)], 0);
  bool noted = false;
  for (const std::string& n : off.notes) noted |= n.rfind("CPUOffloadPolicy", 0) == 0;
  EXPECT_TRUE(noted);
}

}  // namespace
}  // namespace memest
