// The op rules added for the models people run (issue 10): what each keeps and allocates where
// the CUDA runtime differs from the CPU 1.13 one (the conformance suite checks the CPU side
// against real PyTorch), with the numbers derived from PyTorch's source or from published
// measurements; the transposed convolution's CPU scratch against measured allocation
// sequences; the CPU expansion of recurrent layers; and that engine/rules/op_rules.h lists every
// rule.
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>

#include "engine/passes/rnn_expand.h"
#include "engine/rules/cpu_conv.h"
#include "engine/rules/op_rules.h"
#include "tests/engine/test_graphs.h"

namespace memest {
namespace {

// The memory of op `kind` on activations of `shapes` (float32 parameters times 1.0, so that
// they need grad) and leaves `extra` (added as they are: int64 inputs, buffers).
struct Built {
  Graph graph;
  int op = -1;
};

Built OneOp(const std::string& kind, const std::vector<Shape>& shapes, Attrs attrs,
            const std::vector<std::pair<Shape, DType>>& extra = {}, bool needs_grad = true) {
  GraphBuilder b;
  std::vector<int> in;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const int p = b.Parameter("p" + std::to_string(i), shapes[i], DType::kFloat32, needs_grad);
    in.push_back(b.Add1("mul", {p}, {{"scalar", 1.0}}));
  }
  for (size_t i = 0; i < extra.size(); ++i) {
    in.push_back(b.Input("e" + std::to_string(i), extra[i].first, extra[i].second, -1));
  }
  Built r;
  r.op = b.num_ops();
  const int y = b.Add1(kind, in, std::move(attrs));
  b.BeginLoss();
  b.SetLoss(b.Add1("sum", {y}));
  StatusOr<Graph> g = b.Finish();
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  if (g.ok()) r.graph = *std::move(g);
  return r;
}

OpMemory MemoryOf(const Built& b, Runtime runtime, bool grad = true) {
  const Op& op = b.graph.ops[b.op];
  OpCall call{op, {}, {}, "", grad, runtime};
  for (int t : op.inputs) call.inputs.push_back(&b.graph.tensors[t]);
  for (int t : op.outputs) call.outputs.push_back(&b.graph.tensors[t]);
  return OpMemoryOf(call);
}

int64_t Sum(const std::vector<Alloc>& a) {
  int64_t n = 0;
  for (const Alloc& x : a) n += x.bytes;
  return n;
}

// An lstm / gru op's inputs: x [T, B, I] and per layer w_ih, w_hh, b_ih, b_hh.
std::vector<Shape> RecurrentInputs(bool lstm, int64_t t, int64_t b, int64_t i, int64_t h,
                                   int64_t layers) {
  const int64_t g = (lstm ? 4 : 3) * h;
  std::vector<Shape> s{{t, b, i}};
  for (int64_t l = 0; l < layers; ++l) {
    s.insert(s.end(), {{g, l == 0 ? i : h}, {g, h}, {g}, {g}});
  }
  return s;
}

// pytorch/pytorch#2895: cuDNN's reserve for a 4-layer, 320-unit network on 123 input
// features (3,038,090 LSTM and 2,279,370 GRU parameters with a 10-class head) and 25,000
// steps x samples was 736,000,000 bytes for the LSTM and 864,000,000 for the GRU.
TEST(RecurrentRuleTest, CudnnReserveMatchesPublishedSizes) {
  for (bool lstm : {true, false}) {
    const Built b = OneOp(lstm ? "lstm" : "gru", RecurrentInputs(lstm, 250, 100, 123, 320, 4),
                          {{"num_layers", int64_t{4}}});
    const OpMemory m = MemoryOf(b, Runtime::kCuda);
    int64_t reserve = 0;
    for (const Alloc& a : m.saved_extras) {
      if (std::string(a.what) == "cuDNN reserve space") reserve = a.bytes;
    }
    EXPECT_EQ(reserve, lstm ? 736'000'000 : 864'000'000) << (lstm ? "lstm" : "gru");
    // input and output kept, and the zero states nn.LSTM makes (hx, cx: [4, 100, 320] each)
    EXPECT_EQ(m.saved_inputs, std::vector<int>{0});
    EXPECT_EQ(m.saved_outputs, std::vector<int>{0});
    EXPECT_EQ(Sum(m.saved_extras) - reserve, (lstm ? 2 : 1) * 4 * 100 * 320 * 4);
  }
}

TEST(RecurrentRuleTest, CudnnInferenceKeepsNoReserveAndBatchFirstIsCopied) {
  const Built b = OneOp("lstm", {{4, 6, 8}, {24, 8}, {24, 6}, {24}, {24}}, {{"batch_first", int64_t{1}}});
  EXPECT_EQ(b.graph.tensors[b.graph.ops[b.op].outputs[0]].shape, (Shape{4, 6, 6}));
  const OpMemory train = MemoryOf(b, Runtime::kCuda);
  EXPECT_EQ(Sum(train.forward_temps), 4 * 6 * 8 * 4);  // x.contiguous(), sequence-major
  // reserve: T * B * H * 4 * 5, plus the zero states
  EXPECT_EQ(Sum(train.saved_extras), 6 * 4 * 6 * 4 * 5 + 2 * 4 * 6 * 4);
  const OpMemory infer = MemoryOf(b, Runtime::kCuda, /*grad=*/false);
  EXPECT_TRUE(infer.saved_extras.empty());
  EXPECT_EQ(Sum(infer.forward_temps), 4 * 6 * 8 * 4 + 2 * 4 * 6 * 4);
}

// On the CPU runtime an lstm becomes 1.13's ops: the input projection of every step at once,
// then per step addmm, add_, unsafe_split, three sigmoid_ and a tanh_, mul, mul, add_, tanh,
// mul; the outputs and final states stacked.
TEST(RecurrentRuleTest, CpuExpansionRunsTheCellsOps) {
  const Built b = OneOp("lstm", RecurrentInputs(true, 3, 2, 5, 4, 1), {});
  StatusOr<Graph> g = ExpandRecurrentForCpu(b.graph);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  std::map<std::string, int> count;
  for (const Op& op : g->ops) ++count[op.kind];
  EXPECT_EQ(count["lstm"], 0);
  EXPECT_EQ(count["full"], 2);     // h0, c0
  EXPECT_EQ(count["linear"], 1 + 3);
  EXPECT_EQ(count["sigmoid"], 3 * 3);
  EXPECT_EQ(count["tanh"], 3 * 2);
  EXPECT_EQ(count["add_"], 3 * 2);
  EXPECT_EQ(count["mul"], 5 + 3 * 3);  // the test's own p * 1.0 for its 5 inputs, then 3 a step
  const Built gru = OneOp("gru", RecurrentInputs(false, 3, 2, 5, 4, 1), {});
  StatusOr<Graph> gg = ExpandRecurrentForCpu(gru.graph);
  ASSERT_TRUE(gg.ok()) << gg.status().ToString();
  count.clear();
  for (const Op& op : gg->ops) ++count[op.kind];
  EXPECT_EQ(count["mul_"], 3 * 2);  // hg2.mul_(r), (h - n).mul_(z): each keeps a clone
  EXPECT_EQ(count["sub"], 3);
}

TEST(RecurrentRuleTest, RefusesWeightsThatDoNotMatch) {
  GraphBuilder b;
  std::vector<int> in{b.Input("x", {3, 2, 5}, DType::kFloat32, 1)};
  for (const Shape& s : std::vector<Shape>{{16, 5}, {16, 4}, {16}, {12}}) {
    in.push_back(b.Parameter("w" + std::to_string(in.size()), s, DType::kFloat32));
  }
  b.Add1("lstm", in, {});
  EXPECT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("inputs[4]: b_hh must be float32 [16]"), std::string::npos)
      << b.status().message();
}

