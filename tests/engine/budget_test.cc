// What one request may spend: op steps, a deadline and a cancellation, honoured while the engine
// works (engine/ir/budget.h); and the op count of a model, known before it is expanded.
#include "engine/ir/budget.h"

#include <gtest/gtest.h>

#include <string>

#include "engine/estimator.h"
#include "engine/models/presets.h"
#include "engine/passes/checkpoint.h"
#include "engine/step/liveness.h"
#include "engine/step/schedule.h"
#include "tests/engine/test_graphs.h"

namespace memest {
namespace {

bool Contains(const Status& s, const std::string& text) {
  return s.message().find(text) != std::string::npos;
}

TEST(BudgetTest, RefusesOnceItsOpStepsAreSpentAndStaysRefused) {
  Budget b;
  b.set_max_op_steps(1000);
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(b.Charge(1).ok()) << i;
  EXPECT_TRUE(b.Affords(0));
  EXPECT_FALSE(b.Affords(1));
  const Status over = b.Charge(1);
  EXPECT_EQ(over.code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(Contains(over, "1000 op steps")) << over.message();
  EXPECT_TRUE(b.spent_out());
  EXPECT_EQ(b.Check().code(), StatusCode::kResourceExhausted) << "sticky";
}

TEST(BudgetTest, APassedDeadlineIsNoticedWithinOneCheckInterval) {
  Budget b;
  b.set_deadline(Budget::Clock::now() - std::chrono::seconds(1));
  EXPECT_EQ(b.Check().code(), StatusCode::kDeadlineExceeded);
  Budget later;
  later.set_deadline(Budget::Clock::now() - std::chrono::seconds(1));
  int charged = 0;
  while (later.Charge(1).ok()) ++charged;
  EXPECT_LT(charged, Budget::kCheckEvery);
  EXPECT_FALSE(later.spent_out());
}

TEST(BudgetTest, CancellationIsAskedEveryCheckInterval) {
  int asked = 0;
  bool cancelled = false;
  Budget b;
  b.set_cancelled([&] {
    ++asked;
    return cancelled;
  });
  for (int i = 0; i < 10 * Budget::kCheckEvery; ++i) ASSERT_TRUE(b.Charge(1).ok());
  EXPECT_EQ(asked, 10);
  cancelled = true;
  Status s;
  for (int i = 0; i < Budget::kCheckEvery && s.ok(); ++i) s = b.Charge(1);
  EXPECT_EQ(s.code(), StatusCode::kCancelled);
}

ModelSpec Preset(const std::string& name, std::map<std::string, int64_t> params = {}) {
  return ModelSpec{PresetSpec{name, std::move(params)}};
}

RunConfig Gpt2Config() {
  RunConfig c;
  c.batch_size = 2;
  c.device = "a100-80gb";
  return c;
}

// The op steps one estimate of gpt2-small (seq 128) takes, without advice.
int64_t OneEstimate() {
  Budget b;
  EstimateOptions o;
  o.advice = false;
  o.budget = &b;
  EXPECT_TRUE(Estimate(Preset("gpt2-small", {{"seq", 128}}), Gpt2Config(), o).ok());
  return b.spent();
}

TEST(BudgetTest, AStepThatCannotFitIsRefusedBeforeItIsScheduled) {
  Budget b;
  b.set_max_op_steps(100);  // gpt2-small has ~700 ops
  EstimateOptions o;
  o.budget = &b;
  StatusOr<Report> r = Estimate(Preset("gpt2-small", {{"seq", 128}}), Gpt2Config(), o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(Contains(r.status(), "model: one step of its")) << r.status().message();
  EXPECT_EQ(b.spent(), 0) << "nothing was scheduled";
}

TEST(BudgetTest, AdviceStopsWhenTheBudgetIsSpentAndSaysSo) {
  const int64_t one = OneEstimate();
  ASSERT_GT(one, 3 * Budget::kCheckEvery);  // well above the granularity the budget checks at
  StatusOr<Report> full = Estimate(Preset("gpt2-small", {{"seq", 128}}), Gpt2Config());
  ASSERT_TRUE(full.ok());
  Budget b;
  b.set_max_op_steps(3 * one);  // the estimate and two alternatives at most
  EstimateOptions o;
  o.budget = &b;
  StatusOr<Report> cut = Estimate(Preset("gpt2-small", {{"seq", 128}}), Gpt2Config(), o);
  ASSERT_TRUE(cut.ok()) << cut.status().message();
  EXPECT_LT(cut->advice.size(), full->advice.size());
  EXPECT_EQ(cut->peak.allocated_bytes, full->peak.allocated_bytes) << "the estimate is whole";
  bool noted = false;
  for (const std::string& n : cut->notes) noted |= n.find("advice cut short") != std::string::npos;
  EXPECT_TRUE(noted);
  EXPECT_LE(b.spent(), 3 * one + Budget::kCheckEvery);
}

TEST(BudgetTest, DeadlineAndCancellationEndTheEstimateWithTheirCodes) {
  Budget late;
  late.set_deadline(Budget::Clock::now() - std::chrono::milliseconds(1));
  EstimateOptions o;
  o.budget = &late;
  EXPECT_EQ(Estimate(Preset("gpt2-small", {{"seq", 128}}), Gpt2Config(), o).status().code(),
            StatusCode::kDeadlineExceeded);

  // Cancelled during the advice: the whole request ends, not just the advice.
  const int64_t one = OneEstimate();
  Budget b;
  b.set_cancelled([&b, one] { return b.spent() > one; });
  o.budget = &b;
  StatusOr<Report> r = Estimate(Preset("gpt2-small", {{"seq", 128}}), Gpt2Config(), o);
  EXPECT_EQ(r.status().code(), StatusCode::kCancelled);
  EXPECT_LE(b.spent(), one + 2 * Budget::kCheckEvery) << "stopped within one check interval";
}

// The deadline and cancellation reach the graph's construction too: a large build stops within
// 256 ops of the caller going away.
TEST(BudgetTest, ACancelledBuildStops) {
  int asked = 0;
  Budget b;
  b.set_cancelled([&asked] { return ++asked > 2; });
  BuildContext ctx = enginetest::MakeContext(1);
  ctx.budget = &b;
  StatusOr<Graph> g = BuildPreset(PresetSpec{"gpt2-small", {{"layers", 60}, {"seq", 16}}}, ctx);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kCancelled);
  EXPECT_EQ(asked, 3);
}

// The allocator walk of a built schedule looks at the budget too (every 256 ops): a caller gone
// during the walk stops it there.
TEST(BudgetTest, ACancelledWalkStops) {
  BuildContext ctx = enginetest::MakeContext(1);
  const Graph g = BuildPreset(PresetSpec{"gpt2-small", {{"layers", 60}, {"seq", 16}}}, ctx).value();
  RunConfig config;
  const Schedule s = BuildSchedule(g, config, {}, ScheduleOptions{}).value();
  int asked = 0;
  Budget b;
  b.set_cancelled([&asked] { return ++asked > 2; });
  StatusOr<Liveness> walked = WalkSchedule(s, g, false, Accounting::kCachingAllocator, &b);
  ASSERT_FALSE(walked.ok());
  EXPECT_EQ(walked.status().code(), StatusCode::kCancelled);
  EXPECT_EQ(asked, 3);
  EXPECT_TRUE(WalkSchedule(s, g, false).ok()) << "without a budget the walk runs to its end";
}

// A deep preset is refused by its op count, computed from one- and two-layer builds, before it
// is expanded; the count is exact, so the limit is neither early nor late.
TEST(PresetOpCountTest, DeepPresetsAreRefusedBeforeExpansionAtTheirExactCount) {
  for (const char* name : {"gpt2-small", "llama-7b", "bert-base", "vit-b16", "mlp"}) {
    for (Mode mode : {Mode::kTraining, Mode::kInference}) {
      BuildContext ctx = enginetest::MakeContext(1, mode);
      ctx.autocast = mode == Mode::kTraining ? DType::kBFloat16 : DType::kFloat32;
      const PresetSpec spec{name, {{"layers", 100}, {"seq", 16}}};
      PresetSpec fixed = spec;
      if (std::string(name) == "vit-b16" || std::string(name) == "mlp") fixed.params.erase("seq");
      StatusOr<Graph> g = BuildPreset(fixed, ctx);
      ASSERT_TRUE(g.ok()) << name << ": " << g.status().message();
      const int64_t ops = static_cast<int64_t>(g->ops.size());
      ctx.max_ops = ops;
      EXPECT_TRUE(BuildPreset(fixed, ctx).ok()) << name;
      ctx.max_ops = ops - 1;
      StatusOr<Graph> refused = BuildPreset(fixed, ctx);
      ASSERT_FALSE(refused.ok()) << name;
      EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
      EXPECT_TRUE(Contains(refused.status(), "model.preset.params.layers: " + std::string(name) +
                                                 " with 100 layers expands to " +
                                                 std::to_string(ops) + " ops"))
          << refused.status().message();
    }
  }
}

TEST(PresetOpCountTest, AHugeLayerCountIsRefusedAtOnce) {
  BuildContext ctx = enginetest::MakeContext(1);
  ctx.max_ops = 100'000;
  const auto start = Budget::Clock::now();
  StatusOr<Graph> g = BuildPreset(PresetSpec{"mlp", {{"layers", 16'777'216}}}, ctx);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(Contains(g.status(), "model.preset.params.layers")) << g.status().message();
  EXPECT_LT(Budget::Clock::now() - start, std::chrono::milliseconds(100));
}

// A layer list stops expanding at the limit, naming the layer it reached.
TEST(PresetOpCountTest, ALayerListStopsExpandingAtTheLimit) {
  LayerModelSpec spec;
  spec.input_shape = {16, 64};
  for (int i = 0; i < 1000; ++i) {
    spec.layers.push_back({"transformer_block", "", {{"heads", int64_t{4}}}});
  }
  BuildContext ctx = enginetest::MakeContext(1);
  ctx.max_ops = 500;
  StatusOr<Graph> g = BuildLayerModel(spec, ctx);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(Contains(g.status(), "more than the limit of 500 ops (at model.layers["))
      << g.status().message();
}

// Block-wise checkpointing finds a block's ops by scope prefix at '.' boundaries: "h.1" holds
// "h.1.mlp" but not "h.10".
TEST(CheckpointPlanTest, BlockPrefixesRespectScopeBoundaries) {
  GraphBuilder b;
  int x = b.Input("x", {4, 8}, DType::kFloat32);
  for (const char* block : {"h.1", "h.10"}) {
    ScopeGuard scope(b, block);
    b.MarkBlock();
    ScopeGuard inner(b, "mlp");
    x = b.Add1("relu", {x});
    x = b.Add1("gelu", {x});
  }
  b.BeginLoss();
  b.SetLoss(b.Add1("sum", {x}));
  const Graph g = b.Finish().value();
  CheckpointConfig every;
  every.policy = CheckpointPolicy::kEveryBlock;
  EXPECT_EQ(PlanCheckpoints(g, every).value(), (CheckpointRegions{{0, 1}, {2, 3}}));
  CheckpointConfig pairs;
  pairs.policy = CheckpointPolicy::kEveryKBlocks;
  pairs.every_k = 2;
  EXPECT_EQ(PlanCheckpoints(g, pairs).value(), (CheckpointRegions{{0, 3}}));
}

// An op with a hundred thousand inputs (a cat) is scheduled in time linear in its inputs; the
// pairwise look for repeated storages took minutes. (A bound on time that only a quadratic
// pass can break; the speed itself is measured in bench/.)
TEST(LinearTimeTest, AnOpWithManyInputsIsScheduled) {
  GraphBuilder b;
  std::vector<int> parts;
  const int x = b.Input("x", {1, 4}, DType::kFloat32);
  for (int i = 0; i < 2000; ++i) parts.push_back(b.Add1("relu", {x}));
  std::vector<int> inputs;
  for (int i = 0; i < 100'000; ++i) inputs.push_back(parts[i % parts.size()]);
  b.Add1("cat", inputs);
  const Graph g = b.Finish().value();
  RunConfig c;
  c.mode = Mode::kInference;
  const auto start = Budget::Clock::now();
  ASSERT_TRUE(EstimateGraph(g, c).ok());
  EXPECT_LT(Budget::Clock::now() - start, std::chrono::seconds(2));
}

// The scopes policy: each named scope's runs of consecutive ops, one region per run; a scope
// nested in another is merged into it; "h.1" does not hold "h.10".
TEST(CheckpointPlanTest, ScopeRunsAreFoundInOnePass) {
  GraphBuilder b;
  int x = b.Input("x", {4, 8}, DType::kFloat32);
  for (const char* scope : {"h.1.attn", "h.10", "h.1.mlp", "h.1", "out"}) {
    ScopeGuard guard(b, scope);
    x = b.Add1("relu", {x});
  }
  b.BeginLoss();
  b.SetLoss(b.Add1("sum", {x}));
  const Graph g = b.Finish().value();
  CheckpointConfig c;
  c.policy = CheckpointPolicy::kScopes;
  c.scopes = {"h.1", "h.1.mlp"};
  EXPECT_EQ(PlanCheckpoints(g, c).value(), (CheckpointRegions{{0, 0}, {2, 3}}));
  c.scopes = {"h.1", "nowhere"};
  const Status missing = PlanCheckpoints(g, c).status();
  EXPECT_TRUE(Contains(missing, "config.checkpoint.scopes[1]: no op runs in scope 'nowhere'"))
      << missing.message();
}

}  // namespace
}  // namespace memest
