// Byte arithmetic that cannot wrap: one test per place where sizes are summed (the checked sum
// itself, the tensor bound, the leaves of a graph, the allocator model's totals, the walk through
// it, the schedule's running sums) and the estimate end to end. Each of these used to wrap
// silently (signed overflow) into a negative or small answer.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>

#include "engine/estimator.h"
#include "engine/ir/graph.h"
#include "engine/ir/shape.h"
#include "engine/step/allocator.h"
#include "engine/step/liveness.h"
#include "engine/step/schedule.h"
#include "tests/engine/test_graphs.h"

namespace memest {
namespace {

constexpr int64_t kTensor = kMaxTensorBytes;  // 2^56: the largest tensor, 64 of them are 2^62
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

bool Contains(const Status& s, const std::string& text) {
  return s.message().find(text) != std::string::npos;
}

TEST(OverflowTest, AddBytesRefusesSumsPastTheBoundAndLeavesTheTotal) {
  int64_t total = kMaxBytes - 10;
  EXPECT_TRUE(AddBytes(&total, 10));
  EXPECT_EQ(total, kMaxBytes);
  EXPECT_FALSE(AddBytes(&total, 1));
  EXPECT_EQ(total, kMaxBytes);
  EXPECT_FALSE(AddBytes(&total, kInt64Max));  // would wrap int64 itself
  EXPECT_EQ(total, kMaxBytes);
  EXPECT_TRUE(AddBytes(&total, -kMaxBytes));
  EXPECT_EQ(total, 0);
  EXPECT_FALSE(AddBytes(&total, std::numeric_limits<int64_t>::min()));
  EXPECT_EQ(total, 0);
  EXPECT_FALSE(CheckedAdd(kMaxBytes, 1).ok());
  EXPECT_EQ(CheckedAdd(kMaxBytes - 1, 1).value(), kMaxBytes);
}

TEST(OverflowTest, OneTensorHoldsAtMostTwoToThe56Bytes) {
  EXPECT_EQ(CheckedBytes({int64_t{1} << 28, int64_t{1} << 26}, DType::kFloat32, "t").value(),
            kTensor);
  const Status over = CheckedBytes({int64_t{1} << 28, (int64_t{1} << 26) + 1}, DType::kFloat32,
                                   "model.tensors[2].shape")
                          .status();
  EXPECT_EQ(over.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(over, "model.tensors[2].shape")) << over.message();
  // Sizes whose product passes 2^62 are refused even when a 0 makes the tensor empty: the
  // unchecked Numel and an empty tensor's strides would wrap.
  EXPECT_FALSE(CheckedBytes({int64_t{1} << 40, int64_t{1} << 40, 0}, DType::kInt8, "t").ok());
  EXPECT_FALSE(CheckedBytes({0, int64_t{1} << 40, int64_t{1} << 40}, DType::kInt8, "t").ok());
  EXPECT_EQ(CheckedBytes({0, int64_t{1} << 40}, DType::kInt8, "t").value(), 0);
  const Status negative = CheckedBytes({2, -3}, DType::kFloat32, "x.shape").status();
  EXPECT_TRUE(Contains(negative, "x.shape[1]")) << negative.message();
  EXPECT_TRUE(CheckedBytes(Shape(kMaxRank, 1), DType::kFloat32, "t").ok());
  const Status deep = CheckedBytes(Shape(kMaxRank + 1, 1), DType::kFloat32, "y.shape").status();
  EXPECT_TRUE(Contains(deep, "y.shape: has 65 dims")) << deep.message();
}

TEST(OverflowTest, TheLeavesOfAGraphHoldAtMostTwoToThe62Bytes) {
  GraphBuilder b;
  for (int i = 0; i < 64; ++i) b.Parameter("w" + std::to_string(i), {kTensor}, DType::kInt8);
  ASSERT_TRUE(b.ok()) << b.status().message();  // exactly 2^62
  b.SetErrorContext("model.tensors[64]");
  b.Parameter("one_more", {1}, DType::kInt8);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(b.status(), "model.tensors[64]")) << b.status().message();
  EXPECT_TRUE(Contains(b.status(), "2^62")) << b.status().message();
}

TEST(OverflowTest, AllocatorRefusesAReservedTotalPastTheBound) {
  for (bool expandable : {false, true}) {
    CachingAllocatorModel a(expandable);
    int granted = 0;
    while (a.Malloc(kTensor) >= 0) ++granted;
    // 2^56 is a multiple of 2 MiB segments, but not of expandable segments' 20 MiB pages.
    EXPECT_EQ(granted, expandable ? 63 : 64);
    const int64_t reserved = a.reserved(), allocated = a.allocated();
    EXPECT_LE(reserved, kMaxBytes);
    EXPECT_EQ(a.Malloc(kTensor), -1) << "refused for good";
    EXPECT_EQ(a.reserved(), reserved) << "a refused request changes nothing";
    EXPECT_EQ(a.allocated(), allocated);
  }
  CachingAllocatorModel a;
  EXPECT_EQ(a.Malloc(-1), -1);
  EXPECT_EQ(a.Malloc(kInt64Max), -1);
  EXPECT_EQ(a.reserved(), 0);
  // A request that fits a cached block needs no new reserve, even at the bound.
  CachingAllocatorModel full;
  int last = -1;
  for (int i = 0; i < 64; ++i) last = full.Malloc(kTensor);
  full.Free(last);
  EXPECT_GE(full.Malloc(kTensor), 0);
  EXPECT_EQ(full.reserved(), kMaxBytes);
}

// A schedule written by hand: one op context, then `count` allocations of 2^56 bytes.
Schedule ManyAllocations(int count) {
  Schedule s;
  s.contexts.push_back({Phase::kForward, 0, 0, false});
  s.events.push_back({EventKind::kContext, Category::kTemporaries, 0, 0});
  for (int i = 0; i < count; ++i) {
    s.events.push_back({EventKind::kAlloc, Category::kActivations, i, kTensor});
  }
  s.num_buffers = count;
  return s;
}

Graph OneOp() {
  GraphBuilder b;
  b.PushScope("blocks.3");
  const int x = b.Input("x", {4}, DType::kFloat32);
  b.Add1("relu", {x});
  return b.Finish().value();
}

TEST(OverflowTest, WalkRefusesMoreThanTwoToThe62BytesAtOnceNamingTheOp) {
  const Graph g = OneOp();
  for (Accounting accounting : {Accounting::kCachingAllocator, Accounting::kExact}) {
    StatusOr<Liveness> ok = WalkSchedule(ManyAllocations(64), g, false, accounting);
    ASSERT_TRUE(ok.ok()) << ok.status().message();
    EXPECT_EQ(ok->peak.allocated_bytes, kMaxBytes);
    EXPECT_EQ(ok->peak.by_category[static_cast<int>(Category::kActivations)], kMaxBytes);
    StatusOr<Liveness> over = WalkSchedule(ManyAllocations(65), g, false, accounting);
    ASSERT_FALSE(over.ok());
    EXPECT_EQ(over.status().code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(Contains(over.status(), "forward, op relu in blocks.3")) << over.status().message();
  }
}

// x [2^54] float32 (2^56 bytes) through `n` relus in one scope: each output is freed as the next
// op consumes it (inference), so at most two are live, but the scope's row sums all n outputs.
Graph ReluChain(int n, Mode mode) {
  GraphBuilder b;
  b.PushScope("chain");
  int x = b.Input("x", {int64_t{1} << 54}, DType::kFloat32, -1);
  const int w = b.Parameter("w", {1}, DType::kFloat32);
  x = b.Add1("mul", {x, w});  // gives the chain a gradient to compute in training
  for (int i = 0; i < n; ++i) x = b.Add1("relu", {x});
  if (mode == Mode::kTraining) {
    b.BeginLoss();
    b.SetLoss(b.Add1("sum", {x}));
  }
  return b.Finish().value();
}

TEST(OverflowTest, ScheduleRefusesALayerRowSumPastTheBound) {
  RunConfig c = enginetest::PlainTraining();
  c.mode = Mode::kInference;
  StatusOr<Report> fine = EstimateGraph(ReluChain(8, Mode::kInference), c);
  ASSERT_TRUE(fine.ok()) << fine.status().message();
  StatusOr<Report> over = EstimateGraph(ReluChain(70, Mode::kInference), c);
  ASSERT_FALSE(over.ok()) << "70 outputs of 2^56 bytes in one row";
  EXPECT_EQ(over.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(over.status(), "a sum of bytes the step keeps")) << over.status().message();
  EXPECT_TRUE(Contains(over.status(), "in chain")) << over.status().message();
}

TEST(OverflowTest, ScheduleRefusesSavedBytesPastTheBound) {
  // Training: relu saves its output, so all 70 stay held for backward: the running total of
  // saved bytes passes 2^62 while the schedule is built, before any walk.
  const Graph g = ReluChain(70, Mode::kTraining);
  StatusOr<Schedule> s = BuildSchedule(g, enginetest::PlainTraining(), {}, {});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s.status(), "forward, op relu in chain")) << s.status().message();
}

