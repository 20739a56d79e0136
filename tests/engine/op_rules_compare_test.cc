// The rules of engine/rules/compare.cc (comparisons, maximum / minimum, cumsum), copy_,
// bmm_into, softmax and gelu in place,
// engine/rules/select.cc (nonzero, topk, sort, max, index_put_, index with several indices) and
// engine/rules/detection.cc (nms, roi_align): what each keeps and allocates, with the numbers
// derived from derivatives.yaml and the aten / torchvision kernels (the conformance suite's
// ops/compare_masks, ops/maximum_*, ops/cumsum*, ops/copy_into_slice and detection/* check them
// against PyTorch 1.13), and the inputs they refuse.
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

// 1.13's native_multi_head_attention: the attention output written into q's storage, and the
// scores soft-maxed in place; _addmm_activation's gelu_.
TEST(CopyIntoRuleTest, BmmIntoWritesTheProductIntoItsDestination) {
  const OneOp c("bmm_into", {{8, 16, 4}, {8, 16, 16}, {8, 16, 4}}, {});
  ASSERT_TRUE(c.status.ok()) << c.status.ToString();
  EXPECT_EQ(c.out().alias_of, c.graph.ops[c.op].inputs[0]);
  EXPECT_EQ(c.out().shape, (Shape{8, 16, 4}));
  const OpMemory m = c.Memory();
  EXPECT_EQ(m.saved_inputs, (std::vector<int>{1, 2}));  // as bmm's, with autograd on
  EXPECT_TRUE(m.forward_temps.empty());
  const OneOp shape("bmm_into", {{8, 16, 5}, {8, 16, 16}, {8, 16, 4}}, {});
  ASSERT_FALSE(shape.status.ok());
  EXPECT_NE(shape.status.message().find("inputs[0]: the product is [8, 16, 4]"), std::string::npos)
      << shape.status.message();
  const OneOp dtype("bmm_into", {{8, 16, 4}, {8, 16, 16}}, {}, {{{8, 16, 4}, DType::kBFloat16}});
  ASSERT_FALSE(dtype.status.ok());
  EXPECT_NE(dtype.status.message().find("inputs[2]"), std::string::npos) << dtype.status.message();
}

TEST(CopyIntoRuleTest, SoftmaxAndGeluInPlaceMakeNoStorage) {
  const OneOp sm("softmax", {{8, 16, 16}}, {{"dim", int64_t{-1}}, {"inplace", int64_t{1}}});
  ASSERT_TRUE(sm.status.ok()) << sm.status.ToString();
  EXPECT_EQ(sm.out().alias_of, sm.graph.ops[sm.op].inputs[0]);
  EXPECT_EQ(sm.Memory().saved_outputs, (std::vector<int>{0}));
  const OneOp h2f("softmax", {{8, 16}}, {{"inplace", int64_t{1}}, {"half_to_float", int64_t{1}}});
  ASSERT_FALSE(h2f.status.ok());
  EXPECT_NE(h2f.status.message().find("attrs.inplace"), std::string::npos) << h2f.status.message();
  const OneOp gelu("gelu", {{8, 16}}, {{"inplace", int64_t{1}}});
  ASSERT_TRUE(gelu.status.ok()) << gelu.status.ToString();
  EXPECT_EQ(gelu.out().alias_of, gelu.graph.ops[gelu.op].inputs[0]);
  // gelu's backward reads self: in place autograd keeps a clone of it
  EXPECT_EQ(Sum(gelu.Memory().saved_extras), 8 * 16 * 4);
  EXPECT_EQ(OneOp("gelu", {{8, 16}}, {}).Memory().saved_inputs, (std::vector<int>{0}));
}

// embedding_dense_backward takes grad_.contiguous(): a gradient that reaches it transposed
// (nn.MultiheadAttention's batch-first input, the zoo's self_attention) is copied first.
TEST(CopyIntoRuleTest, EmbeddingBackwardWantsAContiguousGradient) {
  const OneOp e("embedding", {{256, 64}}, {}, {{{2, 16}, DType::kInt64}});
  ASSERT_TRUE(e.status.ok()) << e.status.ToString();
  EXPECT_TRUE(e.Memory(Runtime::kCpuTorch113).backward_needs_contiguous_grad);
  EXPECT_TRUE(e.Memory(Runtime::kCuda).backward_needs_contiguous_grad);
}

