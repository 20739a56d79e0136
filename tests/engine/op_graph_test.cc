// The op-graph front end (what the tracer sends): references, names, attributes, shapes,
// rescaling from the traced batch, and the loss.
#include <gtest/gtest.h>

#include "tests/engine/test_graphs.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "engine/estimator.h"
#include "engine/models/layers.h"
#include "engine/models/model.h"
#include "engine/passes/checkpoint.h"
#include "engine/step/schedule.h"

namespace memest {
namespace {

BuildContext Context(int64_t micro_batch = 8, Mode mode = Mode::kTraining,
                     DType dtype = DType::kFloat32) {
  return enginetest::MakeContext(micro_batch, mode, dtype);
}

TensorSpec Leaf(std::string name, Shape shape, TensorRole role, DType dtype = DType::kFloat32,
                int batch_dim = 0) {
  TensorSpec t;
  t.name = std::move(name);
  t.shape = std::move(shape);
  t.role = role;
  t.dtype = dtype;
  t.batch_dim = batch_dim;
  return t;
}

OpSpec MakeOp(std::string kind, std::vector<std::string> inputs, std::vector<std::string> outputs,
              Attrs attrs = {}, std::string scope = "") {
  return OpSpec{std::move(kind), std::move(inputs), std::move(outputs), std::move(attrs),
                std::move(scope)};
}

// x [8, 16] -> fc (linear 16 -> 32) -> relu -> dropout -> head (linear 32 -> 4) ->
// cross_entropy against labels [8].
OpGraphSpec Classifier() {
  OpGraphSpec g;
  g.tensors = {Leaf("x", {8, 16}, TensorRole::kInput),
               Leaf("labels", {8}, TensorRole::kTarget, DType::kInt64),
               Leaf("fc.weight", {32, 16}, TensorRole::kParameter),
               Leaf("fc.bias", {32}, TensorRole::kParameter),
               Leaf("head.weight", {4, 32}, TensorRole::kParameter),
               Leaf("h", {8, 32}, TensorRole::kActivation)};
  g.ops = {MakeOp("linear", {"x", "fc.weight", "fc.bias"}, {"h"}, {}, "fc"),
           MakeOp("relu", {"h"}, {"a"}, {}, "act"),
           MakeOp("dropout", {"a"}, {"d"}, {{"p", AttrFloat(0.1)}}, "drop"),
           MakeOp("linear", {"d", "head.weight"}, {"logits"}, {}, "head"),
           MakeOp("cross_entropy", {"logits", "labels"}, {"loss"})};
  g.loss = "loss";
  g.blocks = {"fc", "head"};
  g.traced_batch = 8;
  return g;
}

TEST(OpGraphTest, BuildsAValidGraph) {
  StatusOr<Graph> g = BuildOpGraph(Classifier(), Context());
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->ops.size(), 5u);
  ASSERT_GE(g->loss, 0);
  EXPECT_TRUE(g->tensors[g->loss].shape.empty());
  EXPECT_EQ(g->loss_begin, 4);  // the first op that reads a target
  EXPECT_EQ(g->blocks, (std::vector<std::string>{"fc", "head"}));
  EXPECT_EQ(g->ParameterCount(), 32 * 16 + 32 + 4 * 32);
  EXPECT_EQ(g->ops[0].scope, "fc");
}

TEST(OpGraphTest, FloatingParametersTakeTheParamDtype) {
  StatusOr<Graph> g = BuildOpGraph(Classifier(), Context(8, Mode::kTraining, DType::kBFloat16));
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  for (const Tensor& t : g->tensors) {
    if (t.role == TensorRole::kParameter) {
      EXPECT_EQ(t.dtype, DType::kBFloat16) << t.name;
    }
    if (t.name == "labels") {
      EXPECT_EQ(t.dtype, DType::kInt64);
    }
  }
}

TEST(OpGraphTest, InferenceNeedsNoLoss) {
  OpGraphSpec spec = Classifier();
  spec.loss.clear();
  StatusOr<Graph> g = BuildOpGraph(spec, Context(8, Mode::kInference));
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->loss, -1);
}

// Traced at batch 8, run at batch 4 and 32: the input's batch dim is rescaled and every shape
// is re-inferred; a reshape written with -1 adapts, and a declared output whose dim scales with
// the batch (here [8*3, 16] flattened from [8, 3, 16]) is accepted at the new batch.
TEST(OpGraphTest, RescalesFromTheTracedBatch) {
  OpGraphSpec spec;
  spec.tensors = {Leaf("x", {8, 3, 16}, TensorRole::kInput),
                  Leaf("w", {5, 16}, TensorRole::kParameter),
                  Leaf("flat", {24, 16}, TensorRole::kActivation)};
  spec.ops = {MakeOp("reshape", {"x"}, {"flat"}, {{"shape", AttrInts({-1, 16})}}),
              MakeOp("linear", {"flat", "w"}, {"y"}), MakeOp("sum", {"y"}, {"loss"})};
  spec.loss = "loss";
  spec.traced_batch = 8;
  for (int64_t batch : {4, 8, 32}) {
    StatusOr<Graph> g = BuildOpGraph(spec, Context(batch));
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    EXPECT_EQ(g->tensors[0].shape, (Shape{batch, 3, 16}));
    EXPECT_EQ(g->tensors[g->ops[1].outputs[0]].shape, (Shape{batch * 3, 5}));
  }
}

