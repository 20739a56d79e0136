// FSDP2 on one rank (engine/passes/fsdp.h, engine/step/fsdp2.cc): dim-0 shards with their
// padding, the gathered groups live in forward and backward, the reduce-scatter, mixed
// precision, and the settings that make no sense. Exact accounting (no allocator rounding), so
// every byte below is a sum of the tensors named in its comment.
#include "engine/passes/fsdp.h"

#include <gtest/gtest.h>

#include "engine/estimator.h"
#include "engine/passes/data_parallel.h"
#include "engine/step/rank_hooks.h"
#include "tests/engine/test_graphs.h"

namespace memest {
namespace {

using enginetest::AtEnd;
using enginetest::Cat;
using enginetest::PhasePeak;
using enginetest::PlainTraining;

constexpr int kBlocks = enginetest::kFsdpStackBlocks;

Graph Stack(DType dtype = DType::kFloat32) { return enginetest::FsdpStack(dtype); }

// Elements over 4 ranks. A block: fc1.weight [63, 64] -> shard 16 x 64, padded 64 x 64;
// fc1.bias [63] -> 16, padded 64; fc2.weight [64, 63] -> 16 x 63, padded 64 x 63.
constexpr int64_t kBlockShard = 16 * 64 + 16 + 16 * 63;       // 2048
constexpr int64_t kBlockGathered = 64 * 64 + 64 + 64 * 63;    // 8192
// The root: in.weight [64, 64] -> 16 x 64; out.weight [8, 64] -> 2 x 64.
constexpr int64_t kRootShard = 16 * 64 + 2 * 64;              // 1152
constexpr int64_t kRootGathered = 64 * 64 + 8 * 64;           // 4608
constexpr int64_t kShards = kBlocks * kBlockShard + kRootShard;

RunConfig Fsdp(int64_t ranks = 4) {
  RunConfig c = PlainTraining();
  c.parallelism.data = ranks;
  c.parallelism.sharding = DataSharding::kFsdp2;
  return c;
}

TEST(Fsdp2Test, GroupsAreTheBlocksAndTheRootWithPaddedDimZeroShards) {
  const Graph g = Stack();
  const Fsdp2View v = PlanFsdp2(g, Fsdp()).value();
  ASSERT_EQ(v.groups.size(), kBlocks + 1u);
  EXPECT_EQ(v.groups[1].scope, "blocks.1");
  EXPECT_EQ(v.groups[1].params.size(), 3u);
  EXPECT_EQ(v.groups[1].flat_bytes, kBlockGathered * 4);
  EXPECT_EQ(v.groups[1].reduce_input_bytes, kBlockGathered * 4);
  EXPECT_EQ(v.groups[1].reduce_output_bytes, kBlockShard * 4);
  EXPECT_EQ(v.groups[1].copy_in_bytes, 0);  // no mixed precision: the shard is the input
  EXPECT_EQ(v.groups.back().scope, "");
  EXPECT_EQ(v.groups.back().params.size(), 2u);
  EXPECT_EQ(v.groups.back().flat_bytes, kRootGathered * 4);
  EXPECT_FALSE(v.groups.back().reshard_after_forward);
}

// The rank keeps shards of everything: parameters, gradients after the step, SGD-momentum
// state, each a quarter (padded) of the model.
TEST(Fsdp2Test, ModelStatesAreTheShards) {
  const Graph g = Stack();
  RunConfig c = Fsdp();
  c.optimizer.kind = OptimizerKind::kSgdMomentum;
  const Liveness l = enginetest::WalkRank(g, c);
  EXPECT_EQ(AtEnd(l, Category::kParameters), kShards * 4);
  EXPECT_EQ(AtEnd(l, Category::kGradients), kShards * 4);
  EXPECT_EQ(AtEnd(l, Category::kOptimizerState), kShards * 4);
  EXPECT_EQ(AtEnd(l, Category::kCommunication), 0);  // every gathered buffer is gone
}

// Measured on PyTorch 2.15 (docs/parallelism-truth.md, section 8): in forward, a block's
// unsharded parameters and its all-gather buffer live together (the buffer until the next
// group's copy-out, the last one until the root's post-forward); in backward, the block being
// back-propagated is unsharded, the one before it all-gathered but not copied out (prefetched),
// and the previous group's reduce-scatter input lives through it; the root stays gathered.
TEST(Fsdp2Test, GatheredGroupsLiveAsMeasured) {
  const Graph g = Stack();
  const Liveness l = enginetest::WalkRank(g, Fsdp());
  const PeakPoint& fwd = PhasePeak(l, Phase::kForward);
  EXPECT_EQ(Cat(fwd, Category::kParameters), (kShards + kRootGathered + kBlockGathered) * 4);
  EXPECT_EQ(Cat(fwd, Category::kCommunication), kBlockGathered * 4);
  const PeakPoint& loss = PhasePeak(l, Phase::kLoss);
  EXPECT_EQ(Cat(loss, Category::kParameters), (kShards + kRootGathered) * 4);
  EXPECT_EQ(Cat(loss, Category::kCommunication), 0);
  const PeakPoint& bwd = PhasePeak(l, Phase::kBackward);
  EXPECT_EQ(Cat(bwd, Category::kParameters), (kShards + kRootGathered + kBlockGathered) * 4);
  // The prefetched all-gather buffer and the previous block's reduce-scatter input (float32).
  EXPECT_EQ(Cat(bwd, Category::kCommunication), 2 * kBlockGathered * 4);
}

// reshard_after_forward=False: every block stays gathered from its forward to its backward.
TEST(Fsdp2Test, WithoutReshardAfterForwardEveryBlockStaysGathered) {
  const Graph g = Stack();
  RunConfig c = Fsdp();
  c.parallelism.reshard_after_forward = false;
  const Liveness l = enginetest::WalkRank(g, c);
  EXPECT_EQ(Cat(PhasePeak(l, Phase::kLoss), Category::kParameters),
            (kShards + kRootGathered + kBlocks * kBlockGathered) * 4);
  EXPECT_GT(PhasePeak(l, Phase::kLoss).allocated_bytes,
            PhasePeak(enginetest::WalkRank(g, Fsdp()), Phase::kLoss).allocated_bytes);
}

// torchtitan's default: reshard_after_forward=False on the last block alone. It stays gathered
// through the loss and is not all-gathered again for backward; the others reshard.
TEST(Fsdp2Test, TheLastBlockCanStayGathered) {
  const Graph g = Stack();
  RunConfig c = Fsdp();
  c.parallelism.keep_last_block_gathered = true;
  const Fsdp2View v = PlanFsdp2(g, c).value();
  for (int k = 0; k < kBlocks; ++k) {
    EXPECT_EQ(v.groups[k].reshard_after_forward, k != kBlocks - 1) << k;
  }
  const Liveness l = enginetest::WalkRank(g, c);
  EXPECT_EQ(Cat(PhasePeak(l, Phase::kLoss), Category::kParameters),
            (kShards + kRootGathered + kBlockGathered) * 4);
  int gathers = 0;
  for (const Event& e : enginetest::RankSchedule(g, c).events) {
    gathers += e.kind == EventKind::kAlloc && e.stream == kAllGatherStream &&
               e.bytes == kBlockGathered * 4;
  }
  EXPECT_EQ(gathers, 2 * kBlocks - 1);
  // Only FSDP2 wraps blocks one by one; with every block kept it says nothing.
  c.parallelism.reshard_after_forward = false;
  EXPECT_FALSE(ValidateRunConfig(c).ok());
  c.parallelism.reshard_after_forward = true;
  c.parallelism.sharding = DataSharding::kFsdp1;
  const Status fsdp1 = ValidateRunConfig(c);
  EXPECT_NE(fsdp1.message().find("config.parallelism.keep_last_block_gathered"),
            std::string::npos)
      << fsdp1.ToString();
}

// MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32): the graph computes in
// bfloat16, the shards and their gradients are float32, the gathered parameters bfloat16, and
// gradients are reduced in float32.
TEST(Fsdp2Test, MixedPrecisionKeepsFloat32ShardsAndGathersBfloat16) {
  const Graph g = Stack(DType::kBFloat16);
  RunConfig c = Fsdp();
  c.precision = Precision::kBf16Pure;
  c.parallelism.fsdp_mixed_precision = true;
  const Fsdp2View v = PlanFsdp2(g, c).value();
  EXPECT_EQ(v.sharded_dtype, DType::kFloat32);
  EXPECT_EQ(v.reduce_dtype, DType::kFloat32);
  EXPECT_EQ(v.groups[0].flat_bytes, kBlockGathered * 2);
  EXPECT_EQ(v.groups[0].copy_in_bytes, kBlockShard * 2);  // the shard cast to bfloat16
  EXPECT_EQ(v.groups[0].reduce_input_bytes, kBlockGathered * 4);
  const Liveness l = enginetest::WalkRank(g, c);
  EXPECT_EQ(AtEnd(l, Category::kParameters), kShards * 4);
  EXPECT_EQ(AtEnd(l, Category::kGradients), kShards * 4);
  // The gathered parameters and buffers in bfloat16, the reduce-scatter input in float32.
  const PeakPoint& bwd = PhasePeak(l, Phase::kBackward);
  EXPECT_EQ(Cat(bwd, Category::kParameters), kShards * 4 + (kRootGathered + kBlockGathered) * 2);
  EXPECT_EQ(Cat(bwd, Category::kCommunication), kBlockGathered * 2 + kBlockGathered * 4);
  // Without the policy the same bfloat16 model keeps bfloat16 shards.
  c.parallelism.fsdp_mixed_precision = false;
  EXPECT_EQ(AtEnd(enginetest::WalkRank(g, c), Category::kParameters), kShards * 2);
}

// Gradient accumulation reduce-scatters every micro-batch and adds into the sharded
// gradients; zero_grad(set_to_none=False) keeps them, sharded, between steps.
TEST(Fsdp2Test, AccumulationAndKeptGradientsStaySharded) {
  const Graph g = Stack();
  RunConfig c = Fsdp();
  c.grad_accum_steps = 2;
  c.batch_size = 8;
  EXPECT_EQ(AtEnd(enginetest::WalkRank(g, c), Category::kGradients), kShards * 4);
  RunConfig keep = Fsdp();
  keep.zero_grad_set_to_none = false;
  const Liveness l = enginetest::WalkRank(g, keep);
  EXPECT_EQ(Cat(PhasePeak(l, Phase::kData), Category::kGradients), kShards * 4);
  EXPECT_EQ(AtEnd(l, Category::kGradients), kShards * 4);
}

// The streams PyTorch allocates FSDP2's buffers on (_fsdp_collectives.py): the all-gather's
// output on all_gather_copy_in_stream, the copy-out and the reduce-scatter input on the default
// stream, the reduce-scatter output (the sharded gradients) on reduce_scatter_stream. The caching
// allocator keeps their blocks apart, so the rank reserves more than one pool would.
TEST(Fsdp2Test, CollectivesAllocateOnTheirOwnStreams) {
  const Graph g = Stack();
  const Schedule s = enginetest::RankSchedule(g, Fsdp());
  int gathers = 0, reduce_inputs = 0, sharded_grads = 0, unsharded = 0;
  for (const Event& e : s.events) {
    if (e.kind != EventKind::kAlloc) continue;
    if (e.category == Category::kCommunication && e.bytes == kBlockGathered * 4) {
      // A block's all-gather output (forward and backward) or its reduce-scatter input.
      if (e.stream == kAllGatherStream) ++gathers;
      if (e.stream == kDefaultStream) ++reduce_inputs;
    }
    if (e.category == Category::kGradients && e.bytes == kBlockShard * 4) {
      EXPECT_EQ(e.stream, kReduceScatterStream);
      ++sharded_grads;
    }
    if (e.category == Category::kParameters && e.bytes == 64 * 64 * 4) {  // a [64, 64] weight
      EXPECT_EQ(e.stream, kDefaultStream);
      ++unsharded;
    }
  }
  EXPECT_EQ(gathers, 2 * kBlocks);  // each block gathered in forward and again in backward
  EXPECT_EQ(reduce_inputs, kBlocks);
  EXPECT_EQ(sharded_grads, kBlocks);
  EXPECT_EQ(unsharded, 2 * kBlocks + 1);  // fc1.weight in forward and backward, the root's in
  // One pool for every buffer would reserve less.
  Schedule one = s;
  for (Event& e : one.events) e.stream = kDefaultStream;
  const int64_t apart = WalkSchedule(s, g, false).value().peak_reserved;
  const int64_t pooled = WalkSchedule(one, g, false).value().peak_reserved;
  EXPECT_GT(apart, pooled);
}

TEST(Fsdp2Test, SettingsThatMakeNoSenseAreRefused) {
  RunConfig c = Fsdp();
  c.runtime = Runtime::kCuda;
  EXPECT_TRUE(ValidateRunConfig(c).ok());
  c.parallelism.fsdp_mixed_precision = true;  // fp32 has no 16-bit param_dtype
  EXPECT_NE(ValidateRunConfig(c).message().find("config.parallelism.fsdp_mixed_precision"),
            std::string::npos);
  c.precision = Precision::kBf16Amp;
  EXPECT_NE(ValidateRunConfig(c).message().find("bf16-pure"), std::string::npos);
  c.precision = Precision::kBf16Pure;
  EXPECT_TRUE(ValidateRunConfig(c).ok());
  c.runtime = Runtime::kCpuTorch113;
  EXPECT_NE(ValidateRunConfig(c).message().find("no FSDP2"), std::string::npos);
  RunConfig ddp = PlainTraining();
  ddp.parallelism.data = 2;
  ddp.parallelism.sharding = DataSharding::kDdp;
  ddp.parallelism.reshard_after_forward = false;
  EXPECT_NE(ValidateRunConfig(ddp).message().find("config.parallelism.reshard_after_forward"),
            std::string::npos);
  RunConfig buckets = Fsdp();
  buckets.parallelism.bucket_cap_bytes = 1 << 20;
  EXPECT_NE(ValidateRunConfig(buckets).message().find("config.parallelism.bucket_cap_mb"),
            std::string::npos);
}

// An estimate of a preset: the report says FSDP2 and its rank; the step fits where DDP's does
// not need to: parameters, gradients and state a quarter of DDP's.
TEST(Fsdp2Test, EstimateOfAPresetShardsTheModelStates) {
  ModelSpec model;
  model.source = PresetSpec{"gpt2-small", {{"layers", 4}, {"seq", 128}}};
  RunConfig c;
  c.batch_size = 2;
  c.parallelism.data = 4;
  c.parallelism.sharding = DataSharding::kFsdp2;
  const Report r = Estimate(model, c).value();
  ASSERT_TRUE(r.data_parallel.has_value());
  EXPECT_EQ(r.data_parallel->world, 4);
  EXPECT_EQ(r.data_parallel->rank, 0);
  RunConfig ddp = c;
  ddp.parallelism.sharding = DataSharding::kDdp;
  const Report d = Estimate(model, ddp).value();
  const int64_t p = r.end_of_step[static_cast<int>(Category::kParameters)];
  const int64_t whole = d.end_of_step[static_cast<int>(Category::kParameters)];
  EXPECT_LT(p, whole / 4 + (int64_t{4} << 20));  // padding and rounding: a few MiB at most
  EXPECT_GE(p, whole / 4);
  EXPECT_LT(r.peak.allocated_bytes, d.peak.allocated_bytes);
  bool noted = false;
  for (const std::string& n : r.notes) noted |= n.rfind("FSDP2 over 4 ranks", 0) == 0;
  EXPECT_TRUE(noted);
}

}  // namespace
}  // namespace memest
