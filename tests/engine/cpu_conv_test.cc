// The CPU convolution rule (engine/rules/cpu_conv.h) against allocation sequences measured with
// torch.profiler on PyTorch 1.13 (Debian, oneDNN 2.6.3, one thread): one case per kernel path
// and ISA, picked from the grids in tests/conformance/conv_scratch/RULE.md (the AVX2 ones with
// ONEDNN_MAX_CPU_ISA=AVX2). Each sequence is +bytes for an allocation, -bytes for a free.
#include "engine/rules/cpu_conv.h"
#include "engine/rules/cpu_conv_kernels.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/estimator.h"
#include "engine/rules/op_rules.h"
#include "tests/engine/test_graphs.h"

namespace memest {
namespace {

struct Measured {
  const char* what;
  CpuIsa isa;
  CpuConvProblem problem;  // n ci co groups h w kh kw oh ow sh sw ph pw dh dw bytes bias xg wg
                           // [transposed channels_last]
  std::vector<int64_t> forward, backward;
};

const std::vector<Measured>& MeasuredCases() {
  static const std::vector<Measured> cases = {
    {"avx512: THNN 3x3 N=1 small", CpuIsa::kAvx512,
     {1, 3, 8, 1, 12, 12, 3, 3, 12, 12, 1, 1, 1, 1, 1, 1, 4, true, true, true},
     {15552, 4608, -15552},
     {1728, 32, 864, 15552, -15552}},
    {"avx512: THNN dilated N=1", CpuIsa::kAvx512,
     {1, 16, 15, 1, 12, 12, 3, 3, 12, 12, 1, 1, 2, 2, 2, 2, 4, true, true, true},
     {8640, 82944, -82944},
     {9216, 8640, 60, 82944, 60, -60, -82944}},
    {"avx512: THNN depthwise 1x1", CpuIsa::kAvx512,
     {2, 16, 16, 16, 10, 10, 1, 1, 10, 10, 1, 1, 0, 0, 1, 1, 4, true, true, true},
     {800, 800, -800, 800, 800, -800, 800, 800, -800, 800, 800, -800, 800, 800, -800, 800, 800, -800, 800, 800, -800, 800, 800, -800, 800, 800, -800, 800, 800, -800, 800, 800, -800, 800, 800, -800, 800, 800, -800, 800, 800, -800, 800, 800, -800, 800, 800, -800, 12800, -800, -800, -800, -800, -800, -800, -800, -800, -800, -800, -800, -800, -800, -800, -800, -800},
     {800, 800, 800, 4, 4, -800, -800, 800, 800, 800, 4, 4, -800, -800, 800, 800, 800, 4, 4, -800, -800, 800, 800, 800, 4, 4, -800, -800, 800, 800, 800, 4, 4, -800, -800, 800, 800, 800, 4, 4, -800, -800, 800, 800, 800, 4, 4, -800, -800, 800, 800, 800, 4, 4, -800, -800, 800, 800, 800, 4, 4, -800, -800, 800, 800, 800, 4, 4, -800, -800, 800, 800, 800, 4, 4, -800, -800, 800, 800, 800, 4, 4, -800, -800, 800, 800, 800, 4, 4, -800, -800, 800, 800, 800, 4, 4, -800, -800, 800, 800, 800, 4, 4, -800, -800, 800, 800, 800, 4, 4, -800, -800, 12800, 64, 64, -4, -4, -4, -4, -4, -4, -4, -4, -4, -4, -4, -4, -4, -4, -4, -4, -4, -4, -4, -4, -4, -4, -4, -4, -4, -4, -4, -4, -4, -4, -4, -4, -800, -800, -800, -800, -800, -800, -800, -800, -800, -800, -800, -800, -800, -800, -800, -800}},
    {"avx512: jit blocked", CpuIsa::kAvx512,
     {2, 16, 17, 1, 9, 9, 3, 3, 9, 9, 1, 1, 1, 1, 1, 1, 4, true, true, true},
     {256, 10368, 18432, 20736, -18432, -10368, -256, 11016, -20736},
     {20736, 18432, 10368, -18432, -20736, 10368, -10368, 20736, 10368, 18432, 256, 68, -256, -10368, -20736, 68, 9792, -18432, -68}},
    {"avx512: first conv, the brief", CpuIsa::kAvx512,
     {4, 3, 8, 1, 9, 9, 3, 3, 9, 9, 1, 1, 1, 1, 1, 1, 4, false, true, true},
     {1728, 20736, -1728, 10368, -20736},
     {20736, 9216, 20736, -9216, -20736, 3888, -20736, 20736, 1728, -20736, 864, -1728}},
    {"avx512: avx2 fallback Ci 4..15", CpuIsa::kAvx512,
     {2, 8, 32, 1, 12, 12, 3, 3, 5, 5, 2, 2, 0, 0, 1, 1, 4, true, true, true},
     {9216, 6400, -9216, 6400, -6400},
     {6400, 18432, 18432, -18432, -6400, 9216, -18432, 6400, 9216, 9216, 128, -9216, -6400, 128, 9216, -9216, -128}},
    {"avx512: 1x1 rtus", CpuIsa::kAvx512,
     {2, 16, 32, 1, 12, 12, 1, 1, 6, 6, 2, 2, 0, 0, 1, 1, 4, false, true, true},
     {2432, 18432, 2048, 9216, -2048, -18432, -2432, 9216, -9216},
     {9216, 2048, 18432, 2432, -2432, -2048, -9216, 18432, -18432, 9216, 18432, 2048, 2432, -2432, -18432, -9216, 2048, -2048}},
    {"avx512: 1x1 pad gemm", CpuIsa::kAvx512,
     {2, 16, 8, 1, 12, 12, 1, 1, 7, 7, 2, 2, 1, 1, 1, 1, 4, true, true, true},
     {3264, 3136, -3264, 3136, -3136},
     {18432, 3264, -3264, 18432, -18432, 512, 5440, 32, -5440, 32, 512, -512, -32}},
    {"avx512: depthwise jit", CpuIsa::kAvx512,
     {2, 17, 17, 17, 10, 10, 3, 3, 10, 10, 1, 1, 1, 1, 1, 1, 4, true, true, true},
     {256, 25600, 1152, 25600, -1152, -25600, -256, 13600, -25600},
     {25600, 1152, 25600, -1152, -25600, 13600, -25600, 25600, 25600, 1152, 68, -25600, -25600, 68, 612, -1152, -68}},
    {"avx512: grouped 4 per group", CpuIsa::kAvx512,
     {2, 8, 16, 2, 10, 10, 3, 3, 10, 10, 1, 1, 1, 1, 1, 1, 4, false, true, true},
     {6400, 2304, 12800, -2304, -6400, 12800, -12800},
     {12800, 2304, 6400, -2304, -12800, 6400, -6400, 2304, 23872, -23872, 2304, -2304}},
    {"avx512: 1-D conv", CpuIsa::kAvx512,
     {2, 16, 1, 1, 1, 10, 1, 3, 1, 8, 1, 1, 0, 0, 1, 1, 4, false, false, true},
     {1280, 3072, 1024, -3072, -1280, 64, -1024},
     {1024, 1280, 3072, -1280, -1024, 192, -3072}},
    // Boundary conditions of oneDNN's kernels (mkgrid.py boundary): each refuses, gemm runs.
    {"avx512: ASPP, dilation 12 on 4x4: gemm, im2col blocked to L2", CpuIsa::kAvx512,
     {2, 960, 256, 1, 4, 4, 3, 3, 4, 4, 1, 1, 12, 12, 12, 12, 4, false, true, true},
     {28928, 32768, -28928, 32768, -32768},
     {122880, 553088, -553088, 122880, -122880, 8847360, 35942656, -35942656, 8847360, -8847360}},
    {"avx512: depthwise 5x5: bwd-weights gemm", CpuIsa::kAvx512,
     {2, 120, 120, 120, 8, 8, 5, 5, 8, 8, 1, 1, 2, 2, 1, 1, 4, false, true, true},
     {65536, 12800, 65536, -12800, -65536, 61440, -65536},
     {65536, 12800, 65536, -12800, -65536, 61440, -65536, 12000, 54656, -54656, 12000, -12000}},
    {"avx512: depthwise dilated: bwd gemm", CpuIsa::kAvx512,
     {2, 672, 672, 672, 4, 4, 5, 5, 4, 4, 1, 1, 4, 4, 2, 2, 4, false, true, true},
     {86016, 67200, 86016, -67200, -86016, 86016, -86016},
     {86016, 1728, -1728, 86016, -86016, 67200, 270656, -270656, 67200, -67200}},
    {"avx512: gemm bwd im2col over the scratchpad limit", CpuIsa::kAvx512,
     {1, 160, 16, 1, 16, 16, 5, 5, 22, 22, 1, 1, 27, 27, 12, 12, 4, true, true, true},
     {387328, 30976, -387328, 30976, -30976},
     {163840, 672128, -672128, 163840, -163840, 256000, 1296256, 64, -1296256, 64, 256000, -256000, -64}},
    {"avx2: depthwise 5x5: bwd-weights gemm", CpuIsa::kAvx2,
     {1, 16, 16, 16, 8, 8, 5, 5, 6, 6, 1, 1, 1, 1, 1, 1, 4, true, true, true},
     {4096, 1600, 2304, -1600, -4096, 2304, -2304},
     {2304, 1600, 4096, -1600, -2304, 4096, -4096, 1600, 10256, 64, -10256, 64, 1600, -1600, -64}},
    {"avx2: ASPP-like dilation: gemm", CpuIsa::kAvx2,
     {2, 256, 256, 1, 4, 4, 3, 3, 4, 4, 1, 1, 24, 24, 24, 24, 4, false, true, true},
     {24320, 32768, -24320, 32768, -32768},
     {32768, 147584, -147584, 32768, -32768, 2359296, 9584896, -9584896, 2359296, -2359296}},
    // Channels-last inputs (mkgrid.py channels_last; the backward ends with AccumulateGrad's
    // copy of a channels-last weight gradient, added below where the rule reports one).
    {"avx512 channels-last: depthwise 7x7 (brdgmm; weight gradient 16x16 per group)", CpuIsa::kAvx512,
     {2, 96, 96, 96, 16, 16, 7, 7, 16, 16, 1, 1, 3, 3, 1, 1, 4, true, true, true, false, true},
     {196608, 4224, 18816, -18816, -4224},
     {196608, 18816, -18816, 4816896, 6272, 384, -6272, 384, 18816, 18816, -18816, -4816896, -384}},
    {"avx512 channels-last: 2x2 stride 2 (brgconv; weight copied)", CpuIsa::kAvx512,
     {2, 16, 16, 1, 16, 16, 2, 2, 8, 8, 2, 2, 0, 0, 1, 1, 4, true, true, true, false, true},
     {4096, 8192, 8192, 4096, -4096, -8192, -4096},
     {4096, 32768, 4096, -4096, 4096, 64, 64, 4096, 4096, -4096, -4096, -64, -4096, 4096, -4096}},
    {"avx512 channels-last: native 3x3 (weight copied around im2col)", CpuIsa::kAvx512,
     {1, 32, 40, 1, 16, 16, 3, 3, 16, 16, 1, 1, 1, 1, 1, 1, 4, true, true, true, false, true},
     {46080, 294912, 40960, -294912, -46080},
     {46080, 32768, 160, 46080, 294912, -294912, -46080, 46080, -46080}},
    {"avx2: jit blocked", CpuIsa::kAvx2,
     {2, 16, 17, 1, 9, 9, 3, 3, 9, 9, 1, 1, 1, 1, 1, 1, 4, true, true, true},
     {224, 10368, 13824, 15552, -13824, -10368, -224, 11016, -15552},
     {15552, 13824, 10368, -13824, -15552, 10368, -10368, 15552, 10368, 13824, 224, 68, -224, -10368, -15552, 68, 9792, -13824, -68}},
    {"avx2: first conv fwd, flat bwd-weights Ci=3", CpuIsa::kAvx2,
     {4, 3, 8, 1, 9, 9, 3, 3, 9, 9, 1, 1, 1, 1, 1, 1, 4, false, false, true},
     {864, 10368, -864, 10368, -10368},
     {10368, 864, -10368, 864, -864}},
    {"avx2: Ci=1 blocked bwd-weights", CpuIsa::kAvx2,
     {2, 1, 64, 1, 9, 9, 3, 3, 9, 9, 1, 1, 1, 1, 1, 1, 4, false, true, true},
     {2304, 41472, -2304, 41472, -41472},
     {41472, 18432, 5184, -18432, -41472, 648, -5184, 41472, 5184, 18432, -5184, -41472, 2304, -18432}},
    {"avx2: 1x1 rtus: 144 channels in bwd data", CpuIsa::kAvx2,
     {2, 16, 32, 1, 12, 12, 1, 1, 6, 6, 2, 2, 0, 0, 1, 1, 4, false, true, true},
     {2432, 18432, 2048, 9216, -2048, -18432, -2432, 9216, -9216},
     {9216, 2048, 18432, 20864, -20864, -2048, -9216, 18432, -18432, 9216, 18432, 2048, 2432, -2432, -18432, -9216, 2048, -2048}},
    {"avx2: bwd-data gemm: strided 1-D", CpuIsa::kAvx2,
     {4, 8, 17, 1, 1, 10, 1, 3, 1, 4, 1, 2, 0, 0, 1, 1, 4, false, true, true},
     {1280, 2304, 1536, -2304, -1280, 1088, -1536},
     {1280, 512, -512, 1280, -1280, 1536, 1280, 2304, -1280, -1536, 1632, -2304}},
    {"avx2: bwd-data gemm: tails", CpuIsa::kAvx2,
     {2, 16, 16, 1, 12, 12, 3, 3, 5, 5, 2, 2, 0, 0, 1, 1, 4, true, true, true},
     {18432, 9216, 3200, -9216, -18432, 3200, -3200},
     {18432, 14528, -14528, 18432, -18432, 3200, 18432, 9216, 64, -18432, -3200, 64, 9216, -9216, -64}},
    {"avx2: dilated: bwd-weights gemm", CpuIsa::kAvx2,
     {2, 16, 17, 1, 12, 12, 3, 3, 12, 12, 1, 1, 2, 2, 2, 2, 4, true, true, true},
     {224, 18432, 13824, 27648, -13824, -18432, -224, 19584, -27648},
     {27648, 13824, 18432, -13824, -27648, 18432, -18432, 9792, 122368, 68, -122368, 68, 9792, -9792, -68}},
    {"avx2: tiny input: bwd-weights gemm", CpuIsa::kAvx2,
     {2, 32, 32, 1, 2, 2, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 4, false, true, true},
     {1024, 36864, 1024, -36864, -1024, 1024, -1024},
     {1024, 36864, 1024, -36864, -1024, 1024, -1024, 36864, 152320, -152320, 36864, -36864}},
    {"avx2: depthwise", CpuIsa::kAvx2,
     {2, 17, 17, 17, 10, 10, 3, 3, 10, 10, 1, 1, 1, 1, 1, 1, 4, true, true, true},
     {224, 19200, 864, 19200, -864, -19200, -224, 13600, -19200},
     {19200, 864, 19200, -864, -19200, 13600, -19200, 19200, 19200, 864, 68, -19200, -19200, 68, 612, -864, -68}},
  };
  return cases;
}

TEST(CpuConvTest, PredictsMeasuredAllocationSequences) {
  for (const Measured& m : MeasuredCases()) {
    CpuConvTrace t = CpuConvAllocations(m.problem, m.isa);
    if (t.weight_grad_channels_last) {  // the engine's AccumulateGrad copy, measured with it
      const CpuConvProblem& p = m.problem;
      const int64_t w = p.co * (p.ci / p.groups) * p.kh * p.kw * p.element_bytes;
      t.backward.insert(t.backward.end(), {w, -w});
    }
    EXPECT_EQ(t.forward, m.forward) << m.what;
    EXPECT_EQ(t.backward, m.backward) << m.what;
  }
}

CpuConvProblem Conv3x3(int64_t n, int64_t ci, int64_t co, int64_t size) {
  CpuConvProblem p;
  p.n = n;
  p.ci = ci;
  p.co = co;
  p.h = p.w = p.oh = p.ow = size;
  p.kh = p.kw = 3;
  p.pad_h = p.pad_w = 1;
  p.input_grad = p.weight_grad = true;
  return p;
}

// gemm's im2col buffer is blocked to the per-core L2 cache: DeepLab's ASPP convolution (512
// channels, 3x3 dilated by 6 on a 4x4 map) takes 256 of its channels at a time with oneDNN's
// default 512 KiB, all 512 with a Sapphire Rapids core's 2 MiB (measured there: 147,456 bytes
// more at the forward peak, 256 channels x 9 x 16 pixels x 4 bytes).
TEST(CpuConvTest, TheIm2colBlockFollowsTheL2Cache) {
  CpuConvProblem p = Conv3x3(2, 512, 16, 4);
  p.pad_h = p.pad_w = 6;
  p.dil_h = p.dil_w = 6;
  const int64_t blocked = GemmForwardColumns(p, CpuIsa::kAvx512);
  p.l2_bytes = 2 << 20;
  EXPECT_EQ(GemmForwardColumns(p, CpuIsa::kAvx512) - blocked, 256 * 9 * 16);
}

// ConvParams::use_mkldnn with one thread: a 1x1 stride-1 convolution stays native below a batch
// of 16 (its only allocation is the output), and goes to oneDNN's jit_1x1 from 16 on.
TEST(CpuConvTest, OneByOneStrideOneIsNativeBelowABatchOf16) {
  CpuConvProblem p;
  p.ci = 32;
  p.co = 64;
  p.h = p.w = p.oh = p.ow = 8;
  p.weight_grad = true;
  for (int64_t n : {1, 15}) {
    p.n = n;
    const CpuConvTrace t = CpuConvAllocations(p, CpuIsa::kAvx512);
    EXPECT_EQ(t.forward, std::vector<int64_t>{n * 64 * 64 * 4}) << n;
    EXPECT_STREQ(t.forward_kernel, "native im2col");
  }
  p.n = 16;
  EXPECT_STREQ(CpuConvAllocations(p, CpuIsa::kAvx512).forward_kernel, "oneDNN jit 1x1");
}

// float64 never reaches oneDNN: slow_conv2d's im2col over the batch, in 8-byte elements.
TEST(CpuConvTest, Float64RunsTheNativeKernel) {
  CpuConvProblem p = Conv3x3(2, 4, 8, 6);
  p.element_bytes = 8;
  const int64_t cols = 2 * 4 * 9 * 36 * 8, y = 2 * 8 * 36 * 8;
  EXPECT_EQ(CpuConvAllocations(p, CpuIsa::kAvx512).forward,
            (std::vector<int64_t>{cols, y, -cols}));
}

// Only the gradients asked for are computed: no data part without an input gradient, no weight
// part without a weight gradient.
TEST(CpuConvTest, BackwardRunsOnlyTheNeededParts) {
  CpuConvProblem p = Conv3x3(4, 16, 16, 8);
  const int64_t x = 4 * 16 * 64 * 4, w = 16 * 16 * 9 * 4;
  p.weight_grad = false;
  EXPECT_EQ(PeakOfEvents(CpuConvAllocations(p, CpuIsa::kAvx512).backward).net, x);
  p.weight_grad = true;
  p.input_grad = false;
  EXPECT_EQ(PeakOfEvents(CpuConvAllocations(p, CpuIsa::kAvx512).backward).net, w);
}

TEST(CpuConvTest, PeakOfEventsIsTheHighestRunningTotal) {
  const EventPeak e = PeakOfEvents({100, 50, -100, 30, -50});
  EXPECT_EQ(e.peak, 150);
  EXPECT_EQ(e.net, 30);
  EXPECT_EQ(PeakOfEvents({}).peak, 0);
}

// The conv2d rule on the CPU runtime: one forward temporary that takes the op from its output
// to the measured high-water mark, one backward temporary above the fresh gradients; the CUDA
// runtime models no convolution scratch, and the ISA changes the answer.
TEST(CpuConvTest, ConvRuleCarriesTheScratchOnTheCpuRuntimeOnly) {
  GraphBuilder b;
  const int x = b.Input("x", {4, 3, 16, 16}, DType::kFloat32);
  const int w = b.Parameter("w", {8, 3, 3, 3}, DType::kFloat32);
  const int y = b.Add1("conv2d", {x, w}, {{"padding", int64_t{1}}});
  b.BeginLoss();
  b.SetLoss(b.Add1("sum", {y}));
  const Graph g = b.Finish().value();
  auto memory = [&](Runtime runtime, CpuIsa isa) {
    const Op& op = g.ops[0];
    OpCall call{op, {&g.tensors[op.inputs[0]], &g.tensors[op.inputs[1]]},
                {&g.tensors[op.outputs[0]]}, "", true, runtime, isa};
    return OpMemoryOf(call);
  };
  // RULE.md's example: x[4,3,16,16] w[8,3,3,3] p1 runs oneDNN's first-conv kernel.
  // forward: +1728 (weights Ohwi16o) +65536 (16-channel result) -1728 +32768 (the output) -65536:
  // the peak, 98304, is the blocked result beside the output.
  const OpMemory cpu = memory(Runtime::kCpuTorch113, CpuIsa::kAvx512);
  ASSERT_EQ(cpu.forward_temps.size(), 1u);
  EXPECT_EQ(cpu.forward_temps[0].bytes, 65536);
  // backward, weight only: +65536 (diff_dst reordered) +1728 (weights) -65536 +864 (gradient)
  // -1728: its peak 67264 above the 864-byte fresh weight gradient.
  ASSERT_EQ(cpu.backward_temps.size(), 1u);
  EXPECT_EQ(cpu.backward_temps[0].bytes, 65536 + 1728 - 864);
  const OpMemory avx2 = memory(Runtime::kCpuTorch113, CpuIsa::kAvx2);
  EXPECT_EQ(avx2.forward_temps[0].bytes, 32768);  // 8-channel blocks: 8 channels, no padding
  const OpMemory cuda = memory(Runtime::kCuda, CpuIsa::kAvx512);
  EXPECT_TRUE(cuda.forward_temps.empty());
  EXPECT_TRUE(cuda.backward_temps.empty());
}

// The whole estimate: the CPU runtime's peak includes the convolution scratch, and the report
// says which ISA it assumed.
TEST(CpuConvTest, EstimateIncludesTheScratchAndNamesTheIsa) {
  GraphBuilder b;
  const int x = b.Input("x", {4, 8, 12, 12}, DType::kFloat32);
  const int w = b.Parameter("w", {8, 8, 3, 3}, DType::kFloat32);
  const int y = b.Add1("conv2d", {x, w}, {{"padding", int64_t{1}}});
  b.BeginLoss();
  b.SetLoss(b.Add1("sum", {y}));
  const Graph g = b.Finish().value();
  RunConfig c;
  c.batch_size = 4;
  c.optimizer.kind = OptimizerKind::kSgd;
  c.runtime = Runtime::kCpuTorch113;
  auto estimate = [&](CpuIsa isa) {
    c.cpu_isa = isa;
    StatusOr<Report> r = EstimateGraph(g, c);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return *r;
  };
  const Report avx512 = estimate(CpuIsa::kAvx512);
  const Report avx2 = estimate(CpuIsa::kAvx2);
  // AVX2 blocks 8 channels by 8: its copies are as large as the tensors. AVX-512 runs its
  // first-conv kernel, with the output padded to 16 channels. (Backward, the step's peak, is
  // the same on both: sum's expanded gradient copied contiguous, then the same kernels.)
  auto forward = [](const Report& r) {
    for (const PeakPoint& p : r.phases) {
      if (p.phase == Phase::kForward) return p.allocated_bytes;
    }
    return int64_t{0};
  };
  const int64_t plain_peak = 4 * 8 * 144 * 4 * 2 + 8 * 8 * 9 * 4;  // x, y and the weight
  EXPECT_GT(forward(avx2), plain_peak);
  EXPECT_GT(forward(avx512), forward(avx2));
  auto has_note = [](const Report& r, const std::string& text) {
    for (const std::string& n : r.notes) {
      if (n.find("CPU convolutions") != std::string::npos && n.find(text) != std::string::npos) {
        return true;
      }
    }
    return false;
  };
  EXPECT_TRUE(has_note(avx512, "oneDNN on avx512"));
  EXPECT_TRUE(has_note(avx2, "oneDNN on avx2"));
}

}  // namespace
}  // namespace memest