TEST(OverflowTest, EstimateOfAStepPastTheBoundIsAnErrorNotAWrappedNumber) {
  // An MLP of width 2^24 at a batch of 2^24: every tensor fits, the step does not.
  RunConfig c;
  c.batch_size = int64_t{1} << 24;
  c.optimizer.kind = OptimizerKind::kAdam;
  ModelSpec model{PresetSpec{"mlp", {{"width", int64_t{1} << 24}, {"layers", 1100}}}};
  StatusOr<Report> r = Estimate(model, c, EstimateOptions{1'000'000, false});
  ASSERT_FALSE(r.ok()) << "peak " << r->peak.allocated_bytes;
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(r.status(), "would pass 2^62 bytes (4 EiB) (forward, op"))
      << r.status().message();
}

// An empty parameter [2^62, 0] holds no byte, but Adafactor's factored state of it does: row
// variances [2^62, 1], 2^64 bytes in float32, which wrapped to 0 and let the estimate through.
TEST(OverflowTest, OptimizerStateOfAnEmptyParameterIsCheckedNotWrapped) {
  for (OptimizerKind kind : {OptimizerKind::kAdafactor, OptimizerKind::kHfAdafactor}) {
    GraphBuilder b;
    b.PushScope("head");
    const int x = b.Input("x", {4}, DType::kFloat32);
    const int w = b.Parameter("w", {int64_t{1} << 62, 0}, DType::kFloat32);
    const int y = b.Add1("mul", {x, b.Add1("sum", {w})});
    b.BeginLoss();
    b.SetLoss(b.Add1("sum", {y}));
    RunConfig c = enginetest::PlainTraining();
    c.optimizer.kind = kind;
    StatusOr<Report> r = EstimateGraph(b.Finish().value(), c);
    ASSERT_FALSE(r.ok()) << OptimizerKindName(kind) << ": optimizer state "
                         << r->end_of_step[static_cast<int>(Category::kOptimizerState)];
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(Contains(r.status(), "2^62")) << r.status().message();
  }
}

