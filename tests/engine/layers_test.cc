// The layer-model front end: every layer kind expands, and every bad input is refused with a
// message naming its field.
#include "engine/models/layers.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "engine/models/model.h"

namespace memest {
namespace {

BuildContext Context(int64_t micro_batch = 2, Mode mode = Mode::kTraining) {
  BuildContext c;
  c.micro_batch = micro_batch;
  c.mode = mode;
  return c;
}

LayerModelSpec OneLayer(Shape input, LayerSpec layer, DType dtype = DType::kFloat32) {
  LayerModelSpec m;
  m.input_shape = std::move(input);
  m.input_dtype = dtype;
  m.layers = {std::move(layer)};
  return m;
}

const Tensor& Output(const Graph& g, int op_from_end = 0) {
  // The model's output is the input of the loss (sum) when training.
  return g.tensors[g.ops[g.ops.size() - 1 - op_from_end].inputs[0]];
}

// Output shapes worked out from PyTorch's shape formulas for a batch of 2:
// conv: (in + 2p - d(k-1) - 1) / s + 1; pools likewise; attention keeps [N, T, d].
struct KindCase {
  std::string kind;
  Shape input;  // without the batch dim
  Attrs attrs;
  Shape output;  // with the batch dim
  DType dtype = DType::kFloat32;
};

class LayerKindTest : public testing::TestWithParam<KindCase> {};

TEST_P(LayerKindTest, BuildsWithTheExpectedOutput) {
  const KindCase& c = GetParam();
  LayerModelSpec m = OneLayer(c.input, LayerSpec{c.kind, "", c.attrs}, c.dtype);
  StatusOr<Graph> g = BuildLayerModel(m, Context());
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(Output(*g).shape, c.output);
  EXPECT_EQ(g->blocks, std::vector<std::string>{"0"});
  ASSERT_GE(g->loss, 0);
  for (const Op& op : g->ops) {
    if (static_cast<int>(&op - &g->ops[0]) < g->loss_begin) {
      EXPECT_EQ(op.scope.substr(0, 1), "0");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Kinds, LayerKindTest,
    testing::Values(
        KindCase{"linear", {16, 32}, {{"out_features", AttrInt(64)}}, {2, 16, 64}},
        KindCase{
            "conv1d",
            {4, 100},
            {{"out_channels", AttrInt(8)}, {"kernel_size", AttrInt(5)}, {"stride", AttrInt(2)}},
            {2, 8, 48}},
        KindCase{
            "conv2d",
            {3, 32, 32},
            {{"out_channels", AttrInt(16)}, {"kernel_size", AttrInt(3)}, {"padding", AttrInt(1)}},
            {2, 16, 32, 32}},
        KindCase{"mlp", {10, 32}, {{"hidden", AttrInt(128)}}, {2, 10, 32}},
        KindCase{
            "attention", {10, 64}, {{"heads", AttrInt(4)}, {"causal", AttrInt(1)}}, {2, 10, 64}},
        KindCase{"transformer_block", {10, 64}, {{"heads", AttrInt(4)}}, {2, 10, 64}},
        KindCase{"transformer_block",
                 {10, 64},
                 {{"heads", AttrInt(4)}, {"style", std::string("llama")}, {"kv_heads", AttrInt(2)}},
                 {2, 10, 64}},
        KindCase{"layer_norm", {10, 64}, {}, {2, 10, 64}},
        KindCase{"batch_norm", {8, 5, 5}, {}, {2, 8, 5, 5}},
        KindCase{"group_norm", {8, 5, 5}, {{"num_groups", AttrInt(4)}}, {2, 8, 5, 5}},
        KindCase{"rms_norm", {10, 64}, {{"upcast", AttrInt(1)}}, {2, 10, 64}},
        KindCase{"relu", {7}, {}, {2, 7}},
        KindCase{"gelu", {7}, {{"approximate", std::string("tanh")}}, {2, 7}},
        KindCase{"silu", {7}, {}, {2, 7}}, KindCase{"sigmoid", {7}, {}, {2, 7}},
        KindCase{"tanh", {7}, {}, {2, 7}}, KindCase{"swish", {7}, {}, {2, 7}},
        KindCase{"softmax", {3, 7}, {{"dim", AttrInt(1)}}, {2, 3, 7}},
        KindCase{"dropout", {7}, {{"p", AttrFloat(0.2)}}, {2, 7}},
        KindCase{"max_pool2d", {3, 8, 8}, {{"kernel_size", AttrInt(2)}}, {2, 3, 4, 4}},
        KindCase{"avg_pool2d",
                 {3, 9, 9},
                 {{"kernel_size", AttrInt(3)}, {"stride", AttrInt(2)}},
                 {2, 3, 4, 4}},
        KindCase{"adaptive_avg_pool2d", {3, 9, 9}, {}, {2, 3, 1, 1}},
        KindCase{"flatten", {3, 4, 5}, {}, {2, 60}},
        KindCase{"embedding",
                 {12},
                 {{"num_embeddings", AttrInt(100)}, {"embedding_dim", AttrInt(16)}},
                 {2, 12, 16},
                 DType::kInt64}));

TEST(LayerModelTest, CoversEveryKnownKind) {
  // Each kind in LayerKinds() appears in the table above (transformer_block twice).
  std::vector<std::string> kinds = LayerKinds();
  EXPECT_EQ(kinds.size(), 23u);
  EXPECT_TRUE(std::is_sorted(kinds.begin(), kinds.end()));
}

TEST(LayerModelTest, SwishIsSigmoidTimesInput) {
  StatusOr<Graph> g = BuildLayerModel(OneLayer({7}, LayerSpec{"swish", "act", {}}), Context());
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  ASSERT_GE(g->ops.size(), 2u);
  EXPECT_EQ(g->ops[0].kind, "sigmoid");
  EXPECT_EQ(g->ops[1].kind, "mul");
  EXPECT_EQ(g->ops[1].inputs[0], 0);  // x * sigmoid(x)
  EXPECT_EQ(g->ops[0].scope, "act");
}

TEST(LayerModelTest, AttentionScaleOptions) {
  // Default: the [N, H, T, T] scores are divided by sqrt(head_dim); scale_qk=1 instead scales
  // q and k (each [N, H, T, hd]) by head_dim**-0.25 (seed 004).
  for (int scale_qk : {0, 1}) {
    Attrs attrs = {{"heads", AttrInt(4)}, {"scale_qk", AttrInt(scale_qk)}};
    StatusOr<Graph> g =
        BuildLayerModel(OneLayer({10, 64}, LayerSpec{"attention", "attn", attrs}), Context());
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    int divs = 0, scalar_muls = 0;
    for (const Op& op : g->ops) {
      if (op.scope != "attn.core") continue;
      divs += op.kind == "div";
      scalar_muls += op.kind == "mul" && HasAttr(op.attrs, "scalar");
    }
    EXPECT_EQ(divs, scale_qk ? 0 : 1);
    EXPECT_EQ(scalar_muls, scale_qk ? 2 : 0);
  }
}

TEST(LayerModelTest, LayerNamesAreScopesAndBlocks) {
  LayerModelSpec m;
  m.input_shape = {784};
  m.layers = {LayerSpec{"linear", "fc1", {{"out_features", AttrInt(256)}}},
              LayerSpec{"relu", "", {}},
              LayerSpec{"linear", "fc2", {{"out_features", AttrInt(10)}}}};
  m.loss = "cross_entropy";
  StatusOr<Graph> g = BuildLayerModel(m, Context(8));
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->blocks, (std::vector<std::string>{"fc1", "1", "fc2"}));
  // 784*256 + 256 + 256*10 + 10 parameters.
  EXPECT_EQ(g->ParameterCount(), 784 * 256 + 256 + 256 * 10 + 10);
  EXPECT_EQ(g->ops[g->tensors[g->loss].producer].kind, "cross_entropy");
  EXPECT_EQ(g->tensors[g->ops[g->loss_begin].inputs[0]].shape, (Shape{8, 10}));
}

TEST(LayerModelTest, LossesAndInference) {
  LayerModelSpec m = OneLayer({5, 7}, LayerSpec{"linear", "", {{"out_features", AttrInt(3)}}});
  m.loss = "cross_entropy";  // [N, 5, 3] logits: reshaped to [N*5, 3]
  StatusOr<Graph> g = BuildLayerModel(m, Context(2));
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const Op& ce = g->ops[g->tensors[g->loss].producer];
  EXPECT_EQ(g->tensors[ce.inputs[0]].shape, (Shape{10, 3}));
  m.loss = "mse";
  g = BuildLayerModel(m, Context(2));
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->ops[g->tensors[g->loss].producer].kind, "mse_loss");
  g = BuildLayerModel(m, Context(2, Mode::kInference));
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->loss, -1);
}

struct ErrorCase {
  std::string what;
  LayerModelSpec model;
  std::string message;  // the message starts with this
};

LayerModelSpec Layers(Shape input, std::vector<LayerSpec> layers, DType dtype = DType::kFloat32) {
  LayerModelSpec m;
  m.input_shape = std::move(input);
  m.layers = std::move(layers);
  m.input_dtype = dtype;
  return m;
}

TEST(LayerModelTest, ErrorsNameTheField) {
  const LayerSpec relu{"relu", "", {}};
  const std::vector<ErrorCase> cases = {
      {"unknown kind", Layers({8}, {relu, LayerSpec{"conv3d", "", {}}}),
       "model.layers[1].kind: unknown layer kind 'conv3d'; known kinds: adaptive_avg_pool2d"},
      {"negative out_features",
       Layers({8}, {relu, relu, relu, LayerSpec{"linear", "", {{"out_features", AttrInt(-4)}}}}),
       "model.layers[3].attrs.out_features: must be positive, got -4"},
      {"missing attribute", Layers({8}, {LayerSpec{"linear", "", {}}}),
       "model.layers[0].attrs.out_features: required"},
      {"misspelt attribute", Layers({8}, {LayerSpec{"linear", "", {{"out_feature", AttrInt(4)}}}}),
       "model.layers[0].attrs.out_feature: not an attribute of linear; known: out_features"},
      {"mistyped attribute",
       Layers({8}, {LayerSpec{"linear", "", {{"out_features", std::string("four")}}}}),
       "model.layers[0].attrs.out_features: must be an integer"},
      {"in_features mismatch",
       Layers({8}, {LayerSpec{
                       "linear", "", {{"out_features", AttrInt(4)}, {"in_features", AttrInt(9)}}}}),
       "model.layers[0].attrs.in_features: must match the input's last dim 8, got 9"},
      {"conv2d after flatten",
       Layers(
           {3, 8, 8},
           {LayerSpec{"flatten", "", {}},
            LayerSpec{"conv2d", "", {{"out_channels", AttrInt(4)}, {"kernel_size", AttrInt(3)}}}}),
       "model.layers[1]: conv2d expects an input [N, C, H, W], got shape [2, 192]"},
      {"conv groups",
       Layers({6, 8, 8}, {LayerSpec{"conv2d",
                                    "",
                                    {{"out_channels", AttrInt(4)},
                                     {"kernel_size", AttrInt(3)},
                                     {"groups", AttrInt(4)}}}}),
       "model.layers[0].attrs.groups: must divide"},
      {"kernel larger than input",
       Layers(
           {3, 4, 4},
           {LayerSpec{"conv2d", "", {{"out_channels", AttrInt(4)}, {"kernel_size", AttrInt(7)}}}}),
       "model.layers[0].attrs.kernel_size: 7 (dilated) is larger than the padded input"},
      {"heads do not divide",
       Layers({10, 64}, {LayerSpec{"attention", "", {{"heads", AttrInt(5)}}}}),
       "model.layers[0].attrs.heads: must divide d_model 64, got 5"},
      {"kv heads in gpt2 style",
       Layers(
           {10, 64},
           {LayerSpec{"transformer_block", "", {{"heads", AttrInt(4)}, {"kv_heads", AttrInt(2)}}}}),
       "model.layers[0].attrs.kv_heads: must divide heads 4 and equal it in the gpt2 style"},
      {"bad style",
       Layers({10, 64}, {LayerSpec{"transformer_block",
                                   "",
                                   {{"heads", AttrInt(4)}, {"style", std::string("bert")}}}}),
       "model.layers[0].attrs.style: must be one of gpt2, llama, got 'bert'"},
      {"dropout p", Layers({8}, {LayerSpec{"dropout", "", {{"p", AttrFloat(1.5)}}}}),
       "model.layers[0].attrs.p: must be in [0, 1)"},
      {"NaN dropout p", Layers({8}, {LayerSpec{"dropout", "", {{"p", AttrFloat(std::nan(""))}}}}),
       "model.layers[0].attrs.p: must be finite"},
      {"softmax dim", Layers({8}, {LayerSpec{"softmax", "", {{"dim", AttrInt(2)}}}}),
       "model.layers[0].attrs.dim: out of range for an input of rank 2, got 2"},
      {"group count", Layers({6, 4}, {LayerSpec{"group_norm", "", {{"num_groups", AttrInt(4)}}}}),
       "model.layers[0].attrs.num_groups: must divide the input's 6 channels, got 4"},
      {"embedding of floats",
       Layers({8}, {LayerSpec{"embedding",
                              "",
                              {{"num_embeddings", AttrInt(10)}, {"embedding_dim", AttrInt(4)}}}}),
       "model.layers[0]: embedding expects integer indices"},
      {"pool padding",
       Layers(
           {3, 8, 8},
           {LayerSpec{"max_pool2d", "", {{"kernel_size", AttrInt(2)}, {"padding", AttrInt(2)}}}}),
       "model.layers[0].attrs.padding: must be at most half the kernel size 2, got 2"},
      {"flag", Layers({8}, {LayerSpec{"relu", "", {{"inplace", AttrInt(2)}}}}),
       "model.layers[0].attrs.inplace: must be 0 or 1, got 2"},
      {"duplicate names", Layers({8}, {LayerSpec{"relu", "a", {}}, LayerSpec{"relu", "a", {}}}),
       "model.layers[1].name: 'a' names an earlier layer too"},
      {"negative input dim", Layers({8, -3}, {relu}),
       "model.input_shape[1]: must be positive, got -3"},
      {"no layers", Layers({8}, {}), "model.layers: must list at least one layer"},
  };
  for (const ErrorCase& c : cases) {
    SCOPED_TRACE(c.what);
    StatusOr<Graph> g = BuildLayerModel(c.model, Context());
    ASSERT_FALSE(g.ok());
    EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(g.status().message().rfind(c.message, 0), 0u) << g.status().message();
  }
}

TEST(LayerModelTest, UnknownLossNamesTheField) {
  LayerModelSpec m = OneLayer({8}, LayerSpec{"relu", "", {}});
  m.loss = "hinge";
  StatusOr<Graph> g = BuildLayerModel(m, Context());
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().message().rfind("model.loss: must be one of", 0), 0u);
}

