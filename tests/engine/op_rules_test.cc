// Each op of the vocabulary on its own: the output shape its rule infers and the bytes autograd
// keeps for its backward. Expected saved bytes are derived by hand from
// tools/autograd/derivatives.yaml (what each formula reads), and checked against real PyTorch
// 1.13 with saved_tensors_hooks (distinct storages, parameters excluded). Inputs are float32
// activations that need grad, made as `param * 1.0` so that nothing else saves them.
#include <gtest/gtest.h>

#include <cmath>

#include "engine/estimator.h"
#include "engine/rules/op_rules.h"
#include "tests/engine/test_graphs.h"

namespace memest {
namespace {

using enginetest::PlainTraining;
using enginetest::SavedBytes;

struct OpCase {
  const char* name;
  const char* kind;
  std::vector<Shape> inputs;  // float32 activations
  Attrs attrs;
  Shape output;
  int64_t saved;  // bytes autograd keeps (inputs, outputs, extras), parameters excluded
  std::vector<std::string> prep{};  // a view op applied to input 0 before the op ("permute")
};

void PrintTo(const OpCase& c, std::ostream* os) { *os << c.name; }

class OpRuleTest : public ::testing::TestWithParam<OpCase> {};

TEST_P(OpRuleTest, OutputShapeAndSavedBytes) {
  const OpCase& c = GetParam();
  GraphBuilder b;
  std::vector<int> in;
  {
    ScopeGuard s(b, "prep");
    for (size_t i = 0; i < c.inputs.size(); ++i) {
      const int p = b.Parameter("p" + std::to_string(i), c.inputs[i], DType::kFloat32);
      in.push_back(b.Add1("mul", {p}, {{"scalar", 1.0}}));
    }
    for (const std::string& v : c.prep) {
      if (v == "permute") in[0] = b.Add1("permute", {in[0]}, {{"dims", std::vector<int64_t>{0, 2, 1, 3}}});
    }
  }
  int out;
  {
    ScopeGuard s(b, "op");
    out = b.Add1(c.kind, in, c.attrs);
  }
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b.shape(out), c.output);
  b.BeginLoss();
  b.SetLoss(b.Add1("sum", {out}));
  StatusOr<Graph> g = b.Finish();
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(SavedBytes(*g, PlainTraining(), "op"), c.saved);
}

// Shapes are [4, 8] (128 B of float32) unless stated.
INSTANTIATE_TEST_SUITE_P(
    Vocabulary, OpRuleTest,
    ::testing::Values(
        OpCase{"relu_keeps_output", "relu", {{4, 8}}, {}, {4, 8}, 128},
        OpCase{"relu_inplace_keeps_output", "relu", {{4, 8}}, {{"inplace", int64_t{1}}}, {4, 8}, 128},
        OpCase{"gelu_keeps_input", "gelu", {{4, 8}}, {}, {4, 8}, 128},
        OpCase{"silu_keeps_input", "silu", {{4, 8}}, {}, {4, 8}, 128},
        OpCase{"sigmoid_keeps_output", "sigmoid", {{4, 8}}, {}, {4, 8}, 128},
        OpCase{"tanh_keeps_output", "tanh", {{4, 8}}, {}, {4, 8}, 128},
        OpCase{"softmax_keeps_output", "softmax", {{4, 8}}, {}, {4, 8}, 128},
        OpCase{"log_softmax_keeps_output", "log_softmax", {{4, 8}}, {}, {4, 8}, 128},
        // native_dropout keeps a bool mask (1 B per element), not its output.
        OpCase{"dropout_keeps_bool_mask", "dropout", {{4, 8}}, {{"p", 0.1}}, {4, 8}, 32},
        OpCase{"dropout_p0_is_identity", "dropout", {{4, 8}}, {{"p", 0.0}}, {4, 8}, 0},
        OpCase{"add_keeps_nothing", "add", {{4, 8}, {4, 8}}, {}, {4, 8}, 0},
        OpCase{"mul_keeps_both", "mul", {{4, 8}, {4, 8}}, {}, {4, 8}, 256},
        OpCase{"mul_scalar_keeps_nothing", "mul", {{4, 8}}, {{"scalar", 2.0}}, {4, 8}, 0},
        OpCase{"div_scalar_keeps_nothing", "div", {{4, 8}}, {{"scalar", 8.0}}, {4, 8}, 0},
        OpCase{"div_keeps_both", "div", {{4, 8}, {4, 8}}, {}, {4, 8}, 256},
        // [4,1,8] * [4,8] -> [4,4,8]: both operands kept, at their own (small) sizes.
        OpCase{"mul_broadcast_keeps_operands", "mul", {{4, 1, 8}, {4, 8}}, {}, {4, 4, 8}, 256},
        // mean and rstd: [4, 1] float32 each.
        OpCase{"layer_norm_keeps_input_and_stats", "layer_norm", {{4, 8}}, {}, {4, 8}, 128 + 16 + 16},
        // group_norm on [2, 4, 4] with 2 groups: input 128 B, mean and rstd [2, 2] 16 B each.
        OpCase{"group_norm", "group_norm", {{2, 4, 4}}, {{"num_groups", int64_t{2}}}, {2, 4, 4}, 160},
        // batch_norm on [4, 8]: input, save_mean and save_invstd [8] float32.
        OpCase{"batch_norm", "batch_norm", {{4, 8}}, {}, {4, 8}, 128 + 32 + 32},
        // [1,2,4,4] pooled 2x2: input 128 B and int64 indices of the [1,2,2,2] output, 64 B.
        OpCase{"max_pool_keeps_input_and_indices", "max_pool2d", {{1, 2, 4, 4}},
               {{"kernel_size", int64_t{2}}}, {1, 2, 2, 2}, 192},
        OpCase{"avg_pool_keeps_input", "avg_pool2d", {{1, 2, 4, 4}}, {{"kernel_size", int64_t{2}}},
               {1, 2, 2, 2}, 128},
        // To 1x1 it is a mean over the spatial dims in PyTorch 2.x: only sizes are kept.
        OpCase{"adaptive_avg_pool_to_1x1", "adaptive_avg_pool2d", {{1, 2, 4, 4}},
               {{"output_size", int64_t{1}}}, {1, 2, 1, 1}, 0},
        OpCase{"adaptive_avg_pool_to_2x2", "adaptive_avg_pool2d", {{1, 2, 4, 4}},
               {{"output_size", int64_t{2}}}, {1, 2, 2, 2}, 128},
        // conv keeps input and weight whenever any gradient is needed (both activations here).
        OpCase{"conv2d_keeps_input", "conv2d", {{1, 2, 4, 4}, {3, 2, 3, 3}}, {}, {1, 3, 2, 2},
               128 + 3 * 2 * 3 * 3 * 4},
        // bmm keeps both: 2*3*4*4 = 96 B and 2*4*5*4 = 160 B.
        OpCase{"matmul_batched_keeps_both", "matmul", {{2, 3, 4}, {2, 4, 5}}, {}, {2, 3, 5}, 256},
        OpCase{"bmm_keeps_both", "bmm", {{2, 3, 4}, {2, 4, 5}}, {}, {2, 3, 5}, 256},
        // A [2,3,4,5] permuted to [2,4,3,5] cannot fold its batch dims into a view: matmul
        // copies it (8*3*5*4 = 480 B) and bmm keeps the copy, plus b (2*4*5*6*4 = 960 B).
        OpCase{"matmul_copies_permuted_operand", "matmul", {{2, 3, 4, 5}, {2, 4, 5, 6}}, {},
               {2, 4, 3, 6}, 480 + 960, {"permute"}},
        // einsum("ijk,ljk->lij"): each operand permuted to [j, i, k] / [j, k, l], which reshape
        // to 3-D as views (one letter per group); bmm keeps both views: 256 B each.
        OpCase{"einsum_contraction", "einsum", {{2, 4, 8}, {2, 4, 8}},
               {{"equation", std::string("ijk,ljk->lij")}}, {2, 2, 4}, 512},
        OpCase{"sum_keeps_nothing", "sum", {{4, 8}}, {{"dim", std::vector<int64_t>{-1}}}, {4}, 0},
        OpCase{"transpose_is_a_view", "transpose", {{4, 8}}, {}, {8, 4}, 0},
        OpCase{"cat_keeps_nothing", "cat", {{4, 8}, {4, 8}}, {{"dim", int64_t{0}}}, {8, 8}, 0},
        OpCase{"pow_keeps_input", "pow", {{4, 8}}, {{"exponent", 2.0}}, {4, 8}, 128},
        OpCase{"exp_keeps_output", "exp", {{4, 8}}, {}, {4, 8}, 128},
        OpCase{"mse_keeps_both", "mse_loss", {{4, 8}, {4, 8}}, {}, {}, 256}),
    [](const ::testing::TestParamInfo<OpCase>& info) { return std::string(info.param.name); });

TEST(OpRuleTest, LinearKeepsItsInputNotItsOutput) {
  GraphBuilder b;
  const int w = b.Parameter("w", {16, 8}, DType::kFloat32);
  const int x = b.Add1("mul", {b.Parameter("x", {4, 8}, DType::kFloat32)}, {{"scalar", 1.0}});
  int y;
  {
    ScopeGuard s(b, "op");
    y = b.Add1("linear", {x, w});
  }
  b.BeginLoss();
  b.SetLoss(b.Add1("sum", {y}));
  StatusOr<Graph> g = b.Finish();
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(enginetest::SavedBytes(*g, PlainTraining(), "op"), 128);  // x; the weight is a parameter
}

TEST(OpRuleTest, CrossEntropyKeepsLogSoftmax) {
  GraphBuilder b;
  const int logits = b.Add1("mul", {b.Parameter("z", {4, 10}, DType::kFloat32)}, {{"scalar", 1.0}});
  const int target = b.Target("y", {4}, DType::kInt64);
  b.BeginLoss();
  int loss;
  {
    ScopeGuard s(b, "op");
    loss = b.Add1("cross_entropy", {logits, target});
  }
  b.SetLoss(loss);
  StatusOr<Graph> g = b.Finish();
  ASSERT_TRUE(g.ok());
  // log_softmax [4, 10] float32 and nll_loss's 0-dim float32 total_weight.
  EXPECT_EQ(enginetest::SavedBytes(*g, PlainTraining(), "op"), 160 + 4);
}

TEST(OpRuleTest, UnknownKindNamesTheFieldAndTheVocabulary) {
  GraphBuilder b;
  b.SetErrorContext("model.ops[3]");
  const int x = b.Input("x", {2, 2}, DType::kFloat32);
  b.Add1("frobnicate", {x});
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(b.status().message().find("model.ops[3].kind: unknown op 'frobnicate'"), std::string::npos);
  EXPECT_NE(b.status().message().find("linear"), std::string::npos);
}

TEST(OpRuleTest, ShapeMismatchNamesTheInput) {
  GraphBuilder b;
  b.SetErrorContext("model.ops[0]");
  const int x = b.Input("x", {2, 3}, DType::kFloat32);
  const int w = b.Parameter("w", {4, 5}, DType::kFloat32);
  b.Add1("linear", {x, w});
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("model.ops[0].inputs[1]"), std::string::npos)
      << b.status().message();
}

