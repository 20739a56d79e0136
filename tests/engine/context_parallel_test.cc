// Context parallelism (engine/passes/context_parallel.h, cp_attention in engine/rules/parallel.cc):
// the rank's share of the sequence everywhere, ring attention, position tables sliced, what it
// composes with, and the refusals.
#include "engine/passes/context_parallel.h"

#include <gtest/gtest.h>

#include <string>

#include "engine/estimator.h"
#include "engine/passes/megatron_ddp.h"

namespace memest {
namespace {

ModelSpec SmallLlama(int64_t seq = 256) {
  return ModelSpec{PresetSpec{"llama-7b", {{"layers", 2}, {"seq", seq}}}};
}

RunConfig Bf16(int64_t context) {
  RunConfig c;
  c.precision = Precision::kBf16Pure;
  c.parallelism.context = context;
  return c;
}

TEST(ContextParallelTest, EachRankHoldsItsShareOfTheSequence) {
  const Graph whole = BuildStepGraph(SmallLlama(), Bf16(1), 1'000'000, nullptr).value();
  const ContextParallelView v = ShardContextParallel(whole, 4).value();
  EXPECT_EQ(v.attentions, 2);
  int rings = 0, slices = 0;
  for (const Op& op : v.graph.ops) {
    if (op.kind == "cp_attention") {
      ++rings;
      // [batch, heads, the rank's 256 / 4 positions, head dim]
      EXPECT_EQ(v.graph.tensors[op.outputs[0]].shape, (Shape{1, 32, 64, 128}));
    }
    slices += op.kind == "slice";
  }
  EXPECT_EQ(rings, 2);
  EXPECT_GT(slices, 0);  // the rotary tables, cut to the rank's positions
  for (const Tensor& t : v.graph.tensors) {
    if (t.role == TensorRole::kInput || t.role == TensorRole::kTarget) {
      EXPECT_EQ(t.shape, (Shape{1, 64})) << t.name;
    }
  }
  EXPECT_GT(v.communicated_bytes, 0);
}

TEST(ContextParallelTest, ActivationsShrinkModelStatesDoNot) {
  const Report one = Estimate(SmallLlama(2048), Bf16(1), {}).value();
  const Report four = Estimate(SmallLlama(2048), Bf16(4), {}).value();
  EXPECT_LT(four.saved_for_backward_bytes, one.saved_for_backward_bytes / 3);
  EXPECT_EQ(four.end_of_step[static_cast<int>(Category::kParameters)],
            one.end_of_step[static_cast<int>(Category::kParameters)]);
  EXPECT_EQ(four.end_of_step[static_cast<int>(Category::kOptimizerState)],
            one.end_of_step[static_cast<int>(Category::kOptimizerState)]);
}

TEST(ContextParallelTest, RefusesWhatRingAttentionCannotRun) {
  RunConfig eager = Bf16(2);
  eager.attention = AttentionImpl::kEager;
  StatusOr<Report> r = Estimate(SmallLlama(), eager, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("needs a fused kernel"), std::string::npos)
      << r.status().message();
  r = Estimate(SmallLlama(196), Bf16(4), {});  // 196 does not split into 8 chunks
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("config.parallelism.context: the sequence"),
            std::string::npos)
      << r.status().message();
  RunConfig inference = Bf16(2);
  inference.mode = Mode::kInference;
  EXPECT_NE(ValidateRunConfig(inference).message().find("config.parallelism.context"),
            std::string::npos);
}

TEST(ContextParallelTest, ComposesWithTensorAndMegatronDataParallelism) {
  RunConfig c = Bf16(2);
  c.parallelism.tensor = 2;
  c.parallelism.sequence_parallel = true;
  c.parallelism.data = 2;
  c.parallelism.sharding = DataSharding::kMegatronDistOpt;
  c.optimizer.kind = OptimizerKind::kAdam;
  StatusOr<Report> r = Estimate(SmallLlama(), c, {});
  ASSERT_TRUE(r.ok()) << r.status().message();
  // Megatron's distributed optimizer shards over the data x context ranks.
  const Graph whole = BuildStepGraph(SmallLlama(), c, 1'000'000, nullptr).value();
  RunConfig flat = c;
  flat.parallelism.tensor = 1;
  const MegatronDdp m = PlanMegatronDdp(whole, flat).value();
  EXPECT_EQ(m.shard_elements, m.buffer_elements / 4);
}

// A request can name cp_attention itself: a group whose copies cannot be counted is refused,
// naming the attribute, before any byte count wraps.
TEST(ContextParallelTest, RingAttentionRefusesUncountableCopies) {
  GraphBuilder b;
  const int q = b.Input("q", {1, 2, 1024, 64}, DType::kFloat32);
  const int k = b.Input("k", {1, 2, 1024, 64}, DType::kFloat32);
  const int v = b.Input("v", {1, 2, 1024, 64}, DType::kFloat32);
  EXPECT_GE(b.Add1("cp_attention", {q, k, v}, {{"cp", int64_t{4}}}), 0);
  b.Add1("cp_attention", {q, k, v}, {{"cp", int64_t{1} << 50}});
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("attrs.cp"), std::string::npos) << b.status().message();
}

}  // namespace
}  // namespace memest
