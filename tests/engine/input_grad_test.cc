// An input that requires grad (TensorSpec::input_requires_grad, the tracer's requiresGrad):
// autograd keeps what its gradient needs, backward computes the gradient into the input's .grad,
// which lives while the input does (to the end of the micro-batch), and only floating inputs
// may ask for it.
#include <gtest/gtest.h>

#include <string>

#include "engine/models/model.h"
#include "tests/engine/test_graphs.h"

namespace memest {
namespace {

using enginetest::Cat;
using enginetest::PhasePeak;

// loss = sum(sigmoid(x) + w), x [8, 16] (512 bytes), w [16]: sigmoid keeps its output only for
// x's gradient, add keeps nothing.
OpGraphSpec SigmoidShift(bool x_grad) {
  OpGraphSpec g;
  TensorSpec x{"x", {8, 16}, DType::kFloat32, TensorRole::kInput, 0};
  x.input_requires_grad = x_grad;
  TensorSpec w{"w", {16}, DType::kFloat32, TensorRole::kParameter, -1};
  g.tensors = {x, w};
  g.ops = {OpSpec{"sigmoid", {"x"}, {"t"}, {}, ""}, OpSpec{"add", {"t", "w"}, {"y"}, {}, ""},
           OpSpec{"sum", {"y"}, {"loss"}, {}, ""}};
  g.loss = "loss";
  g.traced_batch = 8;
  return g;
}

TEST(InputGradTest, TheGradientIsKeptWhileTheInputLives) {
  RunConfig cfg = enginetest::PlainTraining();
  cfg.runtime = Runtime::kCpuTorch113;  // bytes as they are, no allocator rounding
  const Graph with = BuildOpGraph(SigmoidShift(true), enginetest::MakeContext(8)).value();
  const Graph without = BuildOpGraph(SigmoidShift(false), enginetest::MakeContext(8)).value();
  ASSERT_TRUE(with.tensors[0].requires_grad);
  ASSERT_FALSE(without.tensors[0].requires_grad);
  const Schedule sw = BuildSchedule(with, cfg, {}, ScheduleOptions{}).value();
  const Schedule so = BuildSchedule(without, cfg, {}, ScheduleOptions{}).value();
  EXPECT_EQ(sw.saved_for_backward_bytes, 512);  // sigmoid's output, for x's gradient
  EXPECT_EQ(so.saved_for_backward_bytes, 0);
  const Liveness lw = WalkSchedule(sw, with, false).value();
  const Liveness lo = WalkSchedule(so, without, false).value();
  // Backward holds sigmoid's output and makes x.grad (512 bytes each) beside the same rest...
  EXPECT_GE(PhasePeak(lw, Phase::kBackward).allocated_bytes,
            PhasePeak(lo, Phase::kBackward).allocated_bytes + 1024);
  // ...and x.grad is gone with x before the optimizer step.
  EXPECT_EQ(PhasePeak(lw, Phase::kOptimizerStep).allocated_bytes,
            PhasePeak(lo, Phase::kOptimizerStep).allocated_bytes);
  EXPECT_EQ(Cat(PhasePeak(lw, Phase::kOptimizerStep), Category::kGradients),
            Cat(PhasePeak(lo, Phase::kOptimizerStep), Category::kGradients));
  EXPECT_EQ(lw.at_end, lo.at_end);
}

TEST(InputGradTest, OnlyFloatingInputsRequireGrad) {
  OpGraphSpec g = SigmoidShift(false);
  g.tensors[1].input_requires_grad = true;
  StatusOr<Graph> built = BuildOpGraph(g, enginetest::MakeContext(8));
  ASSERT_FALSE(built.ok());
  EXPECT_EQ(built.status().message(),
            "model.tensors[1].requires_grad: applies to floating inputs only, not to parameters "
            "(a parameter without a gradient is frozen)");
  g = SigmoidShift(true);
  g.tensors[0].dtype = DType::kInt64;
  built = BuildOpGraph(g, enginetest::MakeContext(8));
  ASSERT_FALSE(built.ok());
  EXPECT_EQ(built.status().message(),
            "model.tensors[0].requires_grad: applies to floating inputs only, not to int64 inputs");
}

}  // namespace
}  // namespace memest
