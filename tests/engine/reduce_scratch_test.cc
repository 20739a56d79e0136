// A CUDA row sum's staging buffer (engine/rules/reduce_scratch.h) against what PyTorch 2.11
// allocated on an H200 (132 multiprocessors) for x.sum(0) of [N, C]
// (tests/validation/cuda_probe.py; tests/data/cuda/h200-torch2.11-probe.json): the measured bytes
// are the staging buffer and a 512-byte block for the semaphores, where the caching allocator
// hands the staging buffer out at its own size.
#include "engine/rules/reduce_scratch.h"

#include <gtest/gtest.h>

#include <string>

#include "engine/ir/graph.h"
#include "engine/rules/op_rules.h"

namespace memest {
namespace {

constexpr ReduceDevice kH200{132, 2048};

int64_t Staging(int64_t n, int64_t c) { return RowSumScratch(n, c, 4, 4, kH200).staging; }

TEST(ReduceScratchTest, RowSumsMatchTheH200) {
  EXPECT_EQ(Staging(1024, 512) + 512, 4'194'816);
  EXPECT_EQ(Staging(1024, 768) + 512, 6'291'968);
  EXPECT_EQ(Staging(2048, 768) + 512, 12'583'424);
  EXPECT_EQ(Staging(3152, 512) + 512, 13'107'712);
  EXPECT_EQ(Staging(4096, 1024) + 512, 33'554'944);
  EXPECT_EQ(Staging(8192, 512) + 512, 33'554'944);
  EXPECT_EQ(Staging(8192, 2048) + 512, 134'218'240);
  // Past the grid's 132 x 16 blocks the split is by rows: 132 MiB over this grid, and more for
  // more rows (256 MiB for 131072 x 4096: 128 blocks per output of 256 rows' work per thread).
  EXPECT_EQ(Staging(16384, 2048) + 512, 138'412'544);
  EXPECT_EQ(Staging(65536, 4096) + 512, 138'412'544);
  EXPECT_EQ(Staging(131072, 4096), int64_t{256} << 20);
  EXPECT_EQ(RowSumScratch(8192, 512, 4, 4, kH200).semaphores, 16);  // 4 B per 128 columns
}

// Short columns stay within one block: no staging (each thread would see fewer than 256 rows).
TEST(ReduceScratchTest, FewRowsNeedNoStaging) {
  EXPECT_EQ(Staging(1020, 4096), 0);
  EXPECT_GT(Staging(1021, 4096), 0);
  EXPECT_EQ(Staging(1, 4096), 0);
  EXPECT_EQ(Staging(100000, 1), 0);
}

// Past 32-bit offsets the sum runs in halves, one after the other: [153600, 4096] float32 (2.5 GB)
// is two [76800, 4096] sums of 75 blocks per output, not one of 150; a half sum keeps a float
// accumulator besides.
TEST(ReduceScratchTest, PastInt32OffsetsItRunsInHalves) {
  EXPECT_EQ(RowSumScratch(153600, 4096, 4, 4, kH200).staging, int64_t{4} * 4096 * 75 * 128);
  EXPECT_EQ(RowSumScratch(76800, 4096, 4, 4, kH200).staging, int64_t{4} * 4096 * 75 * 128);
  EXPECT_EQ(RowSumScratch(153600, 4096, 4, 4, kH200).accumulator, 0);
  EXPECT_EQ(RowSumScratch(307200, 4096, 2, 4, kH200).accumulator, 4096 * 4);
  EXPECT_EQ(RowSumScratch(76800, 4096, 2, 4, kH200).accumulator, 0);
}

// Fewer multiprocessors, fewer blocks per output where the grid's size binds: [16384, 4096] is
// split 66 ways on the H200 (2112 blocks over 32 output blocks) and 22 ways on an L4 (58
// multiprocessors of 1536 threads: 696 blocks).
TEST(ReduceScratchTest, TheGridFollowsTheDevice) {
  EXPECT_EQ(MaxThreadsPerMultiprocessor(89), 1536);
  EXPECT_EQ(MaxThreadsPerMultiprocessor(75), 1024);
  EXPECT_EQ(MaxThreadsPerMultiprocessor(90), 2048);
  const ReduceDevice l4{58, MaxThreadsPerMultiprocessor(89)};
  EXPECT_EQ(Staging(16384, 4096), int64_t{4} * 4096 * 66 * 128);
  EXPECT_EQ(RowSumScratch(16384, 4096, 4, 4, l4).staging, int64_t{4} * 4096 * 22 * 128);
}

// linear's backward sums its gradient's rows into the bias gradient: [32, 256, 2048] float32
// summed into [2048] is 8192 rows (nn.TransformerEncoder's linear1 at batch 32, sequence 256; a
// 128 MiB transient seen on the H200 in its backward). The CPU runtime has no such kernel.
TEST(ReduceScratchTest, ALinearsBiasGradientStages) {
  GraphBuilder b;
  const int x =
      b.Add1("mul", {b.Parameter("x", {32, 256, 512}, DType::kFloat32)}, {{"scalar", 1.0}});
  const int y = b.Add1("linear", {x, b.Parameter("w", {2048, 512}, DType::kFloat32),
                                  b.Parameter("b", {2048}, DType::kFloat32)});
  b.BeginLoss();
  b.SetLoss(b.Add1("sum", {y}));
  const Graph g = b.Finish().value();
  auto temps = [&](Runtime runtime) {
    const Op& op = g.ops[1];
    OpCall call{op, {}, {&g.tensors[op.outputs[0]]}, "", true, runtime};
    for (int t : op.inputs) call.inputs.push_back(&g.tensors[t]);
    int64_t bytes = 0;
    for (const Alloc& a : OpMemoryOf(call).backward_temps) bytes += a.bytes;
    return bytes;
  };
  EXPECT_EQ(temps(Runtime::kCuda), 134'217'728 + 64);
  EXPECT_EQ(temps(Runtime::kCpuTorch113), 0);
}

// A broadcast operand's gradient is a row sum too where it was broadcast along leading dims:
// Llama's RMSNorm weight (weight * x, [1024] against [4096, 1024]: the 32 MiB and 32-byte pairs
// in each norm's backward on the H200), a bias added by add. Broadcast along an inner dim
// ([4096, 1] against [4096, 1024]) it is another reduction, not modelled.
TEST(ReduceScratchTest, ABroadcastOperandsGradientStages) {
  auto temps = [](const char* kind, Shape operand) {
    GraphBuilder b;
    const int x = b.Parameter("x", {4096, 1024}, DType::kFloat32);
    const int w = b.Parameter("w", std::move(operand), DType::kFloat32);
    const int y = b.Add1(kind, {x, w});
    b.BeginLoss();
    b.SetLoss(b.Add1("sum", {y}));
    const Graph g = b.Finish().value();
    const Op& op = g.ops[0];
    OpCall call{op, {}, {&g.tensors[op.outputs[0]]}, "", true, Runtime::kCuda};
    for (int t : op.inputs) call.inputs.push_back(&g.tensors[t]);
    std::vector<int64_t> bytes;
    for (const Alloc& a : OpMemoryOf(call).backward_temps) bytes.push_back(a.bytes);
    return bytes;
  };
  const int64_t product = int64_t{4096} * 1024 * 4;  // mul's output-sized product before the sum
  EXPECT_EQ(temps("mul", {1024}), (std::vector<int64_t>{product, 33'554'432, 32}));
  EXPECT_EQ(temps("add", {1024}), (std::vector<int64_t>{33'554'432, 32}));
  EXPECT_EQ(temps("add", {1, 1024}), (std::vector<int64_t>{33'554'432, 32}));
  EXPECT_EQ(temps("add", {4096, 1}), std::vector<int64_t>{});
}

}  // namespace
}  // namespace memest