// index's backward on CUDA sorts the indices (index_put_with_sort_kernel: linear index, sorted,
// original positions, arange: 4 int64 per index); 1.13's CPU adds in place.
TEST(IndexRuleTest, CudaBackwardSortsTheIndices) {
  const Built b = OneOp("index", {{25, 4}}, {}, {{{81}, DType::kInt64}});
  EXPECT_EQ(b.graph.tensors[b.graph.ops[b.op].outputs[0]].shape, (Shape{81, 4}));
  EXPECT_EQ(Sum(MemoryOf(b, Runtime::kCuda).backward_temps), 4 * 81 * 8);
  EXPECT_EQ(Sum(MemoryOf(b, Runtime::kCpuTorch113).backward_temps), 0);
  EXPECT_EQ(MemoryOf(b, Runtime::kCuda).saved_inputs, std::vector<int>{1});
}

// _embedding_bag on CUDA (EmbeddingBag.cu): offset2bag [N] int64, bag_size [B], max_indices
// [B, D] int64 for max only, no forward scratch; the backward sorts as embedding's does. On
// 1.13's CPU (measured): offset2bag [N + 1] (mean and max), max_indices [B] for sum and mean,
// and scratch (N = 24, B = 4, mean: 136 bytes above what it keeps).
TEST(EmbeddingBagRuleTest, CudaAndCpuBookkeeping) {
  const Built mean = OneOp("embedding_bag", {{20, 16}}, {{"mode", std::string("mean")}},
                           {{{4, 6}, DType::kInt64}});
  EXPECT_EQ(mean.graph.tensors[mean.graph.ops[mean.op].outputs[0]].shape, (Shape{4, 16}));
  const OpMemory cuda = MemoryOf(mean, Runtime::kCuda);
  EXPECT_EQ(Sum(cuda.saved_extras), 4 * 8 + 24 * 8 + 4 * 8);  // offsets (arange), offset2bag, bag_size
  EXPECT_TRUE(cuda.forward_temps.empty());
  EXPECT_EQ(Sum(cuda.backward_temps), 3 * 24 * 8 + 24 * 16 * 4);
  const OpMemory cpu = MemoryOf(mean, Runtime::kCpuTorch113);
  EXPECT_EQ(Sum(cpu.saved_extras), 4 * 8 + 25 * 8 + 4 * 8 + 4 * 8);
  EXPECT_EQ(Sum(cpu.forward_temps), 136);
  EXPECT_EQ(Sum(cpu.backward_temps), 3 * 24 * 8);
  const Built max = OneOp("embedding_bag", {{20, 16}}, {{"mode", std::string("max")}},
                          {{{4, 6}, DType::kInt64}});
  EXPECT_EQ(Sum(MemoryOf(max, Runtime::kCuda).saved_extras), 4 * 8 + 24 * 8 + 4 * 8 + 4 * 16 * 8);
  EXPECT_EQ(Sum(MemoryOf(max, Runtime::kCuda).backward_temps), 0);
}