// Op attributes and the scratch rules form from them: refused with the field, never wrapped.
TEST(OverflowTest, RulesRefuseSizesTheyCannotRepresent) {
  auto refusal = [](auto build) {
    GraphBuilder b;
    b.SetErrorContext("model.ops[1]");
    build(b);
    return b.status();
  };
  // split sizes that add up past 2^62 (and so to no tensor's size).
  Status s = refusal([](GraphBuilder& b) {
    const int x = b.Input("x", {8}, DType::kFloat32);
    b.Add("split", {x}, {{"sizes", std::vector<int64_t>{kInt64Max, kInt64Max, 10}}});
  });
  EXPECT_TRUE(Contains(s, "model.ops[1].attrs.sizes")) << s.message();
  // cat of many inputs whose sizes add up past 2^62 along the dim.
  s = refusal([](GraphBuilder& b) {
    const int x = b.Input("x", {int64_t{1} << 56}, DType::kBool, -1);
    b.Add("cat", std::vector<int>(70, x));
  });
  EXPECT_TRUE(Contains(s, "model.ops[1].inputs[64]: the concatenation")) << s.message();
  // The [L, S] attention scores of the math form: q and k fit, their product does not.
  s = refusal([](GraphBuilder& b) {
    const int q = b.Input("q", {int64_t{1} << 40, 1}, DType::kFloat32, -1);
    b.Add("scaled_dot_product_attention", {q, q, q});
  });
  EXPECT_TRUE(Contains(s, "model.ops[1]: its attention scores")) << s.message();
  // A convolution's window span (dilation x kernel) and its unfolded input (im2col).
  s = refusal([](GraphBuilder& b) {
    const int x = b.Input("x", {1, 1, 8}, DType::kFloat32, -1);
    const int w = b.Parameter("w", {1, 1, int64_t{1} << 40}, DType::kInt8);
    b.Add("conv1d", {x, w}, {{"dilation", int64_t{1} << 30}});
  });
  EXPECT_FALSE(s.ok());
  s = refusal([](GraphBuilder& b) {
    const int x = b.Input("x", {1, 1, 8}, DType::kFloat32, -1);
    const int w = b.Parameter("w", {1, 1, 3}, DType::kFloat32);
    b.Add("conv1d", {x, w}, {{"padding", kInt64Max}});
  });
  EXPECT_TRUE(Contains(s, "model.ops[1].attrs.padding: must be at most 2147483647"))
      << s.message();
  s = refusal([](GraphBuilder& b) {
    const int x = b.Input("x", {1, 1, int64_t{1} << 30}, DType::kFloat32, -1);
    const int w = b.Parameter("w", {1, 1, int64_t{1} << 28}, DType::kFloat32);
    b.Add("conv1d", {x, w}, {{"padding", int64_t{1} << 29}});
  });
  EXPECT_TRUE(Contains(s, "model.ops[1]: its unfolded input")) << s.message();
}

