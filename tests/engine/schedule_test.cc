// One training step of small models, with every number derived by hand.
#include <gtest/gtest.h>

#include "engine/estimator.h"
#include "engine/passes/checkpoint.h"
#include "engine/step/allocator.h"
#include "tests/engine/test_graphs.h"

namespace memest {
namespace {

using enginetest::Cat;
using enginetest::PhasePeak;
using enginetest::PlainTraining;
using enginetest::Walk;

// x[4,256] -> linear(512) -> relu -> linear(10) -> cross_entropy(target[4] int64).
// Sizes (each rounded up to 512 B by the allocator):
//   W1 [512,256] 524288, b1 [512] 2048, W2 [10,512] 20480, b2 [10] 40->512: params 547328
//   x 4096, target 32->512: inputs 4608
//   h = a = [4,512] 8192; logits [4,10] 160->512; loss 512; log_softmax 160->512;
//   total_weight 4->512
Graph Mlp() {
  GraphBuilder b;
  const int x = b.Input("x", {4, 256}, DType::kFloat32);
  const int y = b.Target("y", {4}, DType::kInt64);
  int h, logits;
  {
    ScopeGuard s(b, "fc1");
    h = b.Add1("linear", {x, b.Parameter("weight", {512, 256}, DType::kFloat32),
                          b.Parameter("bias", {512}, DType::kFloat32)});
  }
  const int a = b.Add1("relu", {h});
  {
    ScopeGuard s(b, "fc2");
    logits = b.Add1("linear", {a, b.Parameter("weight", {10, 512}, DType::kFloat32),
                               b.Parameter("bias", {10}, DType::kFloat32)});
  }
  b.BeginLoss();
  b.SetLoss(b.Add1("cross_entropy", {logits, y}));
  return b.Finish().value();
}

constexpr int64_t kParams = 547328;
constexpr int64_t kInputs = 4608;

TEST(ScheduleTest, MlpStepByHand) {
  const Liveness l = Walk(Mlp(), PlainTraining());
  // data: params + inputs.
  EXPECT_EQ(PhasePeak(l, Phase::kData).allocated_bytes, kParams + kInputs);
  // forward: relu allocates a while h is still alive (h dies after relu: nothing saved it).
  EXPECT_EQ(PhasePeak(l, Phase::kForward).allocated_bytes, kParams + kInputs + 8192 + 8192);
  EXPECT_EQ(PhasePeak(l, Phase::kForward).op, "relu");
  // loss: a (kept by relu and fc2) + logits + loss + log_softmax + nll_loss's total_weight.
  EXPECT_EQ(PhasePeak(l, Phase::kLoss).allocated_bytes, kParams + kInputs + 8192 + 4 * 512);
  // backward peaks in fc1: dW1 and db1 (bound for .grad), dW2 and db2 (already .grad), the
  // incoming grad of h, the loss the loop still holds and the seed gradient loss.backward()
  // holds until it returns; a and its gradient are gone.
  const PeakPoint& bwd = PhasePeak(l, Phase::kBackward);
  EXPECT_EQ(bwd.allocated_bytes, 2 * kParams + kInputs + 8192 + 2 * 512);
  EXPECT_EQ(bwd.op, "linear");
  EXPECT_EQ(bwd.scope, "fc1");
  EXPECT_EQ(Cat(bwd, Category::kGradients), kParams);
  EXPECT_EQ(Cat(bwd, Category::kActivations), 0);
  EXPECT_EQ(Cat(bwd, Category::kTemporaries), 8192 + 2 * 512);
  EXPECT_EQ(l.peak.allocated_bytes, bwd.allocated_bytes);
  // step (SGD, no state): params and grads.
  EXPECT_EQ(PhasePeak(l, Phase::kOptimizerStep).allocated_bytes, 2 * kParams);
}

TEST(ScheduleTest, ZeroGradKeepsOrDropsGrads) {
  RunConfig keep = PlainTraining();
  keep.zero_grad_set_to_none = false;
  EXPECT_EQ(PhasePeak(Walk(Mlp(), keep), Phase::kData).allocated_bytes, 2 * kParams + kInputs);
  EXPECT_EQ(PhasePeak(Walk(Mlp(), PlainTraining()), Phase::kData).allocated_bytes, kParams + kInputs);
}

// Adam keeps exp_avg and exp_avg_sq (2 x params). On the first step they are created inside
// the step. foreach: one _foreach_sqrt list (1 x params) of scratch; for-loop: the sqrt and
// the quotient of one parameter at a time (2 x the largest, W1: 524288).
TEST(ScheduleTest, AdamFirstStepForeachVersusForLoop) {
  RunConfig c = PlainTraining();
  c.optimizer.kind = OptimizerKind::kAdam;
  c.step = StepKind::kFirstStep;
  c.optimizer.impl = OptimizerImpl::kForeach;
  EXPECT_EQ(PhasePeak(Walk(Mlp(), c), Phase::kOptimizerStep).allocated_bytes,
            2 * kParams + 2 * kParams + kParams);
  c.optimizer.impl = OptimizerImpl::kForLoop;
  EXPECT_EQ(PhasePeak(Walk(Mlp(), c), Phase::kOptimizerStep).allocated_bytes,
            2 * kParams + 2 * kParams + 2 * 524288);
  c.optimizer.impl = OptimizerImpl::kFused;  // no scratch; a 0-dim float32 step per parameter
  EXPECT_EQ(PhasePeak(Walk(Mlp(), c), Phase::kOptimizerStep).allocated_bytes,
            2 * kParams + 2 * kParams + 4 * 512);
}

TEST(ScheduleTest, SteadyStateHasOptimizerStateFromTheStart) {
  RunConfig c = PlainTraining();
  c.optimizer.kind = OptimizerKind::kAdamW;
  const Liveness l = Walk(Mlp(), c);
  EXPECT_EQ(Cat(PhasePeak(l, Phase::kData), Category::kOptimizerState), 2 * kParams);
}

TEST(ScheduleTest, MomentumStateIsOneCopy) {
  RunConfig c = PlainTraining();
  c.optimizer.kind = OptimizerKind::kSgdMomentum;
  EXPECT_EQ(Cat(PhasePeak(Walk(Mlp(), c), Phase::kData), Category::kOptimizerState), kParams);
}

TEST(ScheduleTest, InferenceKeepsNothingForBackward) {
  RunConfig c = PlainTraining();
  c.mode = Mode::kInference;
  const Liveness l = Walk(Mlp(), c);
  EXPECT_EQ(l.phases.size(), 3u);  // data, forward, loss
  for (const PeakPoint& p : l.phases) EXPECT_EQ(Cat(p, Category::kActivations), 0);
  EXPECT_EQ(l.peak.allocated_bytes, kParams + kInputs + 8192 + 8192);  // relu, as in training
}

// A stack of L blocks (linear -> gelu) on [B, D]: without checkpointing autograd keeps, per
// block, the linear's input and the gelu's input; checkpointing each block keeps only the
// block inputs, and backward recomputes one block at a time.
Graph Stack(int blocks, int64_t batch, int64_t dim) {
  GraphBuilder b;
  int x = b.Input("x", {batch, dim}, DType::kFloat32);
  for (int i = 0; i < blocks; ++i) {
    ScopeGuard s(b, "blocks." + std::to_string(i));
    b.MarkBlock();
    x = b.Add1("linear", {x, b.Parameter("weight", {dim, dim}, DType::kFloat32)});
    x = b.Add1("gelu", {x});
  }
  b.BeginLoss();
  b.SetLoss(b.Add1("sum", {x}));
  return b.Finish().value();
}

TEST(ScheduleTest, CheckpointEveryBlockKeepsOnlyBlockInputs) {
  // Activations dominate: one [1024, 256] float32 activation is 1 MiB, a block's weight 256 KiB.
  const int L = 16;
  const int64_t act = 1024 * 256 * 4;
  const Graph g = Stack(L, 1024, 256);
  RunConfig c = PlainTraining();
  // No checkpointing: at the end of forward, blocks 1..15 keep their linear's input and every
  // block its gelu input (block 0's linear input is the data batch): 31 activations.
  const Liveness none = Walk(g, c);
  EXPECT_EQ(Cat(PhasePeak(none, Phase::kLoss), Category::kActivations), (2 * L - 1) * act);
  c.checkpoint.policy = CheckpointPolicy::kEveryBlock;
  const CheckpointRegions regions = PlanCheckpoints(g, c.checkpoint).value();
  ASSERT_EQ(regions.size(), static_cast<size_t>(L));
  // Checkpointed: the inputs of blocks 1..15 only.
  const Liveness every = Walk(g, c, regions);
  EXPECT_EQ(Cat(PhasePeak(every, Phase::kLoss), Category::kActivations), (L - 1) * act);
  EXPECT_LT(every.peak.allocated_bytes, none.peak.allocated_bytes);
  EXPECT_TRUE(PhasePeak(every, Phase::kBackward).recompute);
}

// Residual blocks x + gelu(linear(x)); the add that ends each block saves nothing.
Graph ResidualStack(int blocks, int64_t batch, int64_t dim) {
  GraphBuilder b;
  int x = b.Add1("mul", {b.Input("x", {batch, dim}, DType::kFloat32),
                         b.Parameter("scale", {dim}, DType::kFloat32)});
  for (int i = 0; i < blocks; ++i) {
    ScopeGuard s(b, "blocks." + std::to_string(i));
    b.MarkBlock();
    const int h = b.Add1("gelu", {b.Add1("linear", {x, b.Parameter("weight", {dim, dim}, DType::kFloat32)})});
    x = b.Add1("add", {x, h});
  }
  b.BeginLoss();
  b.SetLoss(b.Add1("sum", {x}));
  return b.Finish().value();
}

// use_reentrant=False: autograd saves nothing of the region (its inputs stay alive in the
// recomputation's closure), no output or gradient is held through the region's backward, and
// on PyTorch 2.x (CUDA) the recomputation stops after the last op that saves something.
TEST(ScheduleTest, NonReentrantCheckpointKeepsLessAndStopsEarlyOnCuda) {
  const int L = 6;
  const Graph g = ResidualStack(L, 512, 256);
  RunConfig c = PlainTraining();
  c.checkpoint.policy = CheckpointPolicy::kEveryBlock;
  const CheckpointRegions regions = PlanCheckpoints(g, c.checkpoint).value();
  const Schedule reentrant = BuildSchedule(g, c, regions, {}).value();
  RunConfig nr = c;
  nr.checkpoint.non_reentrant = true;
  const Schedule non_reentrant = BuildSchedule(g, nr, regions, {}).value();
  EXPECT_EQ(reentrant.recomputed_ops, 3 * L);      // linear, gelu, add
  EXPECT_EQ(non_reentrant.recomputed_ops, 2 * L);  // the add is not recomputed
  EXPECT_LT(non_reentrant.saved_for_backward_bytes, reentrant.saved_for_backward_bytes);
  EXPECT_LE(Walk(g, nr, regions).peak.allocated_bytes, Walk(g, c, regions).peak.allocated_bytes);

  nr.runtime = Runtime::kCpuTorch113;  // 1.13 recomputes the whole function
  EXPECT_EQ(BuildSchedule(g, nr, regions, {}).value().recomputed_ops, 3 * L);
}

TEST(ScheduleTest, SqrtCheckpointingGroupsBlocks) {
  const Graph g = Stack(16, 64, 256);
  CheckpointConfig cc;
  cc.policy = CheckpointPolicy::kSqrtBlocks;
  EXPECT_EQ(PlanCheckpoints(g, cc).value().size(), 4u);  // 16 blocks in 4 segments of 4
  cc.policy = CheckpointPolicy::kEveryKBlocks;
  cc.every_k = 5;
  EXPECT_EQ(PlanCheckpoints(g, cc).value().size(), 4u);  // 5 + 5 + 5 + 1
  cc.policy = CheckpointPolicy::kScopes;
  cc.scopes = {"blocks.3", "blocks.30"};
  const auto bad = PlanCheckpoints(g, cc);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("config.checkpoint.scopes[1]"), std::string::npos);
}

// Memory of sqrt(L) checkpointing grows like sqrt(L): between no checkpointing and one block.
TEST(ScheduleTest, CheckpointPoliciesOrderAsTheirMemory) {
  const Graph g = Stack(64, 4096, 256);  // 4 MiB activations, 256 KiB weights
  RunConfig c = PlainTraining();
  auto peak = [&](CheckpointPolicy p) {
    c.checkpoint.policy = p;
    return Walk(g, c, PlanCheckpoints(g, c.checkpoint).value()).peak.allocated_bytes;
  };
  const int64_t none = peak(CheckpointPolicy::kNone);
  const int64_t sqrt = peak(CheckpointPolicy::kSqrtBlocks);
  const int64_t every = peak(CheckpointPolicy::kEveryBlock);
  EXPECT_LT(every, none);
  EXPECT_LT(sqrt, none);
  const int64_t act = 4096 * 256 * 4;
  // No checkpointing keeps 127 activations at the end of forward; every block keeps 63 block
  // inputs plus one recomputed block; sqrt(64) = 8: 7 segment inputs plus one segment of 8
  // blocks recomputed (16 activations).
  EXPECT_GT(none - every, 60 * act);
  EXPECT_GT(none - sqrt, 100 * act);
  EXPECT_LT(sqrt, every);
}

// Gradient accumulation: micro-batch 1 runs with the .grad tensors of micro-batch 0 alive and
// adds into them, exactly as a step that keeps zeroed grads (set_to_none=False).
TEST(ScheduleTest, AccumulationPeaksLikeASmallerBatchWithGradsAlive) {
  RunConfig accum = PlainTraining();
  accum.batch_size = 8;
  accum.grad_accum_steps = 2;
  RunConfig small = PlainTraining();
  small.batch_size = 4;
  small.zero_grad_set_to_none = false;
  const Graph g = Stack(4, 4, 512);  // built for a micro-batch of 4
  const Liveness a = Walk(g, accum);
  const Liveness s = Walk(g, small);
  EXPECT_EQ(a.peak.allocated_bytes, s.peak.allocated_bytes);
  EXPECT_EQ(a.peak.micro_batch, 1);
}

TEST(ScheduleTest, AutocastKeepsHalfCopiesOfWeights) {
  // linear under bf16 autocast: the weight's bf16 copy is cached for the forward and kept by
  // the linear for backward; x's bf16 copy is kept too.
  GraphBuilder b;
  const int x = b.Input("x", {64, 256}, DType::kFloat32);
  int y;
  {
    ScopeGuard s(b, "fc");
    y = b.Add1("linear", {x, b.Parameter("weight", {256, 256}, DType::kFloat32)});
  }
  b.BeginLoss();
  b.SetLoss(b.Add1("sum", {y}));
  RunConfig c = PlainTraining();
  c.precision = Precision::kBf16Amp;
  StatusOr<Report> r = EstimateGraph(b.Finish().value(), c, {1'000'000, false});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const PeakPoint* loss = nullptr;
  for (const PeakPoint& p : r->phases) {
    if (p.phase == Phase::kLoss) loss = &p;
  }
  ASSERT_NE(loss, nullptr);
  EXPECT_EQ(Cat(*loss, Category::kMasterAndCasts), 256 * 256 * 2);  // bf16 weight copy
  EXPECT_EQ(Cat(*loss, Category::kActivations), 64 * 256 * 2);      // bf16 copy of x
}

TEST(ScheduleTest, ExpandableSegmentsReserveNoMoreThanSegments) {
  const Graph g = Stack(8, 512, 1024);
  RunConfig c = PlainTraining();
  const Liveness plain = Walk(g, c);
  c.expandable_segments = true;
  const Liveness exp = Walk(g, c);
  EXPECT_EQ(plain.peak.allocated_bytes, exp.peak.allocated_bytes);
  EXPECT_LE(exp.peak_reserved, plain.peak_reserved);
}

}  // namespace
}  // namespace memest