// dropout_ is never the fused kernel: even on CUDA it keeps a noise tensor in x's dtype
// (_dropout_impl<inplace=true>), where out-of-place dropout keeps a bool mask.
TEST(DropoutRuleTest, InPlaceKeepsNoiseOnCuda) {
  const Built fused = OneOp("dropout", {{8, 16}}, {{"p", 0.2}});
  EXPECT_EQ(Sum(MemoryOf(fused, Runtime::kCuda).saved_extras), 8 * 16);
  const Built inplace = OneOp("dropout", {{8, 16}}, {{"p", 0.2}, {"inplace", int64_t{1}}});
  EXPECT_EQ(Sum(MemoryOf(inplace, Runtime::kCuda).saved_extras), 8 * 16 * 4);
  EXPECT_GE(inplace.graph.tensors[inplace.graph.ops[inplace.op].outputs[0]].alias_of, 0);
}

// In place, a formula that reads self keeps a clone of it (gen_variable_type.py).
TEST(ActivationRuleTest, InPlaceKeepsACloneOfTheInput) {
  for (const char* kind : {"silu", "hardswish", "hardsigmoid", "hardtanh"}) {
    const Built b = OneOp(kind, {{8, 16}}, {{"inplace", int64_t{1}}});
    const OpMemory m = MemoryOf(b, Runtime::kCuda);
    EXPECT_TRUE(m.saved_inputs.empty()) << kind;
    EXPECT_EQ(Sum(m.saved_extras), 8 * 16 * 4) << kind;
  }
  const Built sigmoid = OneOp("sigmoid", {{8, 16}}, {{"inplace", int64_t{1}}});
  EXPECT_EQ(MemoryOf(sigmoid, Runtime::kCuda).saved_outputs, std::vector<int>{0});
  EXPECT_TRUE(MemoryOf(sigmoid, Runtime::kCuda).saved_extras.empty());
}