TEST(OpRuleTest, OverflowingShapeIsRefused) {
  GraphBuilder b;
  b.SetErrorContext("model.tensors[0]");
  b.Input("x", {int64_t{1} << 40, int64_t{1} << 40}, DType::kFloat32);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().message(),
            "model.tensors[0]: the input 'x' would be [1099511627776, 1099511627776] of float32, "
            "more than the 2^56 bytes (64 PiB) one tensor may hold");
}

// A size too large is reported against the request field it came from, not the tensor's name.
TEST(OpRuleTest, OverflowingShapeNamesTheFieldItsSizeCameFrom) {
  GraphBuilder b;
  b.NameSize(int64_t{1} << 20, "model.layers[0].attrs.in_features");
  b.NameSize(int64_t{1} << 50, "model.layers[0].attrs.out_features");
  b.Parameter("weight", {int64_t{1} << 50, int64_t{1} << 20}, DType::kFloat32);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().message().rfind("model.layers[0].attrs.out_features: 1125899906842624 is "
                                       "too large: the parameter 'weight' would be",
                                       0),
            0u)
      << b.status().message();
}

TEST(OpRuleTest, OverflowingOutputNamesTheFieldItsSizeCameFrom) {
  GraphBuilder b;
  b.NameSize(int64_t{1} << 40, "config.batch_size");
  const int x = b.Input("x", {int64_t{1} << 40, 1024}, DType::kFloat32);
  ASSERT_TRUE(b.ok()) << b.status().message();
  b.Add1("linear", {x, b.Parameter("w", {1 << 21, 1024}, DType::kFloat32)});
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().message().rfind("config.batch_size: 1099511627776 is too large: the output "
                                       "of linear would be [1099511627776, 2097152]",
                                       0),
            0u)
      << b.status().message();
}