TEST(OpGraphTest, RescalingChecksTheRecordedBatch) {
  OpGraphSpec spec = Classifier();
  spec.tensors[0].shape = {6, 16};  // traced_batch says 8
  StatusOr<Graph> g = BuildOpGraph(spec, Context(4));
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().message().rfind("model.tensors[0].shape[0]: the batch dim is 6", 0), 0u)
      << g.status().message();
}

struct ErrorCase {
  std::string what;
  OpGraphSpec spec;
  std::string message;  // the message starts with this
  Mode mode = Mode::kTraining;
};

std::vector<ErrorCase> ErrorCases() {
  std::vector<ErrorCase> cases;
  OpGraphSpec s = Classifier();
  s.ops[1].inputs[0] = "hh";
  cases.push_back(
      {"dangling reference", s, "model.ops[1].inputs[0]: 'hh' is neither declared nor produced"});
  s = Classifier();
  std::swap(s.ops[0], s.ops[1]);  // relu reads h before linear produces it
  cases.push_back({"use before definition", s,
                   "model.ops[0].inputs[0]: 'h' is not produced by any earlier op"});
  s = Classifier();
  s.tensors.push_back(Leaf("x", {8, 16}, TensorRole::kInput));
  cases.push_back({"duplicate declaration", s, "model.tensors[6].name: duplicate tensor name 'x'"});
  s = Classifier();
  s.ops[2].outputs = {"a"};
  cases.push_back({"duplicate output", s, "model.ops[2].outputs[0]: duplicate tensor name 'a'"});
  s = Classifier();
  s.ops[1].outputs = {"x"};
  cases.push_back(
      {"output named like an input", s, "model.ops[1].outputs[0]: duplicate tensor name 'x'"});
  s = Classifier();
  s.ops[1].kind = "relu6";
  cases.push_back({"unknown op kind", s, "model.ops[1].kind: unknown op 'relu6'"});
  s = Classifier();
  s.ops[2].attrs["p"] = AttrFloat(std::nan(""));
  cases.push_back({"NaN attribute", s, "model.ops[2].attrs.p: must be finite"});
  s = Classifier();
  s.ops[2].attrs["p"] = AttrFloat(std::numeric_limits<double>::infinity());
  cases.push_back({"infinite attribute", s, "model.ops[2].attrs.p: must be finite"});
  s = Classifier();
  s.tensors[0].shape = {8, int64_t{1} << 40, int64_t{1} << 40};
  cases.push_back({"overflowing shape", s, "model.tensors[0].shape"});
  s = Classifier();
  s.tensors[2].shape = {32, -16};
  cases.push_back({"negative size", s, "model.tensors[2].shape[1]: must be non-negative, got -16"});
  s = Classifier();
  s.tensors[5].shape = {8, 33};
  cases.push_back({"declared shape disagrees", s,
                   "model.tensors[5].shape: declared [8, 33], but model.ops[0] (linear) produces "
                   "[8, 32]"});
  s = Classifier();
  s.tensors.push_back(Leaf("ghost", {8}, TensorRole::kActivation));
  cases.push_back({"declared but never produced", s,
                   "model.tensors[6]: 'ghost' is declared as an op output, but no op produces it"});
  s = Classifier();
  s.tensors[2].shape = {32, 15};
  cases.push_back({"shape mismatch in a rule", s, "model.ops[0]"});
  s = Classifier();
  s.loss = "lossy";
  cases.push_back({"missing loss", s, "model.loss: 'lossy' is not a tensor of the graph"});
  s = Classifier();
  s.loss = "logits";
  cases.push_back(
      {"non-scalar loss", s, "model.loss: 'logits' must be a scalar, got shape [8, 4]"});
  s = Classifier();
  s.loss.clear();
  cases.push_back({"no loss in training", s, "model.loss: training needs"});
  s = Classifier();
  s.blocks = {"fc", "encoder"};
  cases.push_back({"unknown block scope", s, "model.blocks[1]: no op runs in scope 'encoder'"});
  s = Classifier();
  s.ops[4].outputs = {"loss", "extra"};
  cases.push_back({"too many outputs named", s,
                   "model.ops[4].outputs: cross_entropy has 1 outputs, 2 are named"});
  s = Classifier();
  s.tensors[0].batch_dim = 2;
  cases.push_back({"batch dim out of range", s, "model.tensors[0].batch_dim: 2 is out of range"});
  s = Classifier();
  s.checkpoints = {{2, 1}};
  cases.push_back({"empty checkpoint", s, "model.checkpoints[0]: ops 2 to 1 are not a range"});
  s = Classifier();
  s.checkpoints = {{0, 9}};
  cases.push_back({"checkpoint past the end", s, "model.checkpoints[0]: ops 0 to 9 are not a range"});
  s = Classifier();
  s.checkpoints = {{0, 1}, {1, 2}};
  cases.push_back({"overlapping checkpoints", s, "model.checkpoints[1]: overlaps"});
  s = Classifier();
  s.checkpoints = {{3, 4}};
  cases.push_back({"checkpoint in the loss", s, "model.checkpoints[0]: reaches op 4, but the loss"});
  return cases;
}