// A 0-dim tensor has no dim to slice, split or concatenate along: refused, not indexed (found by
// fuzzing: fuzz/regressions/ubsan-index-split-of-a-0-dim-tensor.pb).
TEST(OverflowTest, DimOpsRefuseAZeroDimTensor) {
  for (const char* kind : {"slice", "split", "cat"}) {
    GraphBuilder b;
    b.SetErrorContext("model.ops[0]");
    const int w = b.Buffer("w", {}, DType::kFloat32);
    b.Add(kind, {w}, {{"sizes", std::vector<int64_t>{1}}});
    EXPECT_TRUE(Contains(b.status(), "model.ops[0].inputs[0]")) << kind << ": " << b.status().message();
  }
}

TEST(OverflowTest, LayerAttributesAreAtMostTwoToThe31) {
  LayerModelSpec spec;
  spec.input_shape = {3, 32, 32};
  spec.layers = {{"conv2d", "c", {{"out_channels", int64_t{8}}, {"kernel_size", int64_t{3}},
                                  {"padding", kInt64Max}}}};
  StatusOr<Graph> g = BuildLayerModel(spec, enginetest::MakeContext(2));
  ASSERT_FALSE(g.ok());
  EXPECT_TRUE(Contains(g.status(), "model.layers[0].attrs.padding: must be at most"))
      << g.status().message();
}

}  // namespace
}  // namespace memest