namespace memest {
namespace {

TEST(ScheduleTest, DropoutInEvalModeAllocatesNothing) {
  GraphBuilder b;
  const int x = b.Input("x", {1024, 256}, DType::kFloat32);
  const int h = b.Add1("linear", {x, b.Parameter("w", {256, 256}, DType::kFloat32)});
  b.Add1("dropout", {h}, {{"p", 0.5}});
  RunConfig c = enginetest::PlainTraining();
  c.mode = Mode::kInference;
  const Liveness l = enginetest::Walk(b.Finish().value(), c);
  // params 256 KiB + x 1 MiB + h 1 MiB; dropout neither copies h nor makes a mask.
  EXPECT_EQ(l.peak.allocated_bytes, 256 * 1024 + 2 * 1024 * 1024);
}

}  // namespace
}  // namespace memest

namespace memest {
namespace {

// cross_entropy under bf16 autocast: log_softmax(x, dim, x.dtype) keeps bf16 log-probs and
// nll_loss (float32 list) keeps a float32 copy: 2 + 4 bytes per logit, against 4 in fp32.
TEST(ScheduleTest, CrossEntropyUnderAutocastKeepsHalfAndFloatLogProbs) {
  auto saved = [](Precision p) {
    GraphBuilder b;
    if (IsAutocast(p)) b.EnableAutocast(ComputeDType(p));
    const int x = b.Input("x", {512, 64}, DType::kFloat32);
    const int y = b.Target("y", {512}, DType::kInt64);
    const int logits = b.Add1("linear", {x, b.Parameter("w", {1000, 64}, DType::kFloat32)});
    b.BeginLoss();
    {
      ScopeGuard s(b, "loss");
      b.SetLoss(b.Add1("cross_entropy", {logits, y}));
    }
    RunConfig c = enginetest::PlainTraining();
    c.precision = p;
    return enginetest::SavedBytes(b.Finish().value(), c, "loss");
  };
  // Plus nll_loss's 0-dim float32 total_weight in each case.
  EXPECT_EQ(saved(Precision::kFp32), 512 * 1000 * 4 + 4);
  EXPECT_EQ(saved(Precision::kBf16Amp), 512 * 1000 * (2 + 4) + 4);
  EXPECT_EQ(saved(Precision::kFp16Amp), 512 * 1000 * (2 + 4) + 4);
}

// Its backward under autocast is three nodes: NllLossBackward makes a float32 gradient and lets
// go of the float32 copy it kept, ToCopyBackward casts that gradient to bfloat16, and
// LogSoftmaxBackward makes the logits' gradient. At most one float32 gradient is then added to
// what the loss left (measured on an H200 under PyTorch 2.11 for GPT-2 and Llama: memest had
// held the copy through all three and said 11% and 9% more than PyTorch; now -0.05% and -0.4%).
TEST(ScheduleTest, CrossEntropyUnderAutocastLetsGoOfItsFloatCopyFirst) {
  GraphBuilder b;
  b.EnableAutocast(DType::kBFloat16);
  const int x = b.Input("x", {512, 64}, DType::kFloat32);
  const int y = b.Target("y", {512}, DType::kInt64);
  const int logits = b.Add1("linear", {x, b.Parameter("w", {1000, 64}, DType::kFloat32)});
  b.BeginLoss();
  b.SetLoss(b.Add1("cross_entropy", {logits, y}));
  RunConfig c = PlainTraining();
  c.precision = Precision::kBf16Amp;
  const Liveness l = Walk(b.Finish().value(), c);
  const int64_t held = 1000 * 64 * 4           // w
                       + 512 * 64 * 4 + 4096   // the batch: x, y
                       + 512 * 64 * 2          // x in bfloat16, kept by linear for w's gradient
                       + 512 * 1000 * (2 + 4)  // the log-probabilities, bfloat16 and float32
                       + 512 + 512;            // total_weight and the loss (0-dim, a block each)
  // The loss's gradient and nll_loss's [512, 1000] float32 gradient; holding the float32 copy on
  // through the cast and the logits' gradient would add 2 x 512 x 1000 x 2 bytes.
  EXPECT_EQ(PhasePeak(l, Phase::kBackward).allocated_bytes, held + 512 + 512 * 1000 * 4);
}

}  // namespace
}  // namespace memest