TEST(OpGraphTest, ErrorsNameTheField) {
  for (const ErrorCase& c : ErrorCases()) {
    SCOPED_TRACE(c.what);
    StatusOr<Graph> g = BuildOpGraph(c.spec, Context(8, c.mode));
    ASSERT_FALSE(g.ok());
    EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(g.status().message().rfind(c.message, 0), 0u) << g.status().message();
  }
}

// torch.utils.checkpoint in the model's code, as memest.trace records it: the regions are the
// graph's own, mapped past the casts autocast inserts, and they replace any policy.
TEST(OpGraphTest, TheModelsOwnCheckpointsAreItsRegions) {
  OpGraphSpec s = Classifier();
  s.checkpoints = {{0, 2}};  // fc, relu, dropout
  BuildContext ctx = Context();
  ctx.autocast = DType::kBFloat16;  // casts of x and fc.weight come before the linear
  StatusOr<Graph> g = BuildOpGraph(s, ctx);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  ASSERT_EQ(g->checkpoints.size(), 1u);
  const auto [first, last] = g->checkpoints[0];
  EXPECT_EQ(g->ops[first].kind, "to");
  EXPECT_EQ(g->ops[last].kind, "dropout");
  EXPECT_EQ(g->ops[last + 1].scope, "head");

  StatusOr<CheckpointRegions> regions = PlanCheckpoints(*g, CheckpointConfig{});
  ASSERT_TRUE(regions.ok());
  EXPECT_EQ(*regions, g->checkpoints);
  CheckpointConfig twice;
  twice.policy = CheckpointPolicy::kEveryBlock;
  regions = PlanCheckpoints(*g, twice);
  ASSERT_FALSE(regions.ok());
  EXPECT_EQ(regions.status().message().rfind("config.checkpoint.policy: the model checkpoints in "
                                             "its own code", 0), 0u);
}

// Regions checkpointed in the model's code are scheduled as a policy's are: one region per
// scope here, as the scopes policy makes them, gives the same step; one region over all three
// keeps less than none.
TEST(OpGraphTest, OwnCheckpointsSaveWhatThePolicyWould) {
  OpGraphSpec own = Classifier();
  own.blocks = {};
  own.checkpoints = {{0, 0}, {1, 1}, {2, 2}};
  OpGraphSpec plain = Classifier();
  RunConfig config;
  config.batch_size = 8;
  CheckpointConfig by_scope;
  by_scope.policy = CheckpointPolicy::kScopes;
  by_scope.scopes = {"fc", "act", "drop"};
  RunConfig policy = config;
  policy.checkpoint = by_scope;
  StatusOr<Report> a = Estimate(ModelSpec{own}, config, {1'000'000, false});
  StatusOr<Report> b = Estimate(ModelSpec{plain}, policy, {1'000'000, false});
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(a->saved_for_backward_bytes, b->saved_for_backward_bytes);
  EXPECT_EQ(a->peak.allocated_bytes, b->peak.allocated_bytes);
  StatusOr<Report> none = Estimate(ModelSpec{plain}, config, {1'000'000, false});
  OpGraphSpec one = Classifier();
  one.checkpoints = {{0, 2}};
  StatusOr<Report> c = Estimate(ModelSpec{one}, config, {1'000'000, false});
  ASSERT_TRUE(none.ok() && c.ok());
  EXPECT_LT(c->saved_for_backward_bytes, none->saved_for_backward_bytes);
}

TEST(OpGraphTest, BuildGraphDispatchesOnTheVariant) {
  ModelSpec model;
  model.source = Classifier();
  StatusOr<Graph> g = BuildGraph(model, Context());
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->ops.size(), 5u);
  model.source = PresetSpec{"mlp", {{"layers", 2}}};
  g = BuildGraph(model, Context());
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->blocks.size(), 2u);
  LayerModelSpec layers;
  layers.input_shape = {4};
  layers.layers = {LayerSpec{"linear", "", {{"out_features", AttrInt(2)}}}};
  model.source = layers;
  g = BuildGraph(model, Context());
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->ParameterCount(), 4 * 2 + 2);
  g = BuildGraph(model, Context(0));
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().message().rfind("config.batch_size", 0), 0u);
}

TEST(OpGraphTest, RefusesGraphsOverTheOpLimit) {
  BuildContext c = Context();
  c.max_ops = 3;
  StatusOr<Graph> g = BuildOpGraph(Classifier(), c);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace memest
