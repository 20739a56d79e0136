// An op graph's batch (engine/models/op_graph_batch.h): full, the batch_dim of expand and full,
// and a graph without traced_batch against the run's micro-batch.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/models/layers.h"
#include "engine/models/model.h"
#include "tests/engine/test_graphs.h"

namespace memest {
namespace {

TensorSpec Leaf(std::string name, Shape shape, TensorRole role, DType dtype = DType::kFloat32) {
  TensorSpec t;
  t.name = std::move(name);
  t.shape = std::move(shape);
  t.role = role;
  t.dtype = dtype;
  return t;
}

OpSpec MakeOp(std::string kind, std::vector<std::string> inputs, std::vector<std::string> outputs,
              Attrs attrs = {}) {
  return OpSpec{std::move(kind), std::move(inputs), std::move(outputs), std::move(attrs), ""};
}

// ViT's class token and an attention bias made in forward, both at the traced batch 2:
// x [2, 5, 16]; cls [1, 1, 16] expanded to [2, 1, 16] and put before x; a full [2, 6, 16]
// added; sum.
OpGraphSpec ClassToken() {
  OpGraphSpec g;
  g.tensors = {Leaf("x", {2, 5, 16}, TensorRole::kInput), Leaf("cls", {1, 1, 16}, TensorRole::kParameter)};
  g.ops = {MakeOp("expand", {"cls"}, {"c"}, {{"shape", AttrInts({2, 1, 16})}, {"batch_dim", AttrInt(0)}}),
           MakeOp("cat", {"c", "x"}, {"h"}, {{"dim", AttrInt(1)}}),
           MakeOp("full", {}, {"bias"},
                  {{"shape", AttrInts({2, 6, 16})}, {"dtype", AttrValue(std::string("float32"))},
                   {"batch_dim", AttrInt(0)}}),
           MakeOp("add", {"h", "bias"}, {"y"}), MakeOp("sum", {"y"}, {"loss"})};
  g.loss = "loss";
  g.traced_batch = 2;
  return g;
}

TEST(OpGraphBatchTest, ExpandAndFullFollowTheBatchTheyName) {
  for (int64_t batch : {2, 3, 16}) {
    StatusOr<Graph> g = BuildOpGraph(ClassToken(), enginetest::MakeContext(batch));
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    EXPECT_EQ(g->tensors[g->ops[0].outputs[0]].shape, (Shape{batch, 1, 16}));
    EXPECT_EQ(g->tensors[g->ops[2].outputs[0]].shape, (Shape{batch, 6, 16}));
    EXPECT_FALSE(g->tensors[g->ops[2].outputs[0]].requires_grad);  // full makes no gradient
    EXPECT_EQ(g->tensors[g->ops[2].outputs[0]].alias_of, -1);       // a storage of its own
  }
}

TEST(OpGraphBatchTest, FullTakesItsShapeAndDtype) {
  OpGraphSpec g = ClassToken();
  g.ops[2].attrs["dtype"] = AttrValue(std::string("bool"));
  g.ops[3] = MakeOp("masked_fill", {"h", "bias"}, {"y"}, {{"value", AttrValue(0.0)}});
  StatusOr<Graph> built = BuildOpGraph(g, enginetest::MakeContext(2));
  ASSERT_TRUE(built.ok()) << built.status().ToString();
  EXPECT_EQ(built->tensors[built->ops[2].outputs[0]].dtype, DType::kBool);
}

struct Refusal {
  std::string what;
  OpGraphSpec spec;
  int64_t micro_batch;
  std::string message;  // the message starts with this
};

TEST(OpGraphBatchTest, RefusesWhatDoesNotName) {
  std::vector<Refusal> cases;
  OpGraphSpec s = ClassToken();
  s.ops[1].attrs["batch_dim"] = AttrInt(0);
  cases.push_back({"batch_dim on cat", s, 4, "model.ops[1].attrs.batch_dim: names the batch dim of expand's or full's shape; cat takes none"});
  s = ClassToken();
  s.ops[0].attrs["batch_dim"] = AttrInt(3);
  cases.push_back({"batch_dim outside shape", s, 4, "model.ops[0].attrs.batch_dim: 3 is not a dim of shape [2, 1, 16]"});
  s = ClassToken();
  s.ops[2].attrs["batch_dim"] = AttrInt(1);
  cases.push_back({"batch_dim not the batch", s, 4, "model.ops[2].attrs.shape[1]: the batch dim is 6, but traced_batch is 2"});
  s = ClassToken();
  s.ops[2].attrs.erase("shape");
  s.ops[2].attrs.erase("batch_dim");
  cases.push_back({"full without shape", s, 2, "model.ops[2].attrs.shape: required"});
  s = ClassToken();
  s.ops[2].attrs = {{"shape", AttrInts({2, -6, 16})}};
  cases.push_back({"full with a negative size", s, 2, "model.ops[2].attrs.shape: [2, -6, 16] has a negative size"});
  s = ClassToken();
  s.ops[2].attrs["dtype"] = AttrValue(std::string("complex"));
  cases.push_back({"full of an unknown dtype", s, 2, "model.ops[2].attrs.dtype: "});
  s = ClassToken();
  s.traced_batch = 0;
  cases.push_back({"another batch, no traced_batch", s, 8,
                   "config.batch_size: the micro-batch is 8, but the model is an op graph written at "
                   "batch 2 (model.tensors[0] 'x', shape [2, 5, 16] along batch_dim 0) and has no "
                   "traced_batch"});
  for (const Refusal& c : cases) {
    StatusOr<Graph> g = BuildOpGraph(c.spec, enginetest::MakeContext(c.micro_batch));
    ASSERT_FALSE(g.ok()) << c.what;
    EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument) << c.what;
    EXPECT_EQ(g.status().message().rfind(c.message, 0), 0u) << c.what << ": " << g.status().message();
  }
}

TEST(OpGraphBatchTest, WithoutTracedBatchTheGraphsOwnBatchRuns) {
  OpGraphSpec s = ClassToken();
  s.traced_batch = 0;
  StatusOr<Graph> g = BuildOpGraph(s, enginetest::MakeContext(2));
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->tensors[g->ops[0].outputs[0]].shape, (Shape{2, 1, 16}));
  s.tensors[0].batch_dim = -1;  // nothing scales with the batch: any micro-batch
  EXPECT_TRUE(BuildOpGraph(s, enginetest::MakeContext(8)).ok());
}

}  // namespace
}  // namespace memest