namespace memest {
namespace {

// A dead branch inside a checkpointed region (an op whose output needs grad but never reaches
// the loss): the recomputed graph dies when the region's backward returns, so nothing of it is
// alive while the ops before the region run their backward.
TEST(ScheduleTest, RecomputedDeadBranchDiesWithTheRegion) {
  auto pre_backward_peak = [](bool dead_branch) {
    GraphBuilder b;
    const int x = b.Input("x", {4096, 1024}, DType::kFloat32);
    int h0, o;
    {
      ScopeGuard s(b, "pre");
      h0 = b.Add1("gelu", {b.Add1("linear", {x, b.Parameter("w0", {1024, 1024}, DType::kFloat32)})});
    }
    {
      ScopeGuard s(b, "blk");
      const int h = b.Add1("linear", {h0, b.Parameter("w1", {1024, 1024}, DType::kFloat32)});
      if (dead_branch) b.Add1("sigmoid", {h});
      o = b.Add1("linear", {h, b.Parameter("w2", {1024, 1024}, DType::kFloat32)});
    }
    b.BeginLoss();
    b.SetLoss(b.Add1("sum", {o}));
    const Graph g = b.Finish().value();
    RunConfig c = enginetest::PlainTraining();
    c.checkpoint.policy = CheckpointPolicy::kScopes;
    c.checkpoint.scopes = {"blk"};
    const Schedule s = BuildSchedule(g, c, PlanCheckpoints(g, c.checkpoint).value(), {}).value();
    CachingAllocatorModel a;
    std::vector<int> h(s.num_buffers, -1);
    int ctx = -1;
    int64_t peak = 0;
    for (const Event& e : s.events) {
      if (e.kind == EventKind::kContext) ctx = e.buffer;
      if (e.kind == EventKind::kAlloc) h[e.buffer] = a.Malloc(e.bytes);
      if (e.kind == EventKind::kFree && h[e.buffer] >= 0) {
        a.Free(h[e.buffer]);
        h[e.buffer] = -1;
      }
      const StepContext& sc = s.contexts[ctx];
      if (sc.phase == Phase::kBackward && sc.op >= 0 && g.ops[sc.op].scope == "pre") {
        peak = std::max(peak, a.allocated());
      }
    }
    return peak;
  };
  EXPECT_EQ(pre_backward_peak(true), pre_backward_peak(false));
}

// Parameters joined by cat: each gets a slice of cat's gradient, a view of its own, which
// AccumulateGrad steals: both .grad tensors share one storage, counted once (as PyTorch 1.13
// shows: a.grad and b.grad share the storage of the cat gradient).
TEST(ScheduleTest, CatOfParametersSharesOneGradientStorage) {
  GraphBuilder b;
  const int a = b.Parameter("a", {512, 1024}, DType::kFloat32);
  const int c = b.Parameter("b", {512, 1024}, DType::kFloat32);
  const int w = b.Add1("cat", {a, c}, {{"dim", int64_t{0}}});
  const int x = b.Input("x", {1, 1024}, DType::kFloat32);
  b.BeginLoss();
  b.SetLoss(b.Add1("sum", {b.Add1("linear", {x, w})}));
  const Liveness l = enginetest::Walk(b.Finish().value(), enginetest::PlainTraining());
  EXPECT_EQ(Cat(PhasePeak(l, Phase::kOptimizerStep), Category::kGradients), 1024 * 1024 * 4);
}

// Under autocast sum accumulates a half tensor into float32 (no copy), and backward casts the
// expanded gradient back: a fresh half-precision gradient as large as the input.
TEST(ScheduleTest, SumUnderAutocastIsFloat32) {
  GraphBuilder b;
  b.EnableAutocast(DType::kBFloat16);
  const int x = b.Input("x", {256, 1024}, DType::kFloat32);
  const int y = b.Add1("linear", {x, b.Parameter("w", {1024, 1024}, DType::kFloat32)});
  b.BeginLoss();
  const int loss = b.Add1("sum", {y});
  b.SetLoss(loss);
  EXPECT_EQ(b.tensor(loss).dtype, DType::kFloat32);
  EXPECT_EQ(b.tensor(y).dtype, DType::kBFloat16);
}

}  // namespace
}  // namespace memest

