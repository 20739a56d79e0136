// The layout of the gradients backward hands on, and how long the loop's own gradient lives:
// a convolution's backward copies an output gradient that arrives as a transposed view (ViT's
// patch embedding, flatten(2).transpose(1, 2)), and loss.backward()'s seed gradient lives until
// the engine returns (measured: the zoo's hf_vit, tests/conformance/zoo.py; the conformance
// cases ops/conv2d_transposed_grad and phenomena/vit_patch_embedding).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/models/model.h"
#include "tests/engine/test_graphs.h"

namespace memest {
namespace {

using enginetest::Cat;
using enginetest::PhasePeak;

constexpr int64_t kConvOut = 2 * 32 * 4 * 4 * 4;  // y [2, 32, 4, 4], float32

// y = conv2d(x [2, 3, 16, 16], w [32, 3, 4, 4], b; stride 4); loss = mean(exp(t)), where t is
// y.flatten(2) (its gradient comes back row-major) or y.flatten(2).transpose(1, 2) (it comes
// back transposed: strides [512, 1, 32] for the [2, 32, 16] view).
OpGraphSpec PatchEmbedding(bool transposed) {
  OpGraphSpec g;
  g.tensors = {TensorSpec{"x", {2, 3, 16, 16}, DType::kFloat32, TensorRole::kInput, 0},
               TensorSpec{"w", {32, 3, 4, 4}, DType::kFloat32, TensorRole::kParameter, -1},
               TensorSpec{"b", {32}, DType::kFloat32, TensorRole::kParameter, -1}};
  g.ops = {OpSpec{"conv2d", {"x", "w", "b"}, {"y"}, {{"stride", std::vector<int64_t>{4, 4}}}, "proj"},
           OpSpec{"flatten", {"y"}, {"f"}, {{"start_dim", int64_t{2}}}, ""}};
  std::string t = "f";
  if (transposed) {
    g.ops.push_back(
        OpSpec{"transpose", {"f"}, {"p"}, {{"dim0", int64_t{1}}, {"dim1", int64_t{2}}}, ""});
    t = "p";
  }
  g.ops.push_back(OpSpec{"exp", {t}, {"e"}, {}, ""});
  g.ops.push_back(OpSpec{"mean", {"e"}, {"loss"}, {}, ""});
  g.loss = "loss";
  g.traced_batch = 2;
  return g;
}

// Bytes allocated while op `kind` runs backward: the gradients it makes and its scratch.
int64_t BackwardAllocations(const Graph& g, const RunConfig& cfg, const std::string& kind) {
  const Schedule s = BuildSchedule(g, cfg, {}, ScheduleOptions{}).value();
  const StepContext* ctx = nullptr;
  int64_t bytes = 0;
  for (const Event& e : s.events) {
    if (e.kind == EventKind::kContext) ctx = &s.contexts[e.buffer];
    if (e.kind == EventKind::kAlloc && ctx != nullptr && ctx->phase == Phase::kBackward &&
        ctx->op >= 0 && g.ops[ctx->op].kind == kind) {
      bytes += e.bytes;
    }
  }
  return bytes;
}

TEST(GradLayoutTest, ConvolutionCopiesATransposedOutputGradient) {
  const Graph plain = BuildOpGraph(PatchEmbedding(false), enginetest::MakeContext(2)).value();
  const Graph viewed = BuildOpGraph(PatchEmbedding(true), enginetest::MakeContext(2)).value();
  for (Runtime runtime : {Runtime::kCpuTorch113, Runtime::kCuda}) {
    SCOPED_TRACE(runtime == Runtime::kCuda ? "cuda" : "cpu-1.13");
    RunConfig cfg = enginetest::PlainTraining();
    cfg.runtime = runtime;
    // cuDNN, oneDNN and the native kernels make grad_output contiguous: one output-sized copy
    // more than when the gradient comes back row-major.
    EXPECT_EQ(BackwardAllocations(viewed, cfg, "conv2d"),
              BackwardAllocations(plain, cfg, "conv2d") + kConvOut);
  }
  // On the CPU runtime the convolution's backward is the peak: the copy is live with its
  // scratch and the gradients it makes.
  RunConfig cfg = enginetest::PlainTraining();
  cfg.runtime = Runtime::kCpuTorch113;  // bytes as they are, no allocator rounding
  const PeakPoint p = PhasePeak(enginetest::Walk(plain, cfg), Phase::kBackward);
  const PeakPoint v = PhasePeak(enginetest::Walk(viewed, cfg), Phase::kBackward);
  EXPECT_EQ(p.op, "conv2d");
  EXPECT_EQ(v.op, "conv2d");
  EXPECT_EQ(v.allocated_bytes, p.allocated_bytes + kConvOut);
  EXPECT_EQ(Cat(v, Category::kTemporaries), Cat(p, Category::kTemporaries) + kConvOut);
}

TEST(GradLayoutTest, TheSeedGradientLivesUntilBackwardReturns) {
  RunConfig cfg = enginetest::PlainTraining();
  cfg.runtime = Runtime::kCpuTorch113;
  const Graph g = BuildOpGraph(PatchEmbedding(false), enginetest::MakeContext(2)).value();
  const Schedule s = BuildSchedule(g, cfg, {}, ScheduleOptions{}).value();
  // The seed is the first allocation of backward, before any op's backward runs.
  int seed = -1;
  bool seed_freed = false;
  int ops_after_free = 0, ops_before_free = 0;
  const StepContext* ctx = nullptr;
  for (const Event& e : s.events) {
    if (e.kind == EventKind::kContext) {
      ctx = &s.contexts[e.buffer];
      if (ctx->phase == Phase::kBackward && ctx->op >= 0) {
        ++(seed_freed ? ops_after_free : ops_before_free);
      }
      continue;
    }
    if (ctx == nullptr || ctx->phase != Phase::kBackward) continue;
    if (seed < 0 && e.kind == EventKind::kAlloc) {
      ASSERT_EQ(ctx->op, -1);
      EXPECT_EQ(e.bytes, 4);  // ones_like(loss), a float32 scalar
      seed = e.buffer;
    } else if (e.kind == EventKind::kFree && e.buffer == seed) {
      seed_freed = true;
    }
  }
  EXPECT_TRUE(seed_freed);
  EXPECT_EQ(ops_before_free, 4);  // mean, exp, flatten, conv2d: all ran with the seed alive
  EXPECT_EQ(ops_after_free, 0);
}

}  // namespace
}  // namespace memest
