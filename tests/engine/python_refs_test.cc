// What the Python program holds: locals of the model's code (Graph::held), the loop's variable
// for the model's outputs (RunConfig::hold_outputs), and the for-loop optimizer's `denom`.
// Every number is derived by hand under the cpu-1.13 runtime, which counts tensors at their
// own size.
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "engine/models/model.h"
#include "engine/passes/passes.h"
#include "engine/step/python_refs.h"
#include "tests/engine/test_graphs.h"

namespace memest {
namespace {

using enginetest::PhasePeak;

// The step's liveness, counted as the config's runtime counts it (exactly on the CPU).
Liveness Walk(const Graph& g, const RunConfig& c, const CheckpointRegions& regions = {}) {
  const Schedule s = BuildSchedule(g, c, regions, ScheduleOptions{}).value();
  const bool cpu = c.runtime == Runtime::kCpuTorch113;
  return WalkSchedule(s, g, false, cpu ? Accounting::kExact : Accounting::kCachingAllocator).value();
}

RunConfig Cpu(Mode mode = Mode::kTraining) {
  RunConfig c = enginetest::PlainTraining();
  c.runtime = Runtime::kCpuTorch113;
  c.mode = mode;
  return c;
}

// Live bytes right after the first context that `match` accepts has run (at the next context).
int64_t LiveAfter(const Schedule& s, const std::function<bool(const StepContext&)>& match) {
  std::map<int, int64_t> sizes;
  int64_t live = 0;
  bool in = false;
  for (const Event& e : s.events) {
    if (e.kind == EventKind::kContext) {
      if (in) return live;
      in = match(s.contexts[e.buffer]);
    } else if (e.kind == EventKind::kAlloc) {
      sizes[e.buffer] = e.bytes;
      live += e.bytes;
    } else if (e.kind == EventKind::kFree) {
      live -= sizes[e.buffer];
    }
  }
  return live;
}

std::function<bool(const StepContext&)> At(Phase phase, int op, bool recompute = false) {
  return [=](const StepContext& c) {
    return c.phase == phase && c.op == op && c.recompute == recompute;
  };
}

// x [4, 64] -> linear(W1 [64, 64]) a -> relu b -> linear(W2 [64, 64]) c -> relu d; each
// activation 1024 B, each weight 16384 B.
Graph Chain(Mode mode, std::vector<HeldTensor> held = {}) {
  GraphBuilder b;
  const int x = b.Input("x", {4, 64}, DType::kFloat32);
  const int a = b.Add1("linear", {x, b.Parameter("w1", {64, 64}, DType::kFloat32)});
  const int r = b.Add1("relu", {a});
  const int c = b.Add1("linear", {r, b.Parameter("w2", {64, 64}, DType::kFloat32)});
  const int d = b.Add1("relu", {c});
  if (mode == Mode::kTraining) {
    b.BeginLoss();
    b.SetLoss(b.Add1("sum", {d}));
  }
  Graph g = b.Finish().value();
  EXPECT_EQ(g.ops[0].outputs[0], a);
  g.held = std::move(held);
  return g;
}

TEST(PythonRefsTest, ALocalKeepsItsTensorUntilItsOpHasRun) {
  const RunConfig inference = Cpu(Mode::kInference);
  const int a = Chain(Mode::kInference).ops[0].outputs[0];
  auto live_after = [&](const Graph& g, int op) {
    const Schedule s = BuildSchedule(g, inference, {}, ScheduleOptions{}).value();
    return LiveAfter(s, At(Phase::kForward, op));
  };
  const int64_t base = 2 * 16384 + 1024;  // weights and x
  // Without the local, a dies after relu (op 1) and b after linear (op 2): c remains.
  EXPECT_EQ(live_after(Chain(Mode::kInference), 2), base + 1024);
  EXPECT_EQ(Walk(Chain(Mode::kInference), inference).peak.allocated_bytes, base + 2 * 1024);
  // Held until op 3: a is there while op 2 makes c from b, after it, and while op 3 runs.
  const Graph held = Chain(Mode::kInference, {{a, 3}});
  EXPECT_EQ(live_after(held, 2), base + 2 * 1024);
  EXPECT_EQ(Walk(held, inference).peak.allocated_bytes, base + 3 * 1024);
  // A reference that dies at the tensor's last use changes nothing.
  EXPECT_EQ(Walk(Chain(Mode::kInference, {{a, 1}}), inference).peak.allocated_bytes,
            Walk(Chain(Mode::kInference), inference).peak.allocated_bytes);
}

TEST(PythonRefsTest, ModelOutputsAreTheLossInputsOrTheLastOpsOrNamed) {
  const Graph train = Chain(Mode::kTraining);
  const int d = train.ops[3].outputs[0];
  EXPECT_EQ(ModelOutputs(train, Mode::kTraining), std::vector<int>{d});
  const int loss = train.ops[4].outputs[0];
  EXPECT_EQ(ModelOutputs(train, Mode::kInference), std::vector<int>{loss});
  Graph named = train;
  named.outputs = {train.ops[2].outputs[0], d, d};
  EXPECT_EQ(ModelOutputs(named, Mode::kTraining), (std::vector<int>{named.outputs[0], d}));
  // The cache comes after them, each tensor once, when the outputs hold it.
  Graph cached = train;
  const int b = train.ops[1].outputs[0];
  cached.cache = {b, d, b};
  EXPECT_EQ(ModelOutputs(cached, Mode::kTraining), std::vector<int>{d});
  EXPECT_EQ(ModelOutputs(cached, Mode::kTraining, true), (std::vector<int>{d, b}));
}

TEST(PythonRefsTest, OutputsHoldTheCacheUnlessBlocksAreCheckpointed) {
  RunConfig c;
  EXPECT_TRUE(OutputsHoldCache(c));
  c.checkpoint.policy = CheckpointPolicy::kAttentionCore;  // selective: the model's flag is off
  EXPECT_TRUE(OutputsHoldCache(c));
  for (CheckpointPolicy p : {CheckpointPolicy::kEveryKBlocks, CheckpointPolicy::kSqrtBlocks}) {
    c.checkpoint.policy = p;  // not what gradient_checkpointing_enable() does
    EXPECT_TRUE(OutputsHoldCache(c));
  }
  c.checkpoint.policy = CheckpointPolicy::kEveryBlock;
  EXPECT_FALSE(OutputsHoldCache(c));
  c.checkpoint.policy = CheckpointPolicy::kNone;
  c.mode = Mode::kInference;  // the prompt's cache, which generation goes on from
  EXPECT_TRUE(OutputsHoldCache(c));
}

// x [4, 64] -> linear(W1 [64, 64]) -> relu -> linear(W2 [256, 64]) logits [4, 256] (4096 B) ->
// cross_entropy(y [4] int64). The loss keeps its log-softmax, not the logits.
Graph Classifier() {
  GraphBuilder b;
  const int x = b.Input("x", {4, 64}, DType::kFloat32);
  const int y = b.Target("y", {4}, DType::kInt64);
  const int h = b.Add1("relu", {b.Add1("linear", {x, b.Parameter("w1", {64, 64}, DType::kFloat32)})});
  const int logits = b.Add1("linear", {h, b.Parameter("w2", {256, 64}, DType::kFloat32)});
  b.BeginLoss();
  b.SetLoss(b.Add1("cross_entropy", {logits, y}));
  return b.Finish().value();
}

TEST(PythonRefsTest, AHeldOutputLivesThroughBackwardAndIntoTheNextForward) {
  constexpr int64_t kLogits = 4 * 256 * 4;
  RunConfig let_go = Cpu();
  RunConfig hold = Cpu();
  hold.hold_outputs = true;
  for (StepKind step : {StepKind::kSteadyState, StepKind::kFirstStep}) {
    let_go.step = hold.step = step;
    const Liveness a = Walk(Classifier(), let_go);
    const Liveness b = Walk(Classifier(), hold);
    // The previous step's logits live from the start of a steady step until its loss exists.
    const int64_t carried = step == StepKind::kSteadyState ? kLogits : 0;
    for (Phase p : {Phase::kData, Phase::kForward, Phase::kLoss}) {
      EXPECT_EQ(PhasePeak(b, p).allocated_bytes - PhasePeak(a, p).allocated_bytes, carried)
          << PhaseName(p);
    }
    // This step's logits live through backward and the optimizer step.
    for (Phase p : {Phase::kBackward, Phase::kOptimizerStep}) {
      EXPECT_EQ(PhasePeak(b, p).allocated_bytes - PhasePeak(a, p).allocated_bytes, kLogits)
          << PhaseName(p);
    }
  }
}

TEST(PythonRefsTest, AccumulationHoldsTheFirstMicroBatchsOutputsIntoTheSecondsForward) {
  constexpr int64_t kLogits = 4 * 256 * 4;
  RunConfig let_go = Cpu();
  let_go.step = StepKind::kFirstStep;
  let_go.batch_size = 8;
  let_go.grad_accum_steps = 2;
  RunConfig hold = let_go;
  hold.hold_outputs = true;
  const Liveness a = Walk(Classifier(), let_go);
  const Liveness b = Walk(Classifier(), hold);
  EXPECT_EQ(PhasePeak(b, Phase::kForward).allocated_bytes -
                PhasePeak(a, Phase::kForward).allocated_bytes,
            kLogits);
  const Schedule s = BuildSchedule(Classifier(), hold, {}, ScheduleOptions{}).value();
  const Schedule s0 = BuildSchedule(Classifier(), let_go, {}, ScheduleOptions{}).value();
  auto second_forward = [](const StepContext& c) {
    return c.micro_batch == 1 && c.phase == Phase::kForward && c.op == 0;
  };
  EXPECT_EQ(LiveAfter(s, second_forward) - LiveAfter(s0, second_forward), kLogits);
}

TEST(PythonRefsTest, ARecomputedRegionsLocalsAreHeldAgain) {
  // Chain in training, ops 0-3 checkpointed; a (op 0) held until op 3.
  const RunConfig c = Cpu();
  const int a = Chain(Mode::kTraining).ops[0].outputs[0];
  const CheckpointRegions regions = {{0, 3}};
  auto after_recomputed = [&](const Graph& g, int op) {
    const Schedule s = BuildSchedule(g, c, regions, ScheduleOptions{}).value();
    return LiveAfter(s, At(Phase::kBackward, op, true));
  };
  const Graph held = Chain(Mode::kTraining, {{a, 3}});
  EXPECT_EQ(after_recomputed(held, 2) - after_recomputed(Chain(Mode::kTraining), 2), 1024);
  EXPECT_EQ(after_recomputed(held, 3), after_recomputed(Chain(Mode::kTraining), 3));
}

// x [4, 64] -> linear(W1 [64, 64]) -> linear(W2 [64, 64]) -> sum: two parameters of 16384 B.
TEST(PythonRefsTest, ForLoopAdamKeepsThePreviousDenomWhileTheNextIsMade) {
  GraphBuilder b;
  const int x = b.Input("x", {4, 64}, DType::kFloat32);
  const int h = b.Add1("linear", {x, b.Parameter("w1", {64, 64}, DType::kFloat32)});
  const int y = b.Add1("linear", {h, b.Parameter("w2", {64, 64}, DType::kFloat32)});
  b.BeginLoss();
  b.SetLoss(b.Add1("sum", {y}));
  const Graph g = b.Finish().value();
  constexpr int64_t P = 16384;
  for (OptimizerKind kind : {OptimizerKind::kAdam, OptimizerKind::kAdamW}) {
    for (Runtime runtime : {Runtime::kCpuTorch113, Runtime::kCuda}) {
      RunConfig c = Cpu();
      c.runtime = runtime;
      c.optimizer.kind = kind;
      c.optimizer.impl = OptimizerImpl::kForLoop;
      // Parameters, grads, exp_avg and exp_avg_sq, the step counters (CPU tensors on 1.13);
      // then, at w2, w1's denom with w2's sqrt and quotient.
      const int64_t counters = runtime == Runtime::kCpuTorch113 ? 2 * 4 : 0;
      const int64_t step = PhasePeak(Walk(g, c), Phase::kOptimizerStep).allocated_bytes;
      if (runtime == Runtime::kCpuTorch113) {
        EXPECT_EQ(step, 2 * P + 2 * P + 4 * P + counters + 3 * P);
      } else {  // allocator blocks of 16384 B round to themselves; counters are host memory
        EXPECT_EQ(step, 11 * P);
      }
    }
  }
}

TensorSpec Leaf(std::string name, Shape shape, TensorRole role) {
  TensorSpec t;
  t.name = std::move(name);
  t.shape = std::move(shape);
  t.role = role;
  return t;
}

// x -> linear(w) h -> relu r -> relu s, as a model file.
OpGraphSpec ChainSpec() {
  OpGraphSpec g;
  g.tensors = {Leaf("x", {4, 64}, TensorRole::kInput), Leaf("w", {64, 64}, TensorRole::kParameter)};
  g.ops = {OpSpec{"linear", {"x", "w"}, {"h"}, {}, ""}, OpSpec{"relu", {"h"}, {"r"}, {}, ""},
           OpSpec{"relu", {"r"}, {"s"}, {}, ""}};
  return g;
}

TEST(PythonRefsTest, ModelFilesNameHeldTensorsAndOutputs) {
  const BuildContext inference = enginetest::MakeContext(4, Mode::kInference);
  OpGraphSpec spec = ChainSpec();
  spec.held = {{"h", 2}};
  spec.outputs = {"r", "s"};
  const Graph g = BuildOpGraph(spec, inference).value();
  ASSERT_EQ(g.held.size(), 1u);
  EXPECT_EQ(g.held[0].tensor, g.ops[0].outputs[0]);
  EXPECT_EQ(g.held[0].until_op, 2);
  EXPECT_EQ(g.outputs, (std::vector<int>{g.ops[1].outputs[0], g.ops[2].outputs[0]}));

  auto error = [&](const OpGraphSpec& s) { return BuildOpGraph(s, inference).status().message(); };
  OpGraphSpec bad = ChainSpec();
  bad.held = {{"h", 2}, {"nope", 1}};
  EXPECT_EQ(error(bad), "model.held[1].tensor: 'nope' is not a tensor of the graph");
  bad.held = {{"h", 3}};
  EXPECT_EQ(error(bad), "model.held[0].until_op: 3 is not an op of the graph's 3 ops");
  bad.held = {{"r", 0}};
  EXPECT_EQ(error(bad), "model.held[0].until_op: 0 runs before op 1, which makes 'r'");
  bad.held = {{"x", 0}};  // a leaf: held anyway, accepted
  EXPECT_TRUE(BuildOpGraph(bad, inference).ok());
  bad.held.clear();
  bad.outputs = {"s", "y"};
  EXPECT_EQ(error(bad), "model.outputs[1]: 'y' is not a tensor of the graph");
}

TEST(PythonRefsTest, AutocastKeepsHeldTensorsOnTheirOps) {
  // Under bf16 autocast linear's inputs are cast first: the held op index moves with its op.
  OpGraphSpec spec = ChainSpec();
  spec.ops.push_back(OpSpec{"linear", {"s", "w"}, {"t"}, {}, ""});
  spec.held = {{"h", 3}};
  spec.outputs = {"t"};
  const Graph g = BuildOpGraph(spec, enginetest::MakeContext(4, Mode::kInference)).value();
  const Graph cast = ApplyAutocast(g, DType::kBFloat16).value();
  ASSERT_EQ(cast.held.size(), 1u);
  EXPECT_EQ(cast.ops[cast.held[0].until_op].kind, "linear");
  EXPECT_EQ(cast.held[0].until_op, static_cast<int>(cast.ops.size()) - 1);
  EXPECT_EQ(cast.ops[cast.tensors[cast.held[0].tensor].producer].kind, "linear");
  ASSERT_EQ(cast.outputs.size(), 1u);
  EXPECT_EQ(cast.outputs[0], cast.ops.back().outputs[0]);
}

}  // namespace
}  // namespace memest
