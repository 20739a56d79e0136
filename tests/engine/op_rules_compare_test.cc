// The rules of engine/rules/compare.cc (comparisons, maximum / minimum, cumsum) and copy_: what
// each keeps and allocates, with the numbers derived from derivatives.yaml and the aten kernels
// (the conformance suite's ops/compare_masks, ops/maximum_*, ops/minimum_*, ops/cumsum*,
// ops/copy_into_slice check them against PyTorch 1.13), and the inputs they refuse.
#include <gtest/gtest.h>

#include "engine/ir/graph.h"
#include "engine/rules/op_rules.h"

namespace memest {
namespace {

// One op of `kind` over float32 activations of `shapes` that need grad (parameters times 1.0)
// or, with `grad` false, over inputs that do not, then leaves `extra` as they are.
struct OneOp {
  Graph graph;
  int op = -1;
  Status status;

  OneOp(const std::string& kind, const std::vector<Shape>& shapes, Attrs attrs,
        const std::vector<std::pair<Shape, DType>>& extra = {}, bool grad = true) {
    GraphBuilder b;
    std::vector<int> in;
    for (size_t i = 0; i < shapes.size(); ++i) {
      const std::string name = "p" + std::to_string(i);
      in.push_back(grad ? b.Add1("mul", {b.Parameter(name, shapes[i], DType::kFloat32)},
                                 {{"scalar", 1.0}})
                        : b.Input(name, shapes[i], DType::kFloat32, -1));
    }
    for (size_t i = 0; i < extra.size(); ++i) {
      in.push_back(b.Input("e" + std::to_string(i), extra[i].first, extra[i].second, -1));
    }
    op = b.num_ops();
    b.Add(kind, in, std::move(attrs));
    StatusOr<Graph> g = b.Finish();
    status = g.status();
    if (g.ok()) graph = *std::move(g);
  }

  const Tensor& out() const { return graph.tensors[graph.ops[op].outputs[0]]; }