TEST(SelectRuleTest, NonzeroCarriesItsCountAndPassesNoGradient) {
  const OneOp nz("nonzero", {}, {{"count", int64_t{7}}}, {{{300}, DType::kBool}});
  ASSERT_TRUE(nz.status.ok()) << nz.status.ToString();
  EXPECT_EQ(nz.out().shape, (Shape{7, 1}));
  EXPECT_EQ(nz.out().dtype, DType::kInt64);
  const OneOp too_many("nonzero", {}, {{"count", int64_t{301}}}, {{{300}, DType::kBool}});
  ASSERT_FALSE(too_many.status.ok());
  EXPECT_NE(too_many.status.message().find("attrs.count"), std::string::npos);
}

TEST(SelectRuleTest, TopkAndSortKeepTheirIndices) {
  const OneOp topk("topk", {{4, 8, 16}}, {{"k", int64_t{3}}, {"dim", int64_t{1}}});
  ASSERT_TRUE(topk.status.ok()) << topk.status.ToString();
  EXPECT_EQ(topk.out().shape, (Shape{4, 3, 16}));
  EXPECT_EQ(topk.graph.tensors[topk.graph.ops[topk.op].outputs[1]].dtype, DType::kInt64);
  OpMemory m = topk.Memory(Runtime::kCpuTorch113);
  EXPECT_EQ(m.saved_outputs, (std::vector<int>{1}));
  EXPECT_TRUE(m.forward_temps.empty());
  // 1.13's CPU sort fills the indices from an arange over the sorted dim
  const OneOp sort("sort", {{4, 8, 16}}, {{"dim", int64_t{1}}});
  ASSERT_TRUE(sort.status.ok());
  EXPECT_EQ(Sum(sort.Memory(Runtime::kCpuTorch113).forward_temps), 8 * 8);
  EXPECT_TRUE(sort.Memory(Runtime::kCuda).forward_temps.empty());
  const OneOp bad("topk", {{4, 8}}, {{"k", int64_t{9}}});
  ASSERT_FALSE(bad.status.ok());
  EXPECT_NE(bad.status.message().find("attrs.k"), std::string::npos);
}

TEST(SelectRuleTest, MaxOfAllKeepsInputAndResult) {
  const int64_t n = 4 * 8 * 16;
  const OneOp max("max", {{4, 8, 16}}, {});
  ASSERT_TRUE(max.status.ok());
  EXPECT_TRUE(max.out().shape.empty());
  const OpMemory m = max.Memory(Runtime::kCpuTorch113);
  EXPECT_EQ(m.saved_inputs, (std::vector<int>{0}));
  EXPECT_EQ(m.saved_outputs, (std::vector<int>{0}));
  EXPECT_EQ(Sum(m.backward_temps), 9 * n);  // the bool mask and its int64 copy under sum
  EXPECT_EQ(Sum(max.Memory(Runtime::kCuda).backward_temps), 2 * n);
}

TEST(SelectRuleTest, IndexPutWritesInPlace) {
  // out[:, idx] = values (MultiScaleRoIAlign's result[idx_in_level] = ...)
  const OneOp put("index_put_", {{4, 16, 8}, {4, 6, 8}}, {{"dim", int64_t{1}}},
                  {{{6}, DType::kInt64}});
  ASSERT_FALSE(put.status.ok());  // inputs[1] is the index: a floating one is refused
  GraphBuilder b;
  const int x = b.Input("x", {4, 16, 8}, DType::kFloat32, -1);
  const int idx = b.Input("idx", {6}, DType::kInt64, -1);
  const int v = b.Add1("mul", {b.Parameter("v", {4, 6, 8}, DType::kFloat32)}, {{"scalar", 1.0}});
  const int y = b.Add1("index_put_", {x, idx, v}, {{"dim", int64_t{1}}});
  StatusOr<Graph> g = b.Finish();
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->tensors[y].alias_of, x);
  const Op& op = g->ops.back();
  OpCall call{op, {&g->tensors[x], &g->tensors[idx], &g->tensors[v]}, {&g->tensors[y]}, "", true};
  const OpMemory m = OpMemoryOf(call);
  EXPECT_EQ(m.saved_inputs, (std::vector<int>{1}));
  EXPECT_EQ(m.grad_flow[2], GradFlow::kFresh);
  GraphBuilder bad;
  bad.Add("index_put_", {bad.Input("x", {4, 16}, DType::kFloat32, -1),
                         bad.Input("i", {6}, DType::kInt64, -1),
                         bad.Input("v", {5}, DType::kFloat32, -1)}, {});
  StatusOr<Graph> refused = bad.Finish();
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("inputs[2]"), std::string::npos);
}