// A named size that does not make the shape too large by itself is not blamed.
TEST(OpRuleTest, OverflowingShapeBlamesNoSizeThatIsNotTheCause) {
  GraphBuilder b;
  b.NameSize(1, "model.layers[0].attrs.bias");
  b.SetErrorContext("model.layers[0]");
  b.Parameter("weight", {int64_t{1} << 62, 1}, DType::kFloat32);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().message().rfind("model.layers[0]: the parameter 'weight'", 0), 0u)
      << b.status().message();
}

// One tensor may hold 2^56 bytes and no more: a byte past it is refused, though its count still
// fits 64 bits.
TEST(OpRuleTest, TensorBoundIsTwoToThe56Bytes) {
  GraphBuilder ok;
  ok.Input("x", {int64_t{1} << 54}, DType::kFloat32);
  EXPECT_TRUE(ok.ok()) << ok.status().message();
  GraphBuilder over;
  over.Input("x", {(int64_t{1} << 54) + 1}, DType::kFloat32);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(over.status().message().find("the input 'x'"), std::string::npos)
      << over.status().message();
}

TEST(OpRuleTest, NegativeDimIsRefused) {
  GraphBuilder b;
  b.SetErrorContext("model.tensors[1]");
  b.Input("x", {4, -4}, DType::kFloat32);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("model.tensors[1].shape[1]: must be non-negative, got -4"),
            std::string::npos)
      << b.status().message();
}