TEST(CopyRuleTest, RollKeepsAnIntermediatePerExtraDim) {
  const Built b = OneOp("roll", {{2, 5, 4, 8}}, {{"shifts", std::vector<int64_t>{-2, -2, 1}},
                                                 {"dims", std::vector<int64_t>{1, 2, 3}}});
  const OpMemory m = MemoryOf(b, Runtime::kCuda);
  EXPECT_EQ(Sum(m.forward_temps), 2 * 1280);
  EXPECT_EQ(Sum(m.backward_temps), 2 * 1280);
  const Built pad = OneOp("pad", {{2, 5, 4, 8}}, {{"pad", std::vector<int64_t>{0, 0, 0, 3, 0, 2}}});
  EXPECT_EQ(pad.graph.tensors[pad.graph.ops[pad.op].outputs[0]].shape, (Shape{2, 7, 7, 8}));
}

// 1.13's CPU transposed convolution (slow_conv_transpose2d), measured allocation by allocation
// with torch.profiler: [forward], [backward] for x [N, Ci, 8, 8], weight [Ci, Co/g, K, K].
struct TransposedCase {
  int64_t n, ci, co, k, stride, pad, opad, groups;
  bool bias, input_grad;
  std::vector<int64_t> forward, backward;
};

TEST(CpuConvTest, TransposedMatchesMeasuredSequences) {
  const std::vector<TransposedCase> cases = {
      {2, 8, 4, 2, 2, 0, 0, 1, true, true, {8192, 4096, 1024, -1024, -4096},
       {4096, 4096, -4096, 512, 16, 4096, -4096}},
      {2, 8, 4, 3, 2, 1, 1, 1, true, true, {8192, 9216, 1024, -1024, -9216},
       {4096, 9216, -9216, 1152, 16, 9216, -9216}},
      {2, 8, 4, 2, 2, 0, 0, 1, true, false, {8192, 4096, 1024, -1024, -4096},
       {512, 16, 4096, -4096}},
      {2, 8, 4, 1, 1, 0, 0, 1, true, true, {2048, 1024, 256, -256, -1024}, {4096, 128, 16}},
      {2, 8, 4, 2, 2, 0, 0, 1, false, true, {8192, 4096, -4096},
       {4096, 4096, -4096, 512, 4096, -4096}},
      {1, 8, 8, 3, 2, 1, 1, 2, true, true,
       {4096, 9216, 1024, -1024, -9216, 4096, 9216, 1024, -1024, -9216, 8192, -4096, -4096},
       {1024, 9216, -9216, 576, 16, 9216, -9216, 1024, 9216, -9216, 576, 16, 9216, -9216, 2048,
        1152, 32, -16, -16, -576, -576, -1024, -1024}},
      {2, 8, 8, 3, 2, 1, 1, 2, false, false,
       {2048, 8192, 9216, -9216, -2048, 2048, 8192, 9216, -9216, -2048, 16384, -8192, -8192},
       {8192, 2048, 576, 9216, -9216, -2048, -8192, 8192, 2048, 576, 9216, -9216, -2048, -8192,
        1152, -576, -576}},
  };
  for (const TransposedCase& c : cases) {
    CpuConvProblem p;
    p.transposed = true;
    p.n = c.n, p.ci = c.ci, p.co = c.co, p.groups = c.groups;
    p.h = p.w = 8;
    p.kh = p.kw = c.k;
    p.stride_h = p.stride_w = c.stride;
    p.pad_h = p.pad_w = c.pad;
    p.oh = p.ow = (8 - 1) * c.stride - 2 * c.pad + (c.k - 1) + c.opad + 1;
    p.bias = c.bias;
    p.input_grad = c.input_grad;
    p.weight_grad = true;
    const CpuConvTrace t = CpuConvAllocations(p, CpuIsa::kAvx512);
    EXPECT_EQ(t.forward, c.forward) << "n=" << c.n << " k=" << c.k << " groups=" << c.groups;
    EXPECT_EQ(t.backward, c.backward) << "n=" << c.n << " k=" << c.k << " groups=" << c.groups;
  }
}

