// SweepEstimator (engine/sweep.h): each report is Estimate's; configurations that resolve to the
// same BuildContext share one graph; passes that rewrite the graph get their own; a few graphs
// are kept. (tests/golden sweeps the whole golden corpus and compares every byte.)
#include "engine/sweep.h"

#include <gtest/gtest.h>

#include <vector>

namespace memest {
namespace {

RunConfig Bf16(int64_t batch) {
  RunConfig c;
  c.batch_size = batch;
  c.precision = Precision::kBf16Amp;
  c.device = "a100-80gb";
  return c;
}

void ExpectSameReport(const Report& got, const Report& want) {
  EXPECT_EQ(got.peak.allocated_bytes, want.peak.allocated_bytes);
  EXPECT_EQ(got.peak.op, want.peak.op);
  EXPECT_EQ(got.peak_reserved_bytes, want.peak_reserved_bytes);
  EXPECT_EQ(got.breakdown, want.breakdown);
  EXPECT_EQ(got.end_of_step, want.end_of_step);
  EXPECT_EQ(got.notes, want.notes);
  ASSERT_EQ(got.advice.size(), want.advice.size());
  for (size_t i = 0; i < got.advice.size(); ++i) {
    EXPECT_EQ(got.advice[i].message, want.advice[i].message);
  }
}

TEST(SweepEstimatorTest, ConfigurationsOfOneContextShareItsGraph) {
  const ModelSpec gpt2{PresetSpec{"gpt2-small", {{"layers", 2}, {"seq", 256}}}};
  EstimateOptions options;
  SweepEstimator sweep(gpt2, options);
  std::vector<RunConfig> configs(4, Bf16(4));
  configs[1].optimizer.kind = OptimizerKind::kSgdMomentum;
  configs[2].checkpoint.policy = CheckpointPolicy::kEveryBlock;
  configs[3].batch_size = 8;
  configs[3].grad_accum_steps = 2;  // micro-batches of 4: the same graph again
  for (const RunConfig& c : configs) {
    StatusOr<Report> swept = sweep.Estimate(c, nullptr);
    StatusOr<Report> alone = Estimate(gpt2, c, options);
    ASSERT_TRUE(swept.ok() && alone.ok()) << swept.status().ToString();
    ExpectSameReport(*swept, *alone);
  }
  EXPECT_EQ(sweep.graphs_built(), 1);

  ASSERT_TRUE(sweep.Estimate(Bf16(8), nullptr).ok());  // another micro-batch
  EXPECT_EQ(sweep.graphs_built(), 2);
  RunConfig fp32 = Bf16(4);
  fp32.precision = Precision::kFp32;  // built without autocast
  ASSERT_TRUE(sweep.Estimate(fp32, nullptr).ok());
  EXPECT_EQ(sweep.graphs_built(), 3);
  RunConfig l4 = Bf16(4);
  l4.device = "l4";  // another generation picks another attention kernel
  ASSERT_TRUE(sweep.Estimate(l4, nullptr).ok());
  EXPECT_EQ(sweep.graphs_built(), 4);
  ASSERT_TRUE(sweep.Estimate(Bf16(4), nullptr).ok());
  EXPECT_EQ(sweep.graphs_built(), 4);
}

TEST(SweepEstimatorTest, AdaptersAndRefusalsAreEstimatesOfTheirOwn) {
  const ModelSpec gpt2{PresetSpec{"gpt2-small", {{"layers", 2}, {"seq", 128}}}};
  SweepEstimator sweep(gpt2, EstimateOptions{});
  RunConfig lora = Bf16(2);
  lora.lora.rank = 8;
  lora.lora.target_modules = {"c_attn"};
  StatusOr<Report> swept = sweep.Estimate(lora, nullptr);
  ASSERT_TRUE(swept.ok()) << swept.status().ToString();
  ExpectSameReport(*swept, Estimate(gpt2, lora).value());
  EXPECT_EQ(sweep.graphs_built(), 0);  // ApplyLora rewrites the graph: Estimate() builds it

  RunConfig zero = Bf16(0);
  StatusOr<Report> refused = sweep.Estimate(zero, nullptr);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().ToString(), Estimate(gpt2, zero).status().ToString());
  RunConfig unknown = Bf16(2);
  unknown.device = "tpu-v5";
  EXPECT_EQ(sweep.Estimate(unknown, nullptr).status().ToString(),
            Estimate(gpt2, unknown).status().ToString());
  EXPECT_EQ(sweep.graphs_built(), 0);

  Budget spent;
  spent.set_max_op_steps(10);  // less than one step
  EXPECT_EQ(sweep.Estimate(Bf16(2), &spent).status().code(), StatusCode::kResourceExhausted);
}

TEST(SweepEstimatorTest, KeepsTheMostRecentlyUsedGraphs) {
  const ModelSpec gpt2{PresetSpec{"gpt2-small", {{"layers", 1}, {"seq", 64}}}};
  EstimateOptions options;
  options.advice = false;
  SweepEstimator sweep(gpt2, options);
  constexpr int64_t kKept = SweepEstimator::kMaxGraphs;
  auto built_after = [&](int64_t batch) {
    EXPECT_TRUE(sweep.Estimate(Bf16(batch), nullptr).ok());
    return sweep.graphs_built();
  };
  for (int64_t b = 1; b <= kKept + 1; ++b) built_after(b);  // batch 1's graph let go
  EXPECT_EQ(sweep.graphs_built(), kKept + 1);
  EXPECT_EQ(built_after(2), kKept + 1);          // kept, and now the most recently used
  EXPECT_EQ(built_after(kKept + 2), kKept + 2);  // lets batch 3's go, the least recently used
  EXPECT_EQ(built_after(2), kKept + 2);
  EXPECT_EQ(built_after(3), kKept + 3);
  EXPECT_EQ(built_after(1), kKept + 4);
}

}  // namespace
}  // namespace memest