TEST(OpRuleTest, NonFiniteAttributeIsRefused) {
  GraphBuilder b;
  b.SetErrorContext("model.ops[0]");
  const int x = b.Input("x", {2, 2}, DType::kFloat32);
  b.Add1("dropout", {x}, {{"p", std::nan("")}});
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("model.ops[0].attrs.p: must be finite"), std::string::npos);
}

TEST(OpRuleTest, EveryRuleHasInferenceAndMemory) {
  for (const OpRule* r : AllOpRules()) {
    EXPECT_NE(r->infer, nullptr) << r->kind;
    EXPECT_NE(r->memory, nullptr) << r->kind;
  }
  EXPECT_GE(AllOpRules().size(), 50u);
}

}  // namespace
}  // namespace memest

namespace memest {
namespace {

// matmul of an N-D operand whose rows do not merge (its last two dims transposed) with a frozen
// matrix: PyTorch 2.x runs bmm on an expanded view of the matrix instead of copying the operand
// into [N, k] (should_fold); 1.13 folds, copying it.
TEST(OpRuleTest, MatmulFoldsOnlyWithoutACopyOnCuda) {
  auto scratch = [](Runtime runtime) {
    GraphBuilder b;
    const int p = b.Parameter("p", {4, 64, 32}, DType::kFloat32);
    const int a = b.Add1("transpose", {b.Add1("mul", {p}, {{"scalar", 1.0}})},
                         {{"dim0", int64_t{1}}, {"dim1", int64_t{2}}});  // [4, 32, 64]
    const int w = b.Buffer("w", {64, 16}, DType::kFloat32);             // needs no grad
    int y;
    {
      ScopeGuard s(b, "op");
      y = b.Add1("matmul", {a, w});
    }
    b.BeginLoss();
    b.SetLoss(b.Add1("sum", {y}));
    const Graph g = b.Finish().value();
    OpCall call{g.ops[2], {&g.tensors[g.ops[2].inputs[0]], &g.tensors[g.ops[2].inputs[1]]},
                {&g.tensors[g.ops[2].outputs[0]]}, "", true, runtime};
    int64_t bytes = 0;
    for (const Alloc& t : OpMemoryOf(call).forward_temps) bytes += t.bytes;
    return bytes;
  };
  EXPECT_EQ(scratch(Runtime::kCpuTorch113), 4 * 32 * 64 * 4);  // the folded copy of a
  EXPECT_EQ(scratch(Runtime::kCuda), 0);                         // bmm on views
}

// F.scaled_dot_product_attention as 2.x dispatches it (attr fused): q, k, v, the mask and the
// output are kept, with a float32 logsumexp per query row; no [L, S] matrix. On CUDA the
// memory-efficient kernel (float32 inputs, or a mask) pads the logsumexp rows to 32; flash (half
// inputs without a mask) and the CPU's flash do not.
TEST(OpRuleTest, FusedSdpaKeepsALogsumexpNotTheScores) {
  auto memory = [](DType dtype, bool mask, Runtime runtime) {
    GraphBuilder b;
    std::vector<int> in;
    for (const char* n : {"q", "k", "v"}) {
      const int p = b.Parameter(n, {2, 4, 40, 8}, dtype);
      in.push_back(b.Add1("mul", {p}, {{"scalar", 1.0}}));
    }
    if (mask) in.push_back(b.Buffer("mask", {40, 40}, dtype));
    const int y = b.Add1("scaled_dot_product_attention", in, {{"fused", int64_t{1}}});
    b.BeginLoss();
    b.SetLoss(b.Add1("sum", {y}));
    const Graph g = b.Finish().value();
    const Op& op = g.ops[3];
    OpCall call{op, {}, {&g.tensors[op.outputs[0]]}, "", true, runtime};
    for (int t : op.inputs) call.inputs.push_back(&g.tensors[t]);
    return OpMemoryOf(call);
  };
  const OpMemory cpu = memory(DType::kFloat32, false, Runtime::kCpuTorch113);
  EXPECT_EQ(cpu.saved_inputs, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(cpu.saved_outputs, std::vector<int>{0});
  ASSERT_EQ(cpu.saved_extras.size(), 1u);
  EXPECT_EQ(cpu.saved_extras[0].bytes, 2 * 4 * 40 * 4);  // logsumexp [2, 4, 40] float32
  EXPECT_TRUE(cpu.forward_temps.empty());
  const OpMemory flash = memory(DType::kBFloat16, false, Runtime::kCuda);
  EXPECT_EQ(flash.saved_extras[0].bytes, 2 * 4 * 40 * 4);
  const OpMemory efficient = memory(DType::kFloat32, false, Runtime::kCuda);
  EXPECT_EQ(efficient.saved_extras[0].bytes, 2 * 4 * 64 * 4);  // rows padded to 64
  const OpMemory masked = memory(DType::kBFloat16, true, Runtime::kCuda);
  EXPECT_EQ(masked.saved_inputs, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(masked.saved_extras[0].bytes, 2 * 4 * 64 * 4);  // a mask: memory-efficient
}

// PyTorch 2.5+'s _safe_softmax (softmax with attr safe): the result is kept as softmax's, and
// the zeroing of fully masked rows takes a bool per element, a bool per row and a 0-dim zero as
// forward scratch (measured on 2.15's CPU: 16384 + 256 + 4 bytes for [4, 64, 64] float32).
TEST(OpRuleTest, SafeSoftmaxKeepsTheResultAndMasksRowsInScratch) {
  GraphBuilder b;
  const int p = b.Parameter("p", {4, 64, 64}, DType::kFloat32);
  const int x = b.Add1("mul", {p}, {{"scalar", 1.0}});
  const int y = b.Add1("softmax", {x}, {{"dim", int64_t{-1}}, {"safe", int64_t{1}}});
  const int plain = b.Add1("softmax", {x}, {{"dim", int64_t{-1}}});
  b.BeginLoss();
  b.SetLoss(b.Add1("sum", {b.Add1("add", {y, plain})}));
  const Graph g = b.Finish().value();
  auto memory = [&](int op) {
    OpCall call{g.ops[op], {&g.tensors[g.ops[op].inputs[0]]}, {&g.tensors[g.ops[op].outputs[0]]},
                "", true, Runtime::kCuda};
    return OpMemoryOf(call);
  };
  int64_t scratch = 0;
  for (const Alloc& t : memory(1).forward_temps) scratch += t.bytes;
  EXPECT_EQ(scratch, 16384 + 256 + 4);
  EXPECT_EQ(memory(1).saved_outputs, std::vector<int>{0});
  EXPECT_TRUE(memory(2).forward_temps.empty());
}

}  // namespace
}  // namespace memest

namespace memest {
namespace {

// log_softmax then nll_loss, as a traced model shows cross_entropy: the same bytes kept.
TEST(OpRuleTest, LogSoftmaxThenNllLossKeepsWhatCrossEntropyKeeps) {
  auto saved = [](bool composite) {
    GraphBuilder b;
    const int z = b.Add1("mul", {b.Parameter("z", {4, 10}, DType::kFloat32)}, {{"scalar", 1.0}});
    const int y = b.Target("y", {4}, DType::kInt64);
    b.BeginLoss();
    {
      ScopeGuard s(b, "op");
      b.SetLoss(composite ? b.Add1("cross_entropy", {z, y})
                          : b.Add1("nll_loss", {b.Add1("log_softmax", {z}, {{"dim", int64_t{1}}}), y}));
    }
    RunConfig c = enginetest::PlainTraining();
    c.runtime = Runtime::kCpuTorch113;
    StatusOr<Report> r = EstimateGraph(b.Finish().value(), c, {1'000'000, false});
    return r->saved_for_backward_bytes;
  };
  EXPECT_EQ(saved(true), saved(false));
  EXPECT_EQ(saved(false), 160 + 32 + 4);  // log-probs, targets, total_weight
}

}  // namespace
}  // namespace memest