  OpMemory Memory(Runtime runtime = Runtime::kCuda) const {
    const Op& o = graph.ops[op];
    OpCall call{o, {}, {}, "model.ops[0]", true, runtime};
    for (int t : o.inputs) call.inputs.push_back(&graph.tensors[t]);
    for (int t : o.outputs) call.outputs.push_back(&graph.tensors[t]);
    return OpMemoryOf(call);
  }
};

int64_t Sum(const std::vector<Alloc>& a) {
  int64_t n = 0;
  for (const Alloc& x : a) n += x.bytes;
  return n;
}

TEST(CompareRuleTest, BoolResultKeepsNothingAndPassesNoGradient) {
  for (const char* kind : {"eq", "ne", "lt", "le", "gt", "ge"}) {
    const OneOp two(kind, {{4, 8, 16}, {16}}, {});
    ASSERT_TRUE(two.status.ok()) << kind << ": " << two.status.ToString();
    EXPECT_EQ(two.out().dtype, DType::kBool);
    EXPECT_EQ(two.out().shape, (Shape{4, 8, 16}));
    EXPECT_FALSE(two.out().requires_grad);
    const OpMemory m = two.Memory();
    EXPECT_TRUE(m.saved_inputs.empty() && m.saved_extras.empty() && m.backward_temps.empty());
    EXPECT_EQ(m.grad_flow, (std::vector<GradFlow>{GradFlow::kNone, GradFlow::kNone}));
  }
  // an int attention mask against a number (HF's `mask == 0`)
  const OneOp scalar("eq", {}, {{"scalar", 0.0}}, {{{2, 16}, DType::kInt64}});
  ASSERT_TRUE(scalar.status.ok()) << scalar.status.ToString();
  EXPECT_EQ(scalar.out().dtype, DType::kBool);
  EXPECT_EQ(scalar.out().shape, (Shape{2, 16}));
}

TEST(CompareRuleTest, RefusesOperandsThatDoNotBroadcast) {
  const OneOp bad("lt", {{4, 8}, {5}}, {});
  ASSERT_FALSE(bad.status.ok());
  EXPECT_NE(bad.status.message().find(".inputs"), std::string::npos) << bad.status.message();
  const OneOp no_scalar("gt", {{4, 8}}, {});
  ASSERT_FALSE(no_scalar.status.ok());
  EXPECT_NE(no_scalar.status.message().find("attrs.scalar"), std::string::npos);
}

// MaximumBackward0 (1.13's CPU, measured): div (grad / 2), eq (bool), where (the gradient), lt
// (bool), all live until the expression ends: 2n + O of scratch beside the gradient.
TEST(ExtremumRuleTest, KeepsBothOperandsAndTheBackwardTemporaries) {
  const int64_t n = 4 * 8 * 16;
  const OneOp both("maximum", {{4, 8, 16}, {4, 8, 16}}, {});
  ASSERT_TRUE(both.status.ok()) << both.status.ToString();
  OpMemory m = both.Memory();
  EXPECT_EQ(m.saved_inputs, (std::vector<int>{0, 1}));
  EXPECT_EQ(Sum(m.backward_temps), 2 * n + 4 * n);
  EXPECT_EQ(m.grad_flow, (std::vector<GradFlow>{GradFlow::kFresh, GradFlow::kFresh}));

  // HF OPT: max(scores, a 0-dim constant): the constant is kept too
  const OneOp constant("maximum", {{4, 8, 16}}, {}, {{{}, DType::kFloat32}});
  ASSERT_TRUE(constant.status.ok()) << constant.status.ToString();
  m = constant.Memory();
  EXPECT_EQ(m.saved_inputs, (std::vector<int>{0, 1}));
  EXPECT_EQ(Sum(m.backward_temps), 2 * n + 4 * n);
  EXPECT_EQ(m.grad_flow[1], GradFlow::kNone);

  // a broadcast operand's where() result is output-sized until it is reduced
  const OneOp broadcast("minimum", {{4, 8, 16}, {16}}, {});
  ASSERT_TRUE(broadcast.status.ok());
  EXPECT_EQ(Sum(broadcast.Memory().backward_temps), 2 * n + 4 * n + (4 * n - 4 * 16));

  // nothing needs grad: nothing kept
  const OneOp frozen("maximum", {{4, 8}, {4, 8}}, {}, {}, /*grad=*/false);
  ASSERT_TRUE(frozen.status.ok());
  EXPECT_TRUE(frozen.Memory().saved_inputs.empty());
}

TEST(CumsumRuleTest, IntegersSumIntoInt64ThroughACopy) {
  const OneOp mask("cumsum", {}, {{"dim", int64_t{1}}}, {{{2, 16}, DType::kInt32}});
  ASSERT_TRUE(mask.status.ok()) << mask.status.ToString();
  EXPECT_EQ(mask.out().dtype, DType::kInt64);
  EXPECT_EQ(Sum(mask.Memory(Runtime::kCpuTorch113).forward_temps), 2 * 16 * 8);
  const OneOp longs("cumsum", {}, {{"dim", int64_t{1}}}, {{{2, 16}, DType::kInt64}});
  EXPECT_TRUE(longs.Memory().forward_temps.empty());
}

TEST(CumsumRuleTest, BackwardFlipsSumsAndFlipsBack) {
  const OneOp f("cumsum", {{4, 8, 16}}, {{"dim", int64_t{1}}});
  ASSERT_TRUE(f.status.ok());
  const OpMemory m = f.Memory();
  EXPECT_TRUE(m.saved_inputs.empty());
  EXPECT_EQ(Sum(m.backward_temps), 2 * 4 * 8 * 16 * 4);
  EXPECT_EQ(m.grad_flow, (std::vector<GradFlow>{GradFlow::kFresh}));
  // a dim of one element: cumsum_backward returns the gradient itself
  const OneOp one("cumsum", {{4, 1, 16}}, {{"dim", int64_t{1}}});
  EXPECT_EQ(one.Memory().grad_flow, (std::vector<GradFlow>{GradFlow::kPassThrough}));
  const OneOp bad_dim("cumsum", {{4, 8}}, {{"dim", int64_t{2}}});
  ASSERT_FALSE(bad_dim.status.ok());
  EXPECT_NE(bad_dim.status.message().find("attrs.dim"), std::string::npos);
}

TEST(CopyIntoRuleTest, WritesInPlaceAndHandsTheGradientOn) {
  // dst, then src broadcast into it
  const OneOp c("copy_", {{2, 3, 12, 12}, {3, 12, 12}}, {});
  ASSERT_TRUE(c.status.ok()) << c.status.ToString();
  EXPECT_EQ(c.out().alias_of, c.graph.ops[c.op].inputs[0]);
  OpMemory m = c.Memory();
  EXPECT_TRUE(m.saved_inputs.empty() && m.backward_temps.empty());
  EXPECT_EQ(m.grad_flow, (std::vector<GradFlow>{GradFlow::kFresh, GradFlow::kFresh}));
  const OneOp same("copy_", {{2, 8}, {2, 8}}, {});
  EXPECT_EQ(same.Memory().grad_flow[1], GradFlow::kPassThrough);
  const OneOp bad("copy_", {{2, 8}, {3, 8}}, {});
  ASSERT_FALSE(bad.status.ok());
  EXPECT_NE(bad.status.message().find("inputs[1]"), std::string::npos) << bad.status.message();
}

}  // namespace
}  // namespace memest
