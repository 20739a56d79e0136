// Pipeline parallelism (engine/passes/pipeline.h, engine/step/stage.cc): the schedules' orders,
// the stages' slices, the micro-batches a stage keeps in flight, and the refusals. The
// measured truth for whole stages is tests/parallel (pp.py; run.py --memest).
#include "engine/passes/pipeline.h"

#include <gtest/gtest.h>

#include <string>

#include "engine/estimator.h"
#include "tests/engine/test_graphs.h"

namespace memest {
namespace {

using enginetest::PlainTraining;

std::string Order(const std::vector<PipelineAction>& actions) {
  std::string s;
  for (const PipelineAction& a : actions) {
    s += (a.forward ? "F" : "B") + std::to_string(a.micro_batch) + " ";
  }
  return s;
}

TEST(PipelineTest, OneFOneBWarmsUpByTheStagesAfterIt) {
  // 4 stages, 6 micro-batches: stage 0 runs 3 forwards first, the last stage none.
  EXPECT_EQ(Order(PipelineActions(PipelineSchedule::k1F1B, 0, 4, 6)),
            "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5 ");
  EXPECT_EQ(Order(PipelineActions(PipelineSchedule::k1F1B, 3, 4, 6)),
            "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 ");
  // Fewer micro-batches than the warm-up: all forwards, then all backwards.
  EXPECT_EQ(Order(PipelineActions(PipelineSchedule::k1F1B, 0, 4, 2)), "F0 F1 B0 B1 ");
  EXPECT_EQ(Order(PipelineActions(PipelineSchedule::kGPipe, 3, 4, 3)), "F0 F1 F2 B0 B1 B2 ");
}

// x -> in -> 4 blocks of Linear + ReLU -> head -> sum.
Graph Blocks(int blocks = 4) {
  GraphBuilder b;
  int h = b.Input("x", {8, 64}, DType::kFloat32);
  {
    ScopeGuard s(b, "in");
    h = b.Add1("linear", {h, b.Parameter("weight", {64, 64}, DType::kFloat32)});
  }
  for (int k = 0; k < blocks; ++k) {
    ScopeGuard s(b, "h." + std::to_string(k));
    b.MarkBlock();
    h = b.Add1("linear", {h, b.Parameter("weight", {64, 64}, DType::kFloat32)});
    h = b.Add1("relu", {h});
  }
  {
    ScopeGuard s(b, "head");
    h = b.Add1("linear", {h, b.Parameter("weight", {16, 64}, DType::kFloat32)});
  }
  b.BeginLoss();
  b.SetLoss(b.Add1("sum", {h}));
  return b.Finish().value();
}

RunConfig Pipelined(int64_t stages, int64_t micro_batches) {
  RunConfig c = PlainTraining();
  c.runtime = Runtime::kCpuTorch113;  // exact bytes
  c.batch_size = 8 * micro_batches;
  c.grad_accum_steps = micro_batches;
  c.parallelism.pipeline = stages;
  return c;
}

// A stage is inferred for the runtime its model was built for (Graph::runtime: a fused
// attention's output layout depends on it), also when a later pass replays it.
TEST(PipelineTest, StagesKeepTheirModelsRuntime) {
  Graph g = Blocks();
  g.runtime = Runtime::kCpuTorch113;
  const RunConfig c = Pipelined(2, 4);
  EXPECT_EQ(PlanPipelineStage(g, c, 0).value().graph.runtime, Runtime::kCpuTorch113);
  EXPECT_EQ(PlanPipelineStage(g, c, 1).value().graph.runtime, Runtime::kCpuTorch113);
}

TEST(PipelineTest, StagesSliceTheBlocksAndPassOneActivation) {
  const Graph g = Blocks();
  const RunConfig c = Pipelined(2, 4);
  const PipelineStage first = PlanPipelineStage(g, c, 0).value();
  EXPECT_EQ(first.first_block, 0);
  EXPECT_EQ(first.last_block, 1);
  EXPECT_EQ(first.graph.ParameterCount(), 3 * 64 * 64);  // in, h.0, h.1
  // Its backward starts from the gradient it receives for the activation it sends on.
  ASSERT_GE(first.graph.loss, 0);
  EXPECT_EQ(first.graph.tensors[first.graph.loss].shape, (Shape{8, 64}));
  const PipelineStage last = PlanPipelineStage(g, c, 1).value();
  EXPECT_EQ(last.graph.ParameterCount(), 2 * 64 * 64 + 16 * 64);  // h.2, h.3, head
  EXPECT_TRUE(last.graph.tensors[last.graph.loss].shape.empty());  // the loss
  int received = 0;
  for (const Tensor& t : last.graph.tensors) received += t.role == TensorRole::kInput && t.requires_grad;
  EXPECT_EQ(received, 1);
  EXPECT_EQ(last.graph.blocks, (std::vector<std::string>{"h.2", "h.3"}));
}

// The planner's screen estimates the first and the last stage only; the full estimate's worst
// stage is one of them (the middle ones hold fewer micro-batches, no embedding and no head).
TEST(PipelineTest, EndStagesScreenTheSplit) {
  const Graph g = Blocks(4);
  const RunConfig c = Pipelined(4, 8);
  EstimateOptions screen{1'000'000, false};
  screen.end_stages_only = true;
  const Report ends = EstimateGraph(g, c, screen).value();
  const Report all = EstimateGraph(g, c, {1'000'000, false}).value();
  ASSERT_EQ(ends.pipeline->per_stage.size(), 2u);
  EXPECT_EQ(ends.pipeline->per_stage[0].stage, 0);
  EXPECT_EQ(ends.pipeline->per_stage[1].stage, 3);
  ASSERT_EQ(all.pipeline->per_stage.size(), 4u);
  EXPECT_EQ(ends.peak_reserved_bytes, all.peak_reserved_bytes);
  EXPECT_EQ(ends.pipeline->worst_stage, all.pipeline->worst_stage);
}

std::string Interleaved(const std::vector<PipelineAction>& actions) {
  std::string s;
  for (const PipelineAction& a : actions) {
    s += (a.forward ? "F" : "B") + std::to_string(a.micro_batch) + "c" + std::to_string(a.chunk) + " ";
  }
  return s;
}

// Megatron's get_schedule_table and warm-up, worked by hand for 2 stages of 2 chunks and 4
// micro-batches: rank 0 runs (2 - 0 - 1) x 2 + (2 - 1) x 2 = 4 forwards first, rank 1 two.
TEST(PipelineTest, InterleavedOneFOneBFollowsMegatronsTable) {
  EXPECT_EQ(Interleaved(InterleavedActions(0, 2, 2, 4)),
            "F0c0 F1c0 F0c1 F1c1 F2c0 B0c1 F3c0 B1c1 F2c1 B0c0 F3c1 B1c0 B2c1 B3c1 B2c0 B3c0 ");
  EXPECT_EQ(Interleaved(InterleavedActions(1, 2, 2, 4)),
            "F0c0 F1c0 F0c1 B0c1 F1c1 B1c1 F2c0 B0c0 F3c0 B1c0 F2c1 B2c1 F3c1 B3c1 B2c0 B3c0 ");
}

// Each stage holds v chunks of blocks/(p v) blocks; the first stage's activations at its peak
// grow by Megatron's factor 1 + (p - 1)/(p v) over the non-interleaved schedule's (p
// micro-batches of its blocks): here 2 stages, 2 chunks, 8 blocks, 4 micro-batches.
TEST(PipelineTest, InterleavedStagesHoldTheirChunks) {
  const Graph g = Blocks(8);
  RunConfig c = Pipelined(2, 4);
  c.parallelism.pipeline_virtual_stages = 2;
  const PipelineStage s0 = PlanPipelineStage(g, c, 0).value();
  ASSERT_EQ(s0.chunks.size(), 2u);
  EXPECT_EQ(s0.chunks[0].first_block, 0);  // virtual stages 0 and 2: blocks 0-1 and 4-5
  EXPECT_EQ(s0.chunks[1].first_block, 4);
  EXPECT_EQ(s0.graph.blocks, (std::vector<std::string>{"h.0", "h.1", "h.4", "h.5"}));
  const PipelineStage s1 = PlanPipelineStage(g, c, 1).value();
  EXPECT_EQ(s1.graph.ParameterCount(), 4 * 64 * 64 + 16 * 64);  // h.2, h.3, h.6, h.7, head
  const Report inter = EstimateGraph(g, c, {1'000'000, false}).value();
  c.parallelism.pipeline_virtual_stages = 1;
  const Report plain = EstimateGraph(g, c, {1'000'000, false}).value();
  // Stage 0's peak holds 2 x 2 + 2 - 1 = 5 chunk-micro-batches of 2 blocks (10 block
  // activations) against the plain schedule's 2 micro-batches of 4 blocks (8).
  EXPECT_GT(inter.pipeline->per_stage[0].peak_allocated_bytes,
            plain.pipeline->per_stage[0].peak_allocated_bytes);
  c.parallelism.pipeline_virtual_stages = 3;  // 8 blocks do not split into 2 x 3
  EXPECT_FALSE(PlanPipelineStage(g, c, 0).ok());
  c.parallelism.pipeline_virtual_stages = 2;
  c.grad_accum_steps = 3;
  c.batch_size = 24;
  EXPECT_NE(ValidateRunConfig(c).message().find("groups of the 2 stages"), std::string::npos);
}

// Megatron's TransformerBlock keeps each chunk's last received input (set_input_tensor) and its
// retained gradient after the chunk's last backward, into the next step until the chunk's
// first forward replaces it; a plain pipeline lets both go.
TEST(PipelineTest, MegatronsBlocksKeepTheirLastInputAndItsGradient) {
  const Graph g = Blocks(8);
  RunConfig c = Pipelined(2, 4);
  c.runtime = Runtime::kCuda;
  c.parallelism.pipeline_virtual_stages = 2;
  c.parallelism.data = 2;
  c.parallelism.sharding = DataSharding::kMegatronDdp;
  const Report megatron = EstimateGraph(g, c, {1'000'000, false}).value();
  c.parallelism.sharding = DataSharding::kDdp;
  const Report ddp = EstimateGraph(g, c, {1'000'000, false}).value();
  ASSERT_EQ(megatron.pipeline->worst_stage, ddp.pipeline->worst_stage);
  // Stage 0's first chunk starts from the data; every other chunk receives [8, 64] float32.
  const int64_t receiving = megatron.pipeline->worst_stage == 0 ? 1 : 2;
  const auto at_end = [](const Report& r, Category k) { return r.end_of_step[static_cast<int>(k)]; };
  EXPECT_EQ(at_end(megatron, Category::kInputs) - at_end(ddp, Category::kInputs), receiving * 8 * 64 * 4);
}

TEST(PipelineTest, BlocksThatDoNotSplitEvenlyAreRefused) {
  const Graph g = Blocks(4);
  EXPECT_NE(PlanPipelineStage(g, Pipelined(3, 4), 0).status().message().find(
                "config.parallelism.pipeline: 4 blocks do not split evenly into 3 stages"),
            std::string::npos);
  GraphBuilder b;
  const int x = b.Input("x", {2, 2}, DType::kFloat32);
  b.SetLoss(b.Add1("sum", {b.Add1("linear", {x, b.Parameter("w", {2, 2}, DType::kFloat32)})}));
  EXPECT_NE(PlanPipelineStage(b.Finish().value(), Pipelined(2, 2), 0).status().message().find(
                "no repeated blocks"),
            std::string::npos);
}

// The first stage of 1F1B keeps `stages` micro-batches in flight at its peak, GPipe keeps them
// all: more micro-batches raise GPipe's peak and not 1F1B's.
TEST(PipelineTest, OneFOneBBoundsTheMicroBatchesInFlight) {
  const Graph g = Blocks();
  auto peak = [&](PipelineSchedule s, int64_t m) {
    RunConfig c = Pipelined(2, m);
    c.parallelism.pipeline_schedule = s;
    const Report r = EstimateGraph(g, c, {1'000'000, false}).value();
    EXPECT_TRUE(r.pipeline.has_value());
    EXPECT_EQ(r.pipeline->per_stage.size(), 2u);
    EXPECT_EQ(r.pipeline->per_stage[r.pipeline->worst_stage].peak_reserved_bytes,
              r.peak_reserved_bytes);
    return r.pipeline->per_stage[0].peak_allocated_bytes;
  };
  EXPECT_EQ(peak(PipelineSchedule::k1F1B, 4), peak(PipelineSchedule::k1F1B, 8));
  EXPECT_LT(peak(PipelineSchedule::kGPipe, 4), peak(PipelineSchedule::kGPipe, 8));
  EXPECT_LT(peak(PipelineSchedule::k1F1B, 8), peak(PipelineSchedule::kGPipe, 8));
}

TEST(PipelineTest, SettingsThatMakeNoSenseAreRefused) {
  RunConfig c = Pipelined(2, 4);
  EXPECT_TRUE(ValidateRunConfig(c).ok());
  c.parallelism.pipeline = 0;
  EXPECT_NE(ValidateRunConfig(c).message().find("config.parallelism.pipeline: must be in"),
            std::string::npos);
  RunConfig one = PlainTraining();
  one.parallelism.pipeline_keep_outputs = true;
  EXPECT_NE(ValidateRunConfig(one).message().find("config.parallelism.pipeline_keep_outputs"),
            std::string::npos);
  RunConfig fsdp = Pipelined(2, 4);
  fsdp.runtime = Runtime::kCuda;
  fsdp.parallelism.data = 2;
  fsdp.parallelism.sharding = DataSharding::kFsdp2;
  EXPECT_NE(ValidateRunConfig(fsdp).message().find("not modelled yet"), std::string::npos);
  // PlanStep runs one GPU's whole step: a pipeline needs its stage.
  EXPECT_NE(PlanStep(Blocks(), Pipelined(2, 4)).status().message().find(
                "config.parallelism.pipeline"),
            std::string::npos);
}

}  // namespace
}  // namespace memest
