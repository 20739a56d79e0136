// The phenomena of the write-ups memest grew from (../shared/seeds), each as a test.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "engine/estimator.h"
#include "engine/report/advice.h"
#include "tests/engine/test_graphs.h"

namespace memest {
namespace {

using enginetest::Cat;
using enginetest::PlainTraining;

constexpr int64_t kGiB = int64_t{1} << 30;
constexpr int64_t kMiB = int64_t{1} << 20;

Report MustEstimate(const Graph& g, const RunConfig& c) {
  StatusOr<Report> r = EstimateGraph(g, c, {1'000'000, false});
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : Report{};
}

const PeakPoint& Phase_(const Report& r, Phase p) {
  for (const PeakPoint& pp : r.phases) {
    if (pp.phase == p) return pp;
  }
  static PeakPoint none;
  return none;
}

bool HasAdvice(const std::vector<Advice>& advice, const std::string& kind, int64_t min_saving) {
  for (const Advice& a : advice) {
    if (a.kind == kind && a.saving_bytes >= min_saving) return true;
  }
  return false;
}

// Seed 000 (PowerSpherical log_prob): (loc * value).sum(-1) with loc [M,T,D] and value
// [M,1,T,D] broadcasts an [M,M,T,D] product: 128*128*512*128*4 B = 4 GiB at M=128, T=512,
// D=128, while einsum("ijk,ljk->lij") never builds it.
Graph LogProb(bool einsum, bool grad) {
  const int64_t M = 128, T = 512, D = 128;
  GraphBuilder b;
  const int loc_p = b.Parameter("loc", {M, T, D}, DType::kFloat32, grad);
  const int value = b.Input("value", {M, 1, T, D}, DType::kFloat32);
  int dot;
  {
    ScopeGuard s(b, "log_prob");
    if (einsum) {
      const int v = b.Add1("squeeze", {value}, {{"dim", int64_t{1}}});
      dot = b.Add1("einsum", {loc_p, v}, {{"equation", std::string("ljk,ijk->ilj")}});
    } else {
      const int prod = b.Add1("mul", {loc_p, value});
      dot = b.Add1("sum", {prod}, {{"dim", std::vector<int64_t>{-1}}});
    }
  }
  b.BeginLoss();
  b.SetLoss(b.Add1("sum", {dot}));
  return b.Finish().value();
}

TEST(SeedPhenomena, BroadcastThenReduceMaterialisesTheProduct) {
  RunConfig c = PlainTraining();
  c.mode = Mode::kInference;
  const Report broadcast = MustEstimate(LogProb(false, false), c);
  const Report contraction = MustEstimate(LogProb(true, false), c);
  const int64_t product = 128LL * 128 * 512 * 128 * 4;
  EXPECT_EQ(product, 4 * kGiB);
  EXPECT_GE(broadcast.peak.allocated_bytes, product);
  // The peak comes as sum allocates its [M, M, T] result while the product still exists: the
  // product is a temporary, kept by nothing.
  EXPECT_EQ(broadcast.peak.op, "sum");
  EXPECT_GE(Cat(broadcast.peak, Category::kTemporaries), product);
  EXPECT_EQ(Cat(broadcast.peak, Category::kActivations), 0);
  EXPECT_LT(contraction.peak.allocated_bytes, 200 * kMiB);
}

TEST(SeedPhenomena, AdviceRewritesBroadcastReduceAsEinsum) {
  RunConfig c = PlainTraining();
  const Graph g = LogProb(false, true);
  const Report r = MustEstimate(g, c);
  Budget budget;
  const std::vector<Advice> advice = MakeAdvice(ModelSpec{}, g, c, r, &budget).value();
  // In training the backward of the broadcast multiply forms a full-size product again; the
  // einsum's peak is about 160 MiB against 4.09 GiB.
  EXPECT_TRUE(HasAdvice(advice, "broadcast_reduce", 3 * kGiB + 900 * kMiB));
  EXPECT_EQ(advice.front().kind, "peak");
}

// Seed 001 (diffusion UNet): weights 4 B, Adam 8 B and gradients 4 B per parameter are small
// next to the convolutions' activations.
TEST(SeedPhenomena, ConvActivationsDwarfModelStates) {
  RunConfig c;
  c.batch_size = 128;
  c.optimizer.kind = OptimizerKind::kAdam;
  StatusOr<Report> r = Estimate(ModelSpec{PresetSpec{"unet-down", {}}}, c);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const int64_t states = r->breakdown[static_cast<int>(Category::kParameters)] +
                         r->breakdown[static_cast<int>(Category::kOptimizerState)];
  // 4 B per parameter, plus allocator rounding (under 512 B per tensor) and BatchNorm buffers.
  const int64_t params = r->breakdown[static_cast<int>(Category::kParameters)];
  EXPECT_GE(params, r->parameter_count * 4);
  EXPECT_LT(params, r->parameter_count * 4 * 101 / 100);
  EXPECT_GT(r->breakdown[static_cast<int>(Category::kActivations)], 10 * states);
  // The first level's convolutions at [128, 128, 64, 64] float32 (256 MiB each) are kept.
  EXPECT_GE(r->layers.size(), 4u);
}

// Seed 002: activations scale with the micro-batch; gradient accumulation trades steps for
// memory at the same batch.
TEST(SeedPhenomena, MicroBatchingScalesActivations) {
  auto activations = [](int64_t batch, int64_t accum) {
    RunConfig c;
    c.batch_size = batch;
    c.grad_accum_steps = accum;
    StatusOr<Report> r = Estimate(ModelSpec{PresetSpec{"gpt2-small", {{"seq", 256}}}}, c, {1'000'000, false});
    EXPECT_TRUE(r.ok());
    return r->breakdown[static_cast<int>(Category::kActivations)];
  };
  const int64_t full = activations(16, 1), half = activations(16, 2), quarter = activations(16, 4);
  EXPECT_NEAR(static_cast<double>(half) / full, 0.5, 0.05);
  EXPECT_NEAR(static_cast<double>(quarter) / full, 0.25, 0.05);
}

// Seed 003 (memory-efficient Swish): x * sigmoid(x) keeps x and sigmoid(x); silu keeps x.
// Activations ([4096, 256] float32, 4 MiB) dominate the 256 KiB weight.
Graph SwishNet(bool manual) {
  GraphBuilder b;
  const int x = b.Input("x", {4096, 256}, DType::kFloat32);
  int h;
  {
    ScopeGuard s(b, "fc");
    h = b.Add1("linear", {x, b.Parameter("weight", {256, 256}, DType::kFloat32)});
  }
  {
    ScopeGuard s(b, "act");
    h = manual ? b.Add1("mul", {h, b.Add1("sigmoid", {h})}) : b.Add1("silu", {h});
  }
  b.BeginLoss();
  b.SetLoss(b.Add1("sum", {h}));
  return b.Finish().value();
}

TEST(SeedPhenomena, ManualSwishKeepsOneMoreTensor) {
  const int64_t act = 4096 * 256 * 4;
  RunConfig c = PlainTraining();
  EXPECT_EQ(enginetest::SavedBytes(SwishNet(true), c, "act"), 2 * act);
  EXPECT_EQ(enginetest::SavedBytes(SwishNet(false), c, "act"), act);
  const Graph manual = SwishNet(true);
  const Report r = MustEstimate(manual, c);
  Budget budget;
  EXPECT_TRUE(HasAdvice(MakeAdvice(ModelSpec{}, manual, c, r, &budget).value(), "fused_activation", act));
}

// Seed 003: the timeline of a step, first step against later ones.
TEST(SeedPhenomena, FirstStepCreatesOptimizerStateInsideTheStep) {
  RunConfig c = PlainTraining();
  c.optimizer.kind = OptimizerKind::kAdam;
  const Graph g = SwishNet(false);
  c.step = StepKind::kFirstStep;
  const Report first = MustEstimate(g, c);
  c.step = StepKind::kSteadyState;
  const Report later = MustEstimate(g, c);
  const int64_t state = 2 * 256 * 256 * 4;
  EXPECT_EQ(Cat(Phase_(first, Phase::kData), Category::kOptimizerState), 0);
  EXPECT_EQ(Cat(Phase_(later, Phase::kData), Category::kOptimizerState), state);
  EXPECT_EQ(Cat(Phase_(first, Phase::kOptimizerStep), Category::kOptimizerState), state);
  ASSERT_EQ(first.phases.size(), 5u);
  EXPECT_EQ(first.phases[0].phase, Phase::kData);
  EXPECT_EQ(first.phases[4].phase, Phase::kOptimizerStep);
}

// Seed 004: dividing the [T, T] scores by sqrt(e) makes a second score-sized tensor for a
// moment, but autograd keeps nothing for a division by a Python scalar (as the write-up's
// author concludes: "for multiplying by a constant you can work out the gradients without
// storing the input values"), and softmax right after needs its input and output at once
// anyway: scaling q and k by e^(-1/4) instead changes neither what is saved nor the peak. What
// does cost a saved [T, T] tensor is scaling by a tensor that needs grad (a learned
// temperature): div then keeps the scores for the temperature's gradient.
enum class Scale { kScores, kQueriesAndKeys, kLearnedTemperature };

Graph Attention(Scale scale) {
  const int64_t T = 2048, E = 64;
  GraphBuilder b;
  const int x = b.Input("x", {1, T, E}, DType::kFloat32);
  int q, k, s;
  {
    ScopeGuard g(b, "proj");
    q = b.Add1("linear", {x, b.Parameter("wq", {E, E}, DType::kFloat32)});
    k = b.Add1("linear", {x, b.Parameter("wk", {E, E}, DType::kFloat32)});
  }
  const int temperature = b.Parameter("temperature", {}, DType::kFloat32);
  {
    ScopeGuard g(b, "core");
    const double quarter = 1.0 / std::sqrt(std::sqrt(static_cast<double>(E)));
    if (scale == Scale::kQueriesAndKeys) {
      q = b.Add1("mul", {q}, {{"scalar", quarter}});
      k = b.Add1("mul", {k}, {{"scalar", quarter}});
    }
    s = b.Add1("matmul", {q, b.Add1("transpose", {k}, {{"dim0", int64_t{1}}, {"dim1", int64_t{2}}})});
    if (scale == Scale::kScores) s = b.Add1("div", {s}, {{"scalar", std::sqrt(static_cast<double>(E))}});
    if (scale == Scale::kLearnedTemperature) s = b.Add1("div", {s, temperature});
    s = b.Add1("softmax", {s});
  }
  b.BeginLoss();
  b.SetLoss(b.Add1("sum", {s}));
  return b.Finish().value();
}

TEST(SeedPhenomena, ScalingTheScoresByAConstantKeepsNothing) {
  RunConfig c = PlainTraining();
  const int64_t scores = 2048LL * 2048 * 4;
  const Graph divide = Attention(Scale::kScores), scaled = Attention(Scale::kQueriesAndKeys);
  const Graph learned = Attention(Scale::kLearnedTemperature);
  EXPECT_EQ(enginetest::SavedBytes(divide, c, "core"), enginetest::SavedBytes(scaled, c, "core"));
  EXPECT_EQ(enginetest::SavedBytes(learned, c, "core"), enginetest::SavedBytes(divide, c, "core") + scores);
  const Report rd = MustEstimate(divide, c), rs = MustEstimate(scaled, c);
  EXPECT_EQ(Phase_(rd, Phase::kForward).allocated_bytes, Phase_(rs, Phase::kForward).allocated_bytes);
  EXPECT_EQ(rd.peak.allocated_bytes, rs.peak.allocated_bytes);
  // So memest does not advise the move: advice is only what a re-estimate shows to help.
  Budget budget;
  EXPECT_FALSE(HasAdvice(MakeAdvice(ModelSpec{}, divide, c, rd, &budget).value(), "attention_scaling", 1));
}

TEST(SeedPhenomena, CheckpointingEverySqrtLBlocksFitsWhereNoneDoesNot) {
  RunConfig c;
  c.batch_size = 16;
  c.precision = Precision::kBf16Amp;
  c.device = "rtx-4090";
  const ModelSpec gpt2{PresetSpec{"gpt2-medium", {{"seq", 1024}}}};
  StatusOr<Report> none = Estimate(gpt2, c, {1'000'000, false});
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->fit->fits);
  c.checkpoint.policy = CheckpointPolicy::kSqrtBlocks;
  StatusOr<Report> sqrt = Estimate(gpt2, c, {1'000'000, false});
  ASSERT_TRUE(sqrt.ok());
  EXPECT_LT(sqrt->peak.allocated_bytes, none->peak.allocated_bytes / 2);
}

}  // namespace
}  // namespace memest

