// A long pipeline schedule simulated short (engine/passes/pipeline.h PipelineFold,
// engine/step/fold.cc, the walk in engine/step/liveness.cc): every figure of the report equals
// the whole schedule's, stage by stage, over the settings that change what a period holds.
#include <gtest/gtest.h>

#include <string>

#include "engine/estimator.h"
#include "engine/passes/pipeline.h"

namespace memest {
namespace {

std::string Describe(const PeakPoint& p) {
  std::string s = std::string(PhaseName(p.phase)) + " mb " + std::to_string(p.micro_batch) + " " + p.op + " " +
                  p.scope + (p.recompute ? " (recompute)" : "") + " allocated " +
                  std::to_string(p.allocated_bytes) + " reserved " +
                  std::to_string(p.reserved_bytes) + " by category";
  for (int64_t b : p.by_category) s += " " + std::to_string(b);
  return s;
}

std::string Describe(const Report& r) {
  std::string s = "peak " + Describe(r.peak) + "\npeak reserved " +
                  std::to_string(r.peak_reserved_bytes) + "\nsaved " +
                  std::to_string(r.saved_for_backward_bytes) + "\nend";
  for (int64_t b : r.end_of_step) s += " " + std::to_string(b);
  for (int64_t b : r.breakdown) s += " " + std::to_string(b);
  for (const PeakPoint& p : r.phases) s += "\nphase " + Describe(p);
  s += "\nlayers " + std::to_string(r.layers.size());
  return s;
}

struct Case {
  std::string name;
  PresetSpec preset;
  int64_t stages = 4;
  int64_t micro_batches = 32;
  int64_t virtual_stages = 1;
  void (*tweak)(RunConfig*) = nullptr;
};

RunConfig ConfigOf(const Case& k) {
  RunConfig c;
  c.precision = Precision::kBf16Pure;
  c.optimizer.kind = OptimizerKind::kAdamW;
  c.batch_size = 2 * k.micro_batches;
  c.grad_accum_steps = k.micro_batches;
  c.parallelism.pipeline = k.stages;
  c.parallelism.pipeline_virtual_stages = k.virtual_stages;
  if (k.tweak != nullptr) k.tweak(&c);
  return c;
}

// Each stage's report from its folded schedule and from its whole schedule.
void ExpectFoldChangesNothing(const Case& k) {
  const RunConfig c = ConfigOf(k);
  const Graph built = BuildStepGraph(ModelSpec{k.preset}, c).value();
  int folded_stages = 0;
  for (int64_t s = 0; s < k.stages; ++s) {
    PipelineStage stage = PlanPipelineStage(built, c, s).value();
    ASSERT_TRUE(stage.fold.has_value()) << k.name << " stage " << s;
    const PlannedStep folded = PlanStep(stage.graph, c, false, nullptr, &stage).value();
    folded_stages += folded.schedule.repeat.has_value();
    PipelineStage whole_stage = stage;
    whole_stage.fold.reset();
    const PlannedStep whole = PlanStep(whole_stage.graph, c, false, nullptr, &whole_stage).value();
    ASSERT_FALSE(whole.schedule.repeat.has_value());
    EXPECT_LT(folded.schedule.events.size(), whole.schedule.events.size());
    EXPECT_EQ(Describe(ReportStep(stage.graph, c, folded)),
              Describe(ReportStep(whole_stage.graph, c, whole)))
        << k.name << " stage " << s;
  }
  // The events of the steady state repeat on every stage of these schedules.
  EXPECT_EQ(folded_stages, k.stages) << k.name;
}

const PresetSpec kGpt{"gpt2-small", {{"layers", 8}, {"d_model", 128}, {"heads", 4}, {"seq", 64},
                                     {"vocab", 512}}};
const PresetSpec kLlama{"llama-7b", {{"layers", 8}, {"d_model", 128}, {"heads", 4},
                                     {"kv_heads", 2}, {"ffn", 256}, {"seq", 64}, {"vocab", 512}}};

TEST(PipelineFoldTest, OneFOneBAsSimulatedInFull) {
  ExpectFoldChangesNothing({"gpt 4x32", kGpt, 4, 32});
  ExpectFoldChangesNothing({"gpt 2x21", kGpt, 2, 21});
  ExpectFoldChangesNothing({"llama 8x40", kLlama, 8, 40});
}

TEST(PipelineFoldTest, InterleavedAsSimulatedInFull) {
  ExpectFoldChangesNothing({"gpt 2x24 v2", kGpt, 2, 24, 2});
  ExpectFoldChangesNothing({"llama 2x40 v4", kLlama, 2, 40, 4});
}

TEST(PipelineFoldTest, SettingsThatChangeAPeriodAsSimulatedInFull) {
  ExpectFoldChangesNothing({"checkpointed", kGpt, 4, 32, 1, [](RunConfig* c) {
                              c->checkpoint.policy = CheckpointPolicy::kEveryBlock;
                            }});
  ExpectFoldChangesNothing({"expandable first step", kLlama, 4, 32, 1, [](RunConfig* c) {
                              c->expandable_segments = true;
                              c->step = StepKind::kFirstStep;
                            }});
  ExpectFoldChangesNothing({"keep outputs, ddp", kGpt, 4, 32, 1, [](RunConfig* c) {
                              c->parallelism.pipeline_keep_outputs = true;
                              c->parallelism.data = 2;
                              c->parallelism.sharding = DataSharding::kDdp;
                            }});
  ExpectFoldChangesNothing({"tp sp distopt", kLlama, 2, 24, 2, [](RunConfig* c) {
                              c->parallelism.tensor = 2;
                              c->parallelism.sequence_parallel = true;
                              c->parallelism.data = 2;
                              c->parallelism.sharding = DataSharding::kMegatronDistOpt;
                            }});
  ExpectFoldChangesNothing({"cpu exact", kGpt, 2, 24, 1, [](RunConfig* c) {
                              c->runtime = Runtime::kCpuTorch113;
                              c->precision = Precision::kFp32;
                            }});
}

TEST(PipelineFoldTest, ShortOrGPipeSchedulesAreNotFolded) {
  EXPECT_FALSE(FoldPipelineActions(PipelineSchedule::kGPipe, 0, 4, 1, 256).has_value());
  EXPECT_FALSE(FoldPipelineActions(PipelineSchedule::k1F1B, 0, 4, 1, 8).has_value());
  // 4 stages, stage 0: the first backward after 4 forwards (3 of warm-up), so a buffer lives 5
  // periods at most; 12 periods of (backward, forward) after it.
  const auto f = FoldPipelineActions(PipelineSchedule::k1F1B, 0, 4, 1, 1000);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->micro_batches, 16);
  EXPECT_EQ(f->copies, 984);
  EXPECT_EQ(f->period, 2);
}

}  // namespace
}  // namespace memest
