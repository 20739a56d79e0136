// FSDP1 on one rank (engine/passes/fsdp1.h, engine/step/fsdp1.cc): each unit one flat shard,
// its full parameters gathered whole around forward and backward, its gradients concatenated
// into one flat gradient and reduce-scattered through its copies. Exact accounting.
#include "engine/passes/fsdp1.h"

#include <gtest/gtest.h>

#include "engine/estimator.h"
#include "engine/passes/data_parallel.h"
#include "engine/step/rank_hooks.h"
#include "tests/engine/test_graphs.h"

namespace memest {
namespace {

using enginetest::AtEnd;
using enginetest::Cat;
using enginetest::FsdpStack;
using enginetest::PhasePeak;
using enginetest::PlainTraining;

// Elements. A block: fc1.weight 63 x 64, fc1.bias 63, fc2.weight 64 x 63 = 8,127 in one flat
// parameter; over 4 ranks a shard of 2,032 (8,128 padded: 1 element of padding). The root:
// in.weight 64 x 64 + out.weight 8 x 64 = 4,608, a shard of 1,152 (no padding).
constexpr int64_t kBlockNumel = 63 * 64 + 63 + 64 * 63;
constexpr int64_t kBlockShard = (kBlockNumel + 3) / 4;
constexpr int64_t kRootNumel = 64 * 64 + 8 * 64;
constexpr int64_t kRootShard = kRootNumel / 4;
constexpr int64_t kShards = 3 * kBlockShard + kRootShard;

RunConfig Fsdp1(int64_t ranks = 4) {
  RunConfig c = PlainTraining();
  c.parallelism.data = ranks;
  c.parallelism.sharding = DataSharding::kFsdp1;
  return c;
}

TEST(Fsdp1Test, UnitsAreFlatShardsWithTheirCopies) {
  const Fsdp1View v = PlanFsdp1(FsdpStack(), Fsdp1()).value();
  ASSERT_EQ(v.units.size(), 4u);
  const Fsdp1Unit& block = v.units[1];
  EXPECT_EQ(block.numel, kBlockNumel);
  EXPECT_EQ(block.shard, kBlockShard);
  EXPECT_EQ(block.full_bytes, 4 * kBlockShard * 4);       // the padded all-gather output
  EXPECT_EQ(block.flat_grad_bytes, kBlockNumel * 4);
  EXPECT_EQ(block.pad_bytes, 4 * kBlockShard * 4);        // 8,127 does not divide by 4
  EXPECT_EQ(v.units.back().pad_bytes, 0);                 // 4,608 does
  EXPECT_EQ(block.reduce_copy_bytes, 0);
  EXPECT_EQ(block.mp_shard_bytes, 0);
  EXPECT_EQ(block.flat_shard.shape, (Shape{kBlockShard}));
}

// The rank keeps the flat shards, their gradients and (SGD momentum) one state tensor each.
// The streams FSDP1 allocates on (_runtime_utils.py): the padded unsharded flat parameters on
// _unshard_stream, autograd's flat gradient on the default stream, the sharded gradient on
// _post_backward_stream.
TEST(Fsdp1Test, UnshardAndReduceAllocateOnTheirOwnStreams) {
  const Schedule s = enginetest::RankSchedule(FsdpStack(), Fsdp1());
  int full = 0, flat_grads = 0, shards = 0;
  for (const Event& e : s.events) {
    if (e.kind != EventKind::kAlloc) continue;
    if (e.category == Category::kParameters && e.bytes == 4 * kBlockShard * 4) {
      EXPECT_EQ(e.stream, kAllGatherStream);
      ++full;
    }
    if (e.category == Category::kGradients && e.bytes == kBlockNumel * 4) {
      EXPECT_EQ(e.stream, kDefaultStream);
      ++flat_grads;
    }
    if (e.category == Category::kGradients && e.bytes == kBlockShard * 4) {
      EXPECT_EQ(e.stream, kReduceScatterStream);
      ++shards;
    }
  }
  EXPECT_EQ(full, 2 * 3);  // 3 blocks, unsharded in forward and in backward
  EXPECT_EQ(flat_grads, 3);
  EXPECT_EQ(shards, 3);
}

TEST(Fsdp1Test, ModelStatesAreTheFlatShards) {
  RunConfig c = Fsdp1();
  c.optimizer.kind = OptimizerKind::kSgdMomentum;
  const Liveness l = enginetest::WalkRank(FsdpStack(), c);
  EXPECT_EQ(AtEnd(l, Category::kParameters), kShards * 4);
  EXPECT_EQ(AtEnd(l, Category::kGradients), kShards * 4);
  EXPECT_EQ(AtEnd(l, Category::kOptimizerState), kShards * 4);
  EXPECT_EQ(AtEnd(l, Category::kCommunication), 0);
}

// FULL_SHARD: forward holds the root and one block whole; backward the root, the block and the
// one before it (BACKWARD_PRE). SHARD_GRAD_OP keeps every block from its forward on.
TEST(Fsdp1Test, FullShardAndShardGradOpGatherAsTheySay) {
  const Graph g = FsdpStack();
  const Liveness full = enginetest::WalkRank(g, Fsdp1());
  const int64_t root = 4 * kRootShard * 4, block = 4 * kBlockShard * 4;
  EXPECT_EQ(Cat(PhasePeak(full, Phase::kForward), Category::kParameters),
            kShards * 4 + root + block);
  EXPECT_EQ(Cat(PhasePeak(full, Phase::kBackward), Category::kParameters),
            kShards * 4 + root + 2 * block);
  RunConfig op = Fsdp1();
  op.parallelism.reshard_after_forward = false;
  EXPECT_EQ(Cat(PhasePeak(enginetest::WalkRank(g, op), Phase::kLoss), Category::kParameters),
            kShards * 4 + root + 3 * block);
}

// MixedPrecision(param_dtype=bf16, reduce_dtype=fp32): float32 shards, bf16 full parameters
// and gradients, the gradient copied to float32 before its reduce-scatter.
TEST(Fsdp1Test, MixedPrecisionCastsAroundTheReduceScatter) {
  RunConfig c = Fsdp1();
  c.precision = Precision::kBf16Pure;
  c.parallelism.fsdp_mixed_precision = true;
  const Fsdp1View v = PlanFsdp1(FsdpStack(DType::kBFloat16), c).value();
  const Fsdp1Unit& block = v.units[0];
  EXPECT_EQ(block.full_bytes, 4 * kBlockShard * 2);
  EXPECT_EQ(block.mp_shard_bytes, kBlockShard * 2);
  EXPECT_EQ(block.flat_grad_bytes, kBlockNumel * 2);
  EXPECT_EQ(block.reduce_copy_bytes, kBlockNumel * 4);
  EXPECT_EQ(block.sharded_grad_bytes, kBlockShard * 4);
  EXPECT_EQ(block.grad_cast_bytes, 0);  // reduce dtype = the shards' dtype
  const Liveness l = enginetest::WalkRank(FsdpStack(DType::kBFloat16), c);
  EXPECT_EQ(AtEnd(l, Category::kParameters), kShards * 4);
  EXPECT_EQ(AtEnd(l, Category::kGradients), kShards * 4);
}

TEST(Fsdp1Test, RefusedWhereItDoesNotRun) {
  RunConfig c = Fsdp1();
  c.runtime = Runtime::kCpuTorch113;
  EXPECT_NE(ValidateRunConfig(c).message().find("FSDP1"), std::string::npos);
  RunConfig piped = Fsdp1();
  piped.parallelism.pipeline = 2;
  EXPECT_NE(ValidateRunConfig(piped).message().find("not modelled yet"), std::string::npos);
}

}  // namespace
}  // namespace memest