namespace memest {
namespace {

RunConfig Cpu113() {
  RunConfig c = enginetest::PlainTraining();
  c.runtime = Runtime::kCpuTorch113;
  return c;
}

// PyTorch 1.13 on the CPU: dropout keeps a float noise tensor, not a bool mask; mean over a dim
// keeps its input.
TEST(RuntimeTest, CpuDropoutAndMeanKeepWhat113Keeps) {
  auto saved = [](const RunConfig& c, const char* kind, Attrs attrs) {
    GraphBuilder b;
    const int x = b.Add1("mul", {b.Parameter("p", {256, 256}, DType::kFloat32)}, {{"scalar", 1.0}});
    int y;
    {
      ScopeGuard s(b, "op");
      y = b.Add1(kind, {x}, std::move(attrs));
    }
    b.BeginLoss();
    b.SetLoss(b.Add1("sum", {y}));
    return enginetest::SavedBytes(b.Finish().value(), c, "op");
  };
  const int64_t act = 256 * 256 * 4;
  EXPECT_EQ(saved(enginetest::PlainTraining(), "dropout", {{"p", 0.1}}), act / 4);  // bool
  EXPECT_EQ(saved(Cpu113(), "dropout", {{"p", 0.1}}), act);                        // float noise
  const Attrs mean{{"dim", std::vector<int64_t>{-1}}};
  EXPECT_EQ(saved(enginetest::PlainTraining(), "mean", mean), 0);
  EXPECT_EQ(saved(Cpu113(), "mean", mean), act);
}

// Counting is exact on the CPU (no 512 B rounding, no workspace), and the report's saved bytes
// include the data batch that autograd keeps.
TEST(RuntimeTest, CpuCountsTensorsAtTheirOwnSize) {
  GraphBuilder b;
  const int x = b.Input("x", {3, 5}, DType::kFloat32);  // 60 B
  const int y = b.Add1("linear", {x, b.Parameter("w", {7, 5}, DType::kFloat32)});  // 84 B
  b.BeginLoss();
  b.SetLoss(b.Add1("sum", {y}));
  StatusOr<Report> r = EstimateGraph(b.Finish().value(), Cpu113(), {1'000'000, false});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->saved_for_backward_bytes, 60);  // x, kept for the weight's gradient
  EXPECT_EQ(r->end_of_step[static_cast<int>(Category::kParameters)], 140);
  EXPECT_EQ(r->end_of_step[static_cast<int>(Category::kGradients)], 140);
  EXPECT_EQ(r->breakdown[static_cast<int>(Category::kWorkspace)], 0);
  EXPECT_EQ(r->breakdown[static_cast<int>(Category::kCudaContext)], 0);
}

// An inference step is one of many forwards (an evaluation loop, a server): the cuBLAS workspace
// the one before cached is there before the first op. Measured on an H200 under PyTorch 2.11:
// ResNet-50's one matmul is its last layer, and the workspace counted in its steady peak. vLLM's
// profile run, its process's first forward, allocates it at its first matmul instead.
TEST(RuntimeTest, InferenceFindsTheCublasWorkspaceCached) {
  GraphBuilder b;
  const int x = b.Input("x", {1024, 1024}, DType::kFloat32);
  const int h = b.Add1("relu", {x});
  b.Add1("linear", {h, b.Parameter("w", {16, 1024}, DType::kFloat32)});
  const Graph g = b.Finish().value();
  RunConfig c;
  c.mode = Mode::kInference;
  c.device = "h100-80gb";
  StatusOr<Report> r = EstimateGraph(g, c, {1'000'000, false});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const int64_t workspace = int64_t{32} << 20;  // sm_90: ":4096:8"
  ASSERT_FALSE(r->phases.empty());
  EXPECT_EQ(r->phases[0].phase, Phase::kData);
  EXPECT_EQ(r->phases[0].by_category[static_cast<int>(Category::kWorkspace)], workspace);
  EXPECT_EQ(r->breakdown[static_cast<int>(Category::kWorkspace)], workspace);
}

// 1.13's foreach Adam keeps two lists of scratch (sqrt, then + eps out of place); its step
// counters are 0-dim float32 tensors on the CPU.
TEST(RuntimeTest, CpuForeachAdamScratchAndStepCounters) {
  GraphBuilder b;
  const int x = b.Input("x", {4, 256}, DType::kFloat32);
  const int y = b.Add1("linear", {x, b.Parameter("w", {256, 256}, DType::kFloat32)});
  b.BeginLoss();
  b.SetLoss(b.Add1("sum", {y}));
  RunConfig c = Cpu113();
  c.optimizer.kind = OptimizerKind::kAdam;
  c.optimizer.impl = OptimizerImpl::kForeach;
  StatusOr<Report> r = EstimateGraph(b.Finish().value(), c, {1'000'000, false});
  ASSERT_TRUE(r.ok());
  const int64_t p = 256 * 256 * 4;
  EXPECT_EQ(r->end_of_step[static_cast<int>(Category::kOptimizerState)], 2 * p + 4);
  int64_t step_peak = 0;
  for (const PeakPoint& pp : r->phases) {
    if (pp.phase == Phase::kOptimizerStep) step_peak = pp.allocated_bytes;
  }
  EXPECT_EQ(step_peak, p /*param*/ + p /*grad*/ + 2 * p + 4 /*state*/ + 2 * p /*scratch*/);
}

}  // namespace
}  // namespace memest

namespace memest {
namespace {

// An empty tensor holds no memory: PyTorch's allocators return a null pointer for 0 bytes, and
// the caching allocator model makes no 512-byte block for it.
TEST(ScheduleTest, EmptyTensorsTakeNoBlock) {
  auto peak = [](int64_t rows) {
    GraphBuilder b;
    const int x = b.Input("x", {rows, 64}, DType::kFloat32);
    b.SetLoss(b.Add1("sum", {b.Add1("relu", {x})}));
    RunConfig c = PlainTraining();
    c.mode = Mode::kInference;
    return EstimateGraph(b.Finish().value(), c, {1'000'000, false}).value().peak.allocated_bytes;
  };
  EXPECT_EQ(peak(0), 512);  // the 0-dim sum alone
  EXPECT_EQ(peak(2), 512 + 512 + 512);
}

}  // namespace
}  // namespace memest