namespace memest {
namespace {

// With a device, advice names the largest micro-batch that fits it: the estimate at that batch
// fits and one more does not.
TEST(AdviceTest, NamesTheLargestMicroBatchThatFits) {
  const ModelSpec gpt2{PresetSpec{"gpt2-small", {{"seq", 1024}}}};
  RunConfig c;
  c.batch_size = 32;
  c.precision = Precision::kBf16Amp;
  c.device = "rtx-4090";
  StatusOr<Report> r = Estimate(gpt2, c);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const Advice* max_batch = nullptr;
  for (const Advice& a : r->advice) {
    if (a.kind == "max_batch") max_batch = &a;
  }
  ASSERT_NE(max_batch, nullptr);
  auto fits = [&](int64_t m) {
    RunConfig alt = c;
    alt.batch_size = m;
    return Estimate(gpt2, alt, {1'000'000, false})->fit->fits;
  };
  int64_t m = 0;
  for (int64_t b = 1; b <= 64; ++b) {
    if (fits(b)) m = b;
  }
  EXPECT_NE(max_batch->message.find("is " + std::to_string(m) + ";"), std::string::npos)
      << max_batch->message;
  EXPECT_TRUE(fits(m));
  EXPECT_FALSE(fits(m + 1));
}

// Two blocks: checkpointing every sqrt(2) ~ 1 block is checkpointing every block, advised once.
TEST(AdviceTest, EachCheckpointChoiceIsAdvisedOnce) {
  const ModelSpec gpt2{PresetSpec{"gpt2-small", {{"layers", 2}, {"seq", 256}}}};
  RunConfig c;
  c.batch_size = 4;
  const Report r = Estimate(gpt2, c).value();
  std::vector<std::string> seen;
  for (const Advice& a : r.advice) {
    if (a.kind != "checkpoint") continue;
    EXPECT_EQ(std::count(seen.begin(), seen.end(), a.message), 0) << a.message;
    seen.push_back(a.message);
  }
  EXPECT_EQ(seen.size(), 1u);
}

}  // namespace
}  // namespace memest
