// Channels-last convolutions and layer_norm over a permuted view, as ConvNeXt's LayerNorm2d
// makes them (x.permute(0, 2, 3, 1) -> layer_norm -> permute(0, 3, 1, 2) -> conv2d): the
// convolution's output and gradients are channels-last, its weight is copied to channels-last
// around cuDNN's kernels (PyTorch 2.x, aten/src/ATen/native/cudnn/ConvShared.cpp) unless it is
// channels-last already (depthwise), AccumulateGrad copies the channels-last weight gradient,
// and layer_norm copies its permuted input. Measured on PyTorch 1.13's CPU path (conformance
// ops/conv2d_channels_last_*, ops/layer_norm_permuted_input; the zoo's convnext_*).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/models/model.h"
#include "tests/engine/test_graphs.h"

namespace memest {
namespace {

// y = conv2d(x, w [co, ci/groups, k, k]; stride, groups); loss = mean(y). x is [2, 32, 8, 8],
// given row-major or as a permuted [2, 8, 8, 32] input (channels-last strides).
OpGraphSpec Conv(bool channels_last, int64_t co, int64_t k, int64_t stride, int64_t groups) {
  OpGraphSpec g;
  const std::string x = channels_last ? "xp" : "x";
  g.tensors = {TensorSpec{"x", channels_last ? Shape{2, 8, 8, 32} : Shape{2, 32, 8, 8},
                          DType::kFloat32, TensorRole::kInput, 0},
               TensorSpec{"w", {co, 32 / groups, k, k}, DType::kFloat32, TensorRole::kParameter, -1}};
  if (channels_last) {
    g.ops.push_back(OpSpec{"permute", {"x"}, {"xp"}, {{"dims", std::vector<int64_t>{0, 3, 1, 2}}}, ""});
  }
  g.ops.push_back(OpSpec{"conv2d", {x, "w"}, {"y"},
                         {{"stride", std::vector<int64_t>{stride, stride}},
                          {"padding", std::vector<int64_t>{(k - 1) / 2, (k - 1) / 2}},
                          {"groups", groups}},
                         "conv"});
  g.ops.push_back(OpSpec{"mean", {"y"}, {"loss"}, {}, ""});
  g.loss = "loss";
  g.traced_batch = 2;
  return g;
}

// Bytes allocated while op `kind` runs in `phase`.
int64_t Allocations(const Graph& g, const RunConfig& cfg, const std::string& kind, Phase phase) {
  const Schedule s = BuildSchedule(g, cfg, {}, ScheduleOptions{}).value();
  const StepContext* ctx = nullptr;
  int64_t bytes = 0;
  for (const Event& e : s.events) {
    if (e.kind == EventKind::kContext) ctx = &s.contexts[e.buffer];
    if (e.kind == EventKind::kAlloc && ctx != nullptr && ctx->phase == phase && ctx->op >= 0 &&
        g.ops[ctx->op].kind == kind) {
      bytes += e.bytes;
    }
  }
  return bytes;
}

const Tensor& Named(const Graph& g, const std::string& name) {
  for (const Tensor& t : g.tensors) {
    if (t.name == name) return t;
  }
  ADD_FAILURE() << name;
  return g.tensors.front();
}

TEST(ChannelsLastTest, ConvolutionOutputIsChannelsLast) {
  const Graph cl = BuildOpGraph(Conv(true, 64, 2, 2, 1), enginetest::MakeContext(2)).value();
  const Graph plain = BuildOpGraph(Conv(false, 64, 2, 2, 1), enginetest::MakeContext(2)).value();
  // y [2, 64, 4, 4]: channels fastest.
  EXPECT_EQ(Named(cl, "y").strides, (Strides{1024, 1, 256, 64}));
  EXPECT_EQ(Named(plain, "y").strides, (Strides{1024, 16, 4, 1}));
}

TEST(ChannelsLastTest, CudnnCopiesTheWeightAroundItsKernels) {
  RunConfig cfg = enginetest::PlainTraining();  // CUDA
  const int64_t w = 64 * 32 * 2 * 2 * 4;
  const Graph cl = BuildOpGraph(Conv(true, 64, 2, 2, 1), enginetest::MakeContext(2)).value();
  const Graph plain = BuildOpGraph(Conv(false, 64, 2, 2, 1), enginetest::MakeContext(2)).value();
  const int64_t y = 2 * 64 * 4 * 4 * 4;
  // weight->contiguous(channels_last) in the forward (x needs no gradient: the backward computes
  // only the weight's, which needs no weight copy).
  EXPECT_EQ(Allocations(cl, cfg, "conv2d", Phase::kForward),
            Allocations(plain, cfg, "conv2d", Phase::kForward) + w);
  // Backward: mean's row-major gradient made channels-last (grad_output.to(memory_format)),
  // and AccumulateGrad's copy of the channels-last weight gradient into the weight's layout.
  EXPECT_EQ(Allocations(cl, cfg, "conv2d", Phase::kBackward),
            Allocations(plain, cfg, "conv2d", Phase::kBackward) + y + w);
  // .grad ends as one weight-sized tensor either way.
  const Liveness l = enginetest::Walk(cl, cfg);
  EXPECT_EQ(l.at_end[static_cast<int>(Category::kGradients)], w);
}

TEST(ChannelsLastTest, CudnnCopiesTheWeightAgainForTheInputsGradient) {
  RunConfig cfg = enginetest::PlainTraining();
  const int64_t w = 64 * 32 * 2 * 2 * 4, y = 2 * 64 * 4 * 4 * 4;
  OpGraphSpec cl_spec = Conv(true, 64, 2, 2, 1), plain_spec = Conv(false, 64, 2, 2, 1);
  cl_spec.tensors[0].input_requires_grad = plain_spec.tensors[0].input_requires_grad = true;
  const Graph cl = BuildOpGraph(cl_spec, enginetest::MakeContext(2)).value();
  const Graph plain = BuildOpGraph(plain_spec, enginetest::MakeContext(2)).value();
  EXPECT_EQ(Allocations(cl, cfg, "conv2d", Phase::kBackward),
            Allocations(plain, cfg, "conv2d", Phase::kBackward) + y + w + w);
}

TEST(ChannelsLastTest, ADepthwiseWeightIsChannelsLastAlready) {
  RunConfig cfg = enginetest::PlainTraining();
  const Graph cl = BuildOpGraph(Conv(true, 32, 7, 1, 32), enginetest::MakeContext(2)).value();
  const Graph plain = BuildOpGraph(Conv(false, 32, 7, 1, 32), enginetest::MakeContext(2)).value();
  EXPECT_EQ(Allocations(cl, cfg, "conv2d", Phase::kForward),
            Allocations(plain, cfg, "conv2d", Phase::kForward));
  // Only mean's row-major gradient made channels-last: the weight's gradient is channels-last
  // and row-major at once, so AccumulateGrad takes it as it is.
  EXPECT_EQ(Allocations(cl, cfg, "conv2d", Phase::kBackward),
            Allocations(plain, cfg, "conv2d", Phase::kBackward) + 2 * 32 * 8 * 8 * 4);
}

// layer_norm over x.permute(0, 2, 3, 1) of a row-major x [2, 16, 8, 8], then permuted back.
OpGraphSpec PermutedLayerNorm() {
  OpGraphSpec g;
  g.tensors = {TensorSpec{"x", {2, 16, 8, 8}, DType::kFloat32, TensorRole::kInput, 0},
               TensorSpec{"b", {8}, DType::kFloat32, TensorRole::kParameter, -1},
               TensorSpec{"g", {16}, DType::kFloat32, TensorRole::kParameter, -1}};
  g.ops = {OpSpec{"add", {"x", "b"}, {"h"}, {}, ""},  // a non-leaf that requires grad
           OpSpec{"permute", {"h"}, {"p"}, {{"dims", std::vector<int64_t>{0, 2, 3, 1}}}, ""},
           OpSpec{"layer_norm", {"p", "g"}, {"n"}, {}, "norm"},
           OpSpec{"permute", {"n"}, {"q"}, {{"dims", std::vector<int64_t>{0, 3, 1, 2}}}, ""},
           OpSpec{"exp", {"q"}, {"e"}, {}, ""},
           OpSpec{"mean", {"e"}, {"loss"}, {}, ""}};
  g.loss = "loss";
  g.traced_batch = 2;
  return g;
}

TEST(ChannelsLastTest, LayerNormCopiesAPermutedInput) {
  const Graph g = BuildOpGraph(PermutedLayerNorm(), enginetest::MakeContext(2)).value();
  const int64_t x = 2 * 16 * 8 * 8 * 4;
  const int64_t stats = 2 * 8 * 8 * 4;  // mean and rstd, [2, 8, 8, 1] float32 each
  for (Runtime runtime : {Runtime::kCpuTorch113, Runtime::kCuda}) {
    SCOPED_TRACE(runtime == Runtime::kCuda ? "cuda" : "cpu-1.13");
    RunConfig cfg = enginetest::PlainTraining();
    cfg.runtime = runtime;
    // The output, its two statistics and the contiguous copy of the input.
    EXPECT_EQ(Allocations(g, cfg, "layer_norm", Phase::kForward), x + 2 * stats + x);
  }
  // Backward: exp's gradient comes back through the permute (not row-major) and is copied, and
  // so is the saved input; with the input's gradient and the weight's: 3x + 16 floats and
  // 1.13's dgamma / dbeta partial sums.
  RunConfig cfg = enginetest::PlainTraining();
  cfg.runtime = Runtime::kCpuTorch113;
  EXPECT_EQ(Allocations(g, cfg, "layer_norm", Phase::kBackward), 3 * x + 16 * 4 + 2 * 16 * 4 + 4);
}

}  // namespace
}  // namespace memest