TEST(SelectRuleTest, IndexTakesIndicesForConsecutiveDims) {
  // objectness[batch_idx [B, 1], top_n_idx [B, k]]
  const OneOp ix("index", {{4, 64}}, {}, {{{4, 1}, DType::kInt64}, {{4, 8}, DType::kInt64}});
  ASSERT_TRUE(ix.status.ok()) << ix.status.ToString();
  EXPECT_EQ(ix.out().shape, (Shape{4, 8}));
  const OpMemory m = ix.Memory(Runtime::kCuda);
  EXPECT_EQ(m.saved_inputs, (std::vector<int>{1, 2}));
  EXPECT_EQ(Sum(m.backward_temps), 4 * 32 * 8);  // one linear index per broadcast element
  const OneOp three("index", {{4, 8}}, {}, {{{2}, DType::kInt64}, {{2}, DType::kInt64},
                                            {{2}, DType::kInt64}});
  EXPECT_FALSE(three.status.ok());
}

// torchvision's nms: the CPU kernel's result views its [N] int64 keep buffer, and its peak is the
// sort (measured: 40 N bytes for float32 boxes); CUDA's suppression mask is N * ceil(N / 64) int64.
TEST(DetectionRuleTest, NmsScratchOnEachRuntime) {
  const int64_t n = 300;
  const OneOp nms("nms", {}, {{"iou_threshold", 0.5}, {"count", int64_t{182}}},
                  {{{n, 4}, DType::kFloat32}, {{n}, DType::kFloat32}});
  ASSERT_TRUE(nms.status.ok()) << nms.status.ToString();
  EXPECT_EQ(nms.out().shape, (Shape{182}));
  OpMemory cpu = nms.Memory(Runtime::kCpuTorch113);
  EXPECT_EQ(cpu.output_storage_bytes, (std::vector<int64_t>{8 * n}));
  EXPECT_EQ(Sum(cpu.forward_temps) + 8 * n, 40 * n);
  OpMemory cuda = nms.Memory(Runtime::kCuda);
  EXPECT_EQ(Sum(cuda.forward_temps), 8 * n + 16 * n + 8 * n * 5 + 8 * 182);
  const OneOp bad("nms", {}, {{"count", int64_t{1}}}, {{{n, 5}, DType::kFloat32}, {{n}, DType::kFloat32}});
  ASSERT_FALSE(bad.status.ok());
  EXPECT_NE(bad.status.message().find("inputs[0]"), std::string::npos);
}

TEST(DetectionRuleTest, RoiAlignKeepsTheRois) {
  const OneOp roi("roi_align", {{2, 8, 16, 16}},
                  {{"output_size", std::vector<int64_t>{7, 7}}, {"spatial_scale", 0.25}},
                  {{{10, 5}, DType::kFloat32}});
  ASSERT_TRUE(roi.status.ok()) << roi.status.ToString();
  EXPECT_EQ(roi.out().shape, (Shape{10, 8, 7, 7}));
  const OpMemory m = roi.Memory();
  EXPECT_EQ(m.saved_inputs, (std::vector<int>{1}));
  EXPECT_EQ(m.grad_flow, (std::vector<GradFlow>{GradFlow::kFresh, GradFlow::kNone}));
  const OneOp bad("roi_align", {{2, 8, 16, 16}}, {{"output_size", std::vector<int64_t>{7}}},
                  {{{10, 5}, DType::kFloat32}});
  EXPECT_FALSE(bad.status.ok());
}

}  // namespace
}  // namespace memest