// Depthwise 1x1 with 8 groups (measured: eight identical rounds, then the concatenation): the
// sequence is kept short (the middle groups as one allocation), its high-water mark and net
// unchanged.
TEST(CpuConvTest, TransposedManyGroupsKeepThePeak) {
  std::vector<int64_t> fwd, bwd;
  for (int g = 0; g < 8; ++g) fwd.insert(fwd.end(), {512, 512, 256, 256, -256, -256, -512});
  fwd.push_back(4096);
  fwd.insert(fwd.end(), 8, -512);
  for (int g = 0; g < 8; ++g) bwd.insert(bwd.end(), {512, 512, 512, 4, 4, -512, -512});
  bwd.insert(bwd.end(), {4096, 32, 32});
  bwd.insert(bwd.end(), 16, -4);
  bwd.insert(bwd.end(), 8, -512);
  CpuConvProblem p;
  p.transposed = true;
  p.n = 2, p.ci = 8, p.co = 8, p.groups = 8, p.h = p.w = p.oh = p.ow = 8;
  p.bias = p.input_grad = p.weight_grad = true;
  const CpuConvTrace t = CpuConvAllocations(p, CpuIsa::kAvx512);
  EXPECT_LT(t.forward.size(), fwd.size());
  EXPECT_EQ(PeakOfEvents(t.forward).peak, PeakOfEvents(fwd).peak);
  EXPECT_EQ(PeakOfEvents(t.forward).net, PeakOfEvents(fwd).net);
  EXPECT_EQ(PeakOfEvents(t.backward).peak, PeakOfEvents(bwd).peak);
  EXPECT_EQ(PeakOfEvents(t.backward).net, PeakOfEvents(bwd).net);
  p.groups = p.ci = p.co = int64_t{1} << 30;  // a long loop, were it one event list per group
  EXPECT_LT(CpuConvAllocations(p, CpuIsa::kAvx512).forward.size(), 32u);
}

TEST(RecurrentRuleTest, CpuExpansionRefusesEndlessSequences) {
  const Built b = OneOp("gru", RecurrentInputs(false, 100'000, 1, 1, 1, 1), {});
  StatusOr<Graph> g = ExpandRecurrentForCpu(b.graph);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("gru over 100000 steps"), std::string::npos)
      << g.status().message();
}

// Every rule's kind appears in the vocabulary comment at the top of engine/rules/op_rules.h.
TEST(OpRuleTest, HeaderListsEveryKind) {
  std::ifstream f(std::string(MEMEST_SOURCE_DIR) + "/engine/rules/op_rules.h");
  ASSERT_TRUE(f.good());
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  const std::string list = text.substr(0, text.find("#ifndef"));
  for (const OpRule* r : AllOpRules()) {
    const std::string k(r->kind);
    bool found = false;
    for (size_t at = list.find(k); at != std::string::npos && !found; at = list.find(k, at + 1)) {
      const auto word = [](char ch) { return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_'; };
      found = (at == 0 || !word(list[at - 1])) && (at + k.size() >= list.size() || !word(list[at + k.size()]));
    }
    EXPECT_TRUE(found) << "engine/rules/op_rules.h does not list '" << k << "'";
  }
}

}  // namespace
}  // namespace memest