TEST(LayerModelTest, OverflowingInputIsRefused) {
  LayerModelSpec m = OneLayer({int64_t{1} << 31, int64_t{1} << 31}, LayerSpec{"relu", "", {}});
  StatusOr<Graph> g = BuildLayerModel(m, Context());
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("model.input_shape"), std::string::npos)
      << g.status().message();
}

TEST(LayersTest, HelpersNameParametersAfterTheModulePath) {
  GraphBuilder b;
  LayerContext c;
  int x = b.Input("x", {2, 5, 32}, DType::kFloat32);
  {
    ScopeGuard scope(b, "blocks.0");
    x = Linear(b, c, "proj", x, 16);
    x = LayerNorm(b, c, "norm", x);
  }
  StatusOr<Graph> g = b.Finish();
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  std::vector<std::string> names;
  for (const Tensor& t : g->tensors) {
    if (t.role == TensorRole::kParameter) names.push_back(t.name);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"blocks.0.proj.weight", "blocks.0.proj.bias",
                                             "blocks.0.norm.weight", "blocks.0.norm.bias"}));
  EXPECT_EQ(g->ops[0].scope, "blocks.0.proj");
}

TEST(LayersTest, GroupedQueryAttentionRepeatsKv) {
  // 8 heads over 2 kv heads: k and v are [N, 2, T, hd], repeated 4x by unsqueeze + expand +
  // reshape into [N, 8, T, hd] (HF repeat_kv).
  GraphBuilder b;
  LayerContext c;
  int x = b.Input("x", {1, 6, 64}, DType::kFloat32);
  AttentionOptions o;
  o.heads = 8;
  o.kv_heads = 2;
  o.causal = true;
  x = Attention(b, c, "attn", x, o);
  StatusOr<Graph> g = b.Finish();
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  int expands = 0;
  for (const Op& op : g->ops) {
    if (op.kind != "expand") continue;
    ++expands;
    EXPECT_EQ(g->tensors[op.outputs[0]].shape, (Shape{1, 2, 4, 6, 8}));
  }
  EXPECT_EQ(expands, 2);
  // k_proj: 64 -> 2 * 8.
  for (const Tensor& t : g->tensors) {
    if (t.name == "attn.k_proj.weight") {
      EXPECT_EQ(t.shape, (Shape{16, 64}));
    }
  }
}

}  // namespace
}  // namespace memest
