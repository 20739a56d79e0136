// FSDP1 with CPUOffload(offload_params=True) (engine/passes/fsdp1.h says what PyTorch does):
// each unit's flat shard, its gradient and the optimizer state live in host memory; each
// unshard copies the shard to the GPU first; the reduce-scattered shards stay on the GPU until
// backward ends. Exact accounting, on the units of fsdp1_test.cc.
#include <gtest/gtest.h>

#include <memory>
#include <utility>
#include <vector>

#include "engine/estimator.h"
#include "engine/passes/data_parallel.h"
#include "engine/passes/fsdp1.h"
#include "engine/step/rank_hooks.h"
#include "tests/engine/test_graphs.h"

namespace memest {
namespace {

using enginetest::AtEnd;
using enginetest::Cat;
using enginetest::FsdpStack;
using enginetest::PhasePeak;
using enginetest::WalkRank;

// As fsdp1_test.cc: a block's flat shard is 2,032 elements of 8,127 over 4 ranks, the root's
// 1,152 of 4,608.
constexpr int64_t kBlockShard = 2032;
constexpr int64_t kRootShard = 1152;
constexpr int64_t kShards = 3 * kBlockShard + kRootShard;

RunConfig Offloaded() {
  RunConfig c = enginetest::PlainTraining();
  c.optimizer.kind = OptimizerKind::kSgdMomentum;
  c.parallelism.data = 4;
  c.parallelism.sharding = DataSharding::kFsdp1;
  c.parallelism.fsdp_cpu_offload = true;
  return c;
}

// The host holds each unit's `_local_shard` and `_cpu_grad` pinned (8,128 and 4,608 bytes,
// each rounded up to 8,192) and SGD's momentum over the shards; the GPU keeps none of them.
TEST(Fsdp1OffloadTest, ModelStatesLiveInPinnedHostMemory) {
  const Fsdp1View v = PlanFsdp1(FsdpStack(), Offloaded()).value();
  EXPECT_TRUE(v.cpu_offload);
  EXPECT_EQ(v.units[0].offload_copy_bytes, kBlockShard * 4);
  EXPECT_EQ(v.host_bytes, 4 * 2 * 8192 + kShards * 4);
  // AdamW: two states, and its for-loop step's scratch on the host (two temporaries and the
  // previous parameter's denom) over the largest shard.
  RunConfig adamw = Offloaded();
  adamw.optimizer.kind = OptimizerKind::kAdamW;
  EXPECT_EQ(PlanFsdp1(FsdpStack(), adamw).value().host_bytes,
            4 * 2 * 8192 + 2 * kShards * 4 + 3 * kBlockShard * 4);
  const Liveness l = WalkRank(FsdpStack(), Offloaded());
  for (Category k : {Category::kParameters, Category::kGradients, Category::kOptimizerState,
                     Category::kCommunication}) {
    EXPECT_EQ(AtEnd(l, k), 0) << static_cast<int>(k);
  }
}

// Forward gathers the root and one block as without offload, but no shard stays on the GPU.
TEST(Fsdp1OffloadTest, OnlyTheGatheredUnitsAreOnTheGpu) {
  const Liveness l = WalkRank(FsdpStack(), Offloaded());
  const PeakPoint& fwd = PhasePeak(l, Phase::kForward);
  EXPECT_EQ(Cat(fwd, Category::kParameters), 4 * kRootShard * 4 + 4 * kBlockShard * 4);
}

// The reduce-scattered shards are `_saved_grad_shard` until prepare_gradient_for_optim: at the
// root's post-backward every block's shard is still on the GPU.
TEST(Fsdp1OffloadTest, SavedGradShardsStayUntilBackwardEnds) {
  const Liveness l = WalkRank(FsdpStack(), Offloaded());
  const PeakPoint& bwd = PhasePeak(l, Phase::kBackward);
  EXPECT_GE(Cat(bwd, Category::kGradients), 3 * kBlockShard * 4);
  EXPECT_EQ(AtEnd(l, Category::kGradients), 0);
}

// Under mixed precision the unshard casts a float32 copy of the host shard into `_mp_shard`.
TEST(Fsdp1OffloadTest, MixedPrecisionCopiesTheFloat32Shard) {
  RunConfig c = Offloaded();
  c.precision = Precision::kBf16Pure;
  c.parallelism.fsdp_mixed_precision = true;
  const Fsdp1View v = PlanFsdp1(FsdpStack(DType::kBFloat16), c).value();
  EXPECT_EQ(v.units[0].offload_copy_bytes, kBlockShard * 4);
  EXPECT_EQ(v.units[0].mp_shard_bytes, kBlockShard * 2);
  const Liveness l = WalkRank(FsdpStack(DType::kBFloat16), c);
  EXPECT_EQ(AtEnd(l, Category::kParameters), 0);
}

class LoggedMemory : public RankMemory {
 public:
  using RankMemory::Allocate;
  int Allocate(int64_t bytes, Category category, int /*stream*/) override {
    log.push_back({bytes, category});
    return static_cast<int>(log.size()) - 1;
  }
  void Deallocate(int /*buffer*/) override {}
  bool HasOwnGrad(int /*t*/) const override { return false; }
  void ReleaseGrad(int /*t*/, bool /*into_rank_buffer*/) override {}
  bool LastMicroBatch() const override { return true; }
  std::vector<std::pair<int64_t, Category>> log;
};

// Under mixed precision pre_unshard casts a float32 GPU copy of the host shard into `_mp_shard`
// even for a unit still gathered: in a SHARD_GRAD_OP backward every unit, the root's first,
// takes one such copy, once.
TEST(Fsdp1OffloadTest, MixedPrecisionCastsAgainForAUnitStillGathered) {
  const Graph g = FsdpStack(DType::kBFloat16);
  RunConfig c = Offloaded();
  c.precision = Precision::kBf16Pure;
  c.parallelism.fsdp_mixed_precision = true;
  c.parallelism.reshard_after_forward = false;
  const RankView view = PlanDataParallel(g, c).value();
  std::unique_ptr<RankHooks> hooks = MakeRankHooks(&view, g, c);
  LoggedMemory m;
  hooks->StepStarts(m);
  for (int op = 0; op < static_cast<int>(g.ops.size()); ++op) {
    hooks->ForwardOpStarts(m, op);
    hooks->ForwardOpEnds(m, op);
  }
  const size_t forward = m.log.size();
  hooks->BackwardStarts(m);
  for (int op = static_cast<int>(g.ops.size()) - 1; op >= 0; --op) hooks->BackwardReaches(m, op);
  int blocks = 0, root = 0;
  for (size_t i = forward; i < m.log.size(); ++i) {
    if (m.log[i].second != Category::kCommunication) continue;
    blocks += m.log[i].first == kBlockShard * 4;
    root += m.log[i].first == kRootShard * 4;
  }
  EXPECT_EQ(blocks, 3);
  EXPECT_EQ(root, 1);
}

// HYBRID_SHARD's all-reduce is in place: accepted. Refused: gradient accumulation (PyTorch's
// offload overwrites the host gradient each micro-batch), and other strategies.
TEST(Fsdp1OffloadTest, HybridShardIsAcceptedAccumulationAndDdpRefused) {
  RunConfig hsdp = Offloaded();
  hsdp.parallelism.data = 8;
  hsdp.parallelism.data_shard = 4;
  EXPECT_TRUE(ValidateRunConfig(hsdp).ok()) << ValidateRunConfig(hsdp).message();
  RunConfig accumulated = Offloaded();
  accumulated.batch_size = 4;
  accumulated.grad_accum_steps = 2;
  EXPECT_NE(ValidateRunConfig(accumulated).message().find("config.grad_accum_steps"),
            std::string::npos);
  RunConfig ddp = Offloaded();
  ddp.parallelism.sharding = DataSharding::kDdp;
  EXPECT_NE(ValidateRunConfig(ddp).message().find("config.parallelism.fsdp_cpu_offload"),
            std::string::npos);
}

}  // namespace
}  // namespace memest
