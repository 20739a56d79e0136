// The optimizer cost table (engine/step/optimizers.h) through the step simulator: transformers'
// AdamW and Adafactor against torch.optim's, with byte counts derived from their source
// (transformers/optimization.py).
#include "engine/step/optimizers.h"

#include <gtest/gtest.h>

#include "tests/engine/test_graphs.h"

namespace memest {
namespace {

using enginetest::Cat;
using enginetest::PhasePeak;
using enginetest::PlainTraining;
using enginetest::Walk;

// fc1 [512, 256] + [512], fc2 [10, 512] + [10]: 547,328 bytes of float32 parameters once each
// is rounded to the allocator's 512 bytes.
Graph Mlp(DType dtype = DType::kFloat32) {
  GraphBuilder b;
  const int x = b.Input("x", {4, 256}, dtype);
  int h = b.Add1("linear", {x, b.Parameter("fc1.weight", {512, 256}, dtype),
                            b.Parameter("fc1.bias", {512}, dtype)});
  h = b.Add1("relu", {h});
  h = b.Add1("linear", {h, b.Parameter("fc2.weight", {10, 512}, dtype),
                        b.Parameter("fc2.bias", {10}, dtype)});
  b.BeginLoss();
  b.SetLoss(b.Add1("sum", {h}));
  return b.Finish().value();
}

constexpr int64_t kParams = 547328;
constexpr int64_t kW1 = 512 * 256 * 4;

// transformers.AdamW: exp_avg and exp_avg_sq; one parameter at a time, denom =
// exp_avg_sq.sqrt().add_(eps) is its only scratch (torch's for-loop Adam holds two: the sqrt
// and its quotient by bias_correction2_sqrt), and fc1.weight's denom is still referenced while
// fc1.bias's (2048 B) is made. impl is ignored: it has no foreach path.
TEST(OptimizersTest, HfAdamWKeepsTwoStatesAndOneScratch) {
  RunConfig c = PlainTraining();
  c.optimizer.kind = OptimizerKind::kHfAdamW;
  c.optimizer.impl = OptimizerImpl::kForeach;
  const Liveness l = Walk(Mlp(), c);
  EXPECT_EQ(Cat(PhasePeak(l, Phase::kData), Category::kOptimizerState), 2 * kParams);
  EXPECT_EQ(PhasePeak(l, Phase::kOptimizerStep).allocated_bytes, 4 * kParams + kW1 + 2048);
  EXPECT_EQ(EffectiveImpl(c.optimizer), OptimizerImpl::kForLoop);
  c.optimizer.kind = OptimizerKind::kAdamW;
  c.optimizer.impl = OptimizerImpl::kForLoop;
  EXPECT_EQ(PhasePeak(Walk(Mlp(), c), Phase::kOptimizerStep).allocated_bytes,
            4 * kParams + 2 * kW1);
}

// transformers.Adafactor (beta1=None): for a matrix exp_avg_sq_row [rows] and exp_avg_sq_col
// [cols], for a vector exp_avg_sq like it, and a 0-dim RMS, each rounded to 512 bytes:
//   fc1.weight 2048 + 1024 + 512, fc1.bias 2048 + 512, fc2.weight 40->512 + 2048 + 512,
//   fc2.bias 40->512 + 512 = 10,240.
// Its step holds two full-size float32 tensors at once (grad**2 + eps; then r_factor * c_factor
// while the old update is referenced): 2 x fc1.weight, with r_factor [512] and c_factor [256]
// (2048 + 1024 bytes) beside them.
TEST(OptimizersTest, HfAdafactorFactorsItsSecondMomentInFloat32) {
  RunConfig c = PlainTraining();
  c.optimizer.kind = OptimizerKind::kHfAdafactor;
  const Liveness l = Walk(Mlp(), c);
  EXPECT_EQ(Cat(PhasePeak(l, Phase::kData), Category::kOptimizerState), 10240);
  EXPECT_EQ(PhasePeak(l, Phase::kOptimizerStep).allocated_bytes,
            2 * kParams + 10240 + 2 * kW1 + 2048 + 1024);
  // torch.optim.Adafactor: row_var [.., rows, 1] and col_var [.., 1, cols] in the parameter's
  // dtype, no RMS; one full-size scratch (var_estimate).
  c.optimizer.kind = OptimizerKind::kAdafactor;
  c.optimizer.impl = OptimizerImpl::kForLoop;
  const Liveness t = Walk(Mlp(), c);
  EXPECT_EQ(Cat(PhasePeak(t, Phase::kData), Category::kOptimizerState),
            2048 + 1024 + 2048 + 512 + 2048 + 512);
}

// A bfloat16 parameter: transformers' Adafactor copies grad and data to float32 first
// (grad.float(), p.float()), keeps float32 moments, and its two scratch tensors are float32:
// four float32 copies of fc1.weight at once, twice its bfloat16 bytes each, and the factors.
TEST(OptimizersTest, HfAdafactorUpcastsHalfParameters) {
  RunConfig c = PlainTraining();
  c.precision = Precision::kBf16Pure;
  c.optimizer.kind = OptimizerKind::kHfAdafactor;
  const Graph g = Mlp(DType::kBFloat16);
  const Liveness l = Walk(g, c);
  const int64_t params = 262144 + 1024 + 10240 + 512;  // bf16, each rounded to 512
  EXPECT_EQ(Cat(PhasePeak(l, Phase::kData), Category::kOptimizerState), 10240);
  EXPECT_EQ(PhasePeak(l, Phase::kOptimizerStep).allocated_bytes,
            2 * params + 10240 + 4 * 512 * 256 * 4 + 2048 + 1024);
}

TEST(OptimizersTest, TransformersOptimizersHaveNoFusedKernel) {
  RunConfig c = PlainTraining();
  c.optimizer.kind = OptimizerKind::kHfAdafactor;
  c.optimizer.impl = OptimizerImpl::kFused;
  Status s = ValidateRunConfig(c);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("config.optimizer.impl: torch.optim has no fused transformers "
                             "Adafactor"),
            std::string::npos)
      << s.message();
}

}  // namespace
}  // namespace memest
