// Megatron-LM's MoELayer under tensor parallelism (engine/passes/tensor_parallel_moe.cc): each
// rank routes its share of the sequence, the tensor group gathers what it received, the experts
// hold 1/t of their linears, the partial sums are reduce-scattered back; with expert
// parallelism after it, the gathered rows of the rank's experts; NCCL's expert groups.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "engine/estimator.h"
#include "engine/ir/nccl.h"
#include "engine/models/hf_config.h"
#include "engine/passes/expert_parallel.h"
#include "engine/passes/tensor_parallel.h"
#include "tests/engine/hf_json.h"
#include "tests/engine/test_graphs.h"

namespace memest {
namespace {

using enginetest::FromJson;
using enginetest::SmallMixtral;

// SmallMixtral at batch 2 and 16 positions: 32 tokens, 4 experts, top 2, experts [2 x 96, 64].
Graph Megatron(ExpertLoad load) {
  BuildContext ctx = enginetest::MakeContext(2);
  ctx.megatron = true;
  ctx.expert_load = load;
  StatusOr<Graph> g = BuildHfConfig(HfConfigSpec{FromJson(SmallMixtral()), 16}, ctx);
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return g.ok() ? *std::move(g) : Graph{};
}

ParallelismConfig Parallel(int64_t tensor, int64_t expert, bool sp = true) {
  ParallelismConfig p;
  p.tensor = tensor;
  p.sequence_parallel = sp;
  p.expert = expert;
  p.data = expert;
  p.sharding = DataSharding::kMegatronDdp;
  return p;
}

const Tensor& Named(const Graph& g, const std::string& name) {
  for (const Tensor& t : g.tensors) {
    if (t.name == name) return t;
  }
  ADD_FAILURE() << "no tensor " << name;
  static const Tensor none;
  return none;
}

std::vector<const Op*> InLayer(const Graph& g, const std::string& kind, int layer = 0) {
  const std::string scope = "model.layers." + std::to_string(layer) + ".block_sparse_moe";
  std::vector<const Op*> ops;
  for (const Op& op : g.ops) {
    if (op.kind == kind && op.scope.compare(0, scope.size(), scope) == 0) ops.push_back(&op);
  }
  return ops;
}

std::vector<int64_t> ExpertSplit(const Graph& g) {
  for (const Op* op : InLayer(g, "split")) {
    if (StringAttr(op->attrs, "moe", "", "").value() == "experts") {
      return IntsAttr(op->attrs, "sizes", {}, "").value();
    }
  }
  return {};
}

TEST(TensorParallelMoeTest, EachRankRoutesItsShareAndTheGroupGathersIt) {
  const Graph whole = Megatron(ExpertLoad::kBalanced);
  StatusOr<TensorParallelView> v =
      ShardTensorParallel(whole, Parallel(2, 1), ExpertLoad::kBalanced);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  const Graph& g = v->graph;
  const std::string expert = "model.layers.0.block_sparse_moe.experts.local_experts.1.";
  EXPECT_EQ(Named(g, expert + "linear_fc1.weight").shape, (Shape{96, 64}));  // rows split
  EXPECT_EQ(Named(g, expert + "linear_fc2.weight").shape, (Shape{64, 48}));  // columns split
  const Tensor& router = Named(g, "model.layers.0.block_sparse_moe.router.weight");
  EXPECT_EQ(router.shape, (Shape{4, 64}));  // replicated, its gradient all-reduced
  bool router_reduced = false;
  for (int p : v->sequence_parallel_params) router_reduced |= g.tensors[p].name == router.name;
  EXPECT_TRUE(router_reduced);
  // The rank's 16 tokens route to 32 rows; the group's 64 are gathered (the tokens [64, 64]
  // and their weights [64]) and, after the experts, reduce-scattered back to 32.
  std::vector<const Op*> a2a = InLayer(g, "ep_all_to_all");
  ASSERT_EQ(a2a.size(), 3u);
  for (const Op* op : a2a) EXPECT_EQ(IntAttr(op->attrs, "rows", 0, "").value(), 32);
  std::vector<const Op*> gathers = InLayer(g, "tp_all_gather");
  ASSERT_EQ(gathers.size(), 2u);
  EXPECT_EQ(g.tensors[gathers[0]->outputs[0]].shape, (Shape{64, 64}));
  EXPECT_EQ(g.tensors[gathers[1]->outputs[0]].shape, (Shape{64}));
  std::vector<const Op*> scatters = InLayer(g, "tp_reduce_scatter");
  ASSERT_EQ(scatters.size(), 1u);
  EXPECT_EQ(g.tensors[scatters[0]->outputs[0]].shape, (Shape{32, 64}));
  // Each rank's 16 tokens give each expert 8 rows; the group's two ranks 16.
  EXPECT_EQ(ExpertSplit(g), (std::vector<int64_t>{16, 16, 16, 16}));
  // The routing's tensors hold the rank's tokens.
  for (const Op* op : InLayer(g, "full")) EXPECT_EQ(g.tensors[op->outputs[0]].shape[0], 16);
}

TEST(TensorParallelMoeTest, ExpertRanksComputeOnTheirTensorGroupsRows) {
  const Graph whole = Megatron(ExpertLoad::kWorst);
  const ParallelismConfig p = Parallel(2, 2);
  StatusOr<TensorParallelView> tp = ShardTensorParallel(whole, p, ExpertLoad::kWorst);
  ASSERT_TRUE(tp.ok()) << tp.status().ToString();
  StatusOr<ExpertParallelView> ep = ShardExpertParallel(tp->graph, p, ExpertLoad::kWorst);
  ASSERT_TRUE(ep.ok()) << ep.status().ToString();
  // Every choice goes to experts 2 and 3 (rank 1): 16 tokens from each of two expert ranks,
  // each expert 32 rows, gathered over the two tensor ranks: 64 per expert.
  EXPECT_EQ(ep->rank, 1);
  EXPECT_EQ(ep->received_rows, 64);
  EXPECT_EQ(ExpertSplit(ep->graph), (std::vector<int64_t>{64, 64}));
  std::vector<const Op*> gathers = InLayer(ep->graph, "tp_all_gather");
  ASSERT_EQ(gathers.size(), 2u);
  EXPECT_EQ(ep->graph.tensors[gathers[0]->outputs[0]].shape, (Shape{128, 64}));
  EXPECT_EQ(
      Named(ep->graph, "model.layers.1.block_sparse_moe.experts.local_experts.1.linear_fc1.weight")
          .shape,
      (Shape{96, 64}));
}

TEST(TensorParallelMoeTest, EstimatesAndConnectsTheExpertTensorGroup) {
  RunConfig c;
  c.precision = Precision::kBf16Pure;
  c.optimizer.kind = OptimizerKind::kAdam;
  c.parallelism = Parallel(2, 2);
  c.expert_load = ExpertLoad::kWorst;
  EstimateOptions options;
  options.advice = false;
  const ModelSpec model{HfConfigSpec{FromJson(SmallMixtral()), 16}};
  StatusOr<Report> split = Estimate(model, c, options);
  ASSERT_TRUE(split.ok()) << split.status().ToString();
  c.parallelism = Parallel(1, 2, /*sp=*/false);
  StatusOr<Report> whole = Estimate(model, c, options);
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  EXPECT_LT(split->saved_for_backward_bytes, whole->saved_for_backward_bytes);

  DeviceInfo h100 = FindDevice("h100-80gb").value();
  std::map<std::string, int64_t> ranks;
  for (const NcclCommunicator& n :
       NcclMemoryOf(Parallel(2, 1), h100, false, true).value().communicators) {
    ranks[n.group] = n.ranks;
  }
  EXPECT_EQ(ranks["expert tensor"], 2);            // the dispatcher's gather and scatter
  EXPECT_EQ(ranks["expert tensor x expert"], 2);   // its token counts
  EXPECT_EQ(ranks.count("expert data"), 0u);       // one expert rank: experts in the dense buffers
  EXPECT_EQ(ranks.count("tensor x context"), 0u);  // no load-balancing loss
  ranks.clear();
  ParallelismConfig both = Parallel(2, 2);  // megatron-ddp: the experts' optimizer clips alone
  for (const NcclCommunicator& n :
       NcclMemoryOf(both, h100, false, true, true).value().communicators) {
    ranks[n.group] = n.ranks;
  }
  EXPECT_EQ(ranks["tensor x context"], 2);  // the router's token counts, every forward
  EXPECT_EQ(ranks["expert tensor x expert x pipeline"], 4);
  for (const NcclCommunicator& n : NcclMemoryOf(Parallel(2, 1), h100).value().communicators) {
    EXPECT_EQ(n.group.find("expert"), std::string::npos) << n.group;  // a dense model: none
  }
}

TEST(TensorParallelMoeTest, RefusesTensorRanksWithoutSequenceParallelismOrMegatron) {
  StatusOr<TensorParallelView> v =
      ShardTensorParallel(Megatron(ExpertLoad::kWorst), Parallel(2, 1, /*sp=*/false));
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(
      v.status().message().find("config.parallelism.sequence_parallel: Megatron-LM's MoELayer"),
      std::string::npos)
      << v.status().message();
  ParallelismConfig ddp = Parallel(2, 1);
  ddp.sharding = DataSharding::kDdp;
  v = ShardTensorParallel(Megatron(ExpertLoad::kWorst), ddp);
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("config.parallelism.data_parallel: Megatron-LM's MoELayer"),
            std::string::npos)
      << v.status().message();
}

// Megatron passes split sizes: torch.distributed's list collectives, which gather into (and
// scatter from) one flat tensor of the whole; and MoELayer's functions hold their locals.
TEST(TensorParallelMoeTest, ListCollectivesAndTheLayersLocals) {
  StatusOr<TensorParallelView> v =
      ShardTensorParallel(Megatron(ExpertLoad::kBalanced), Parallel(2, 1), ExpertLoad::kBalanced);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  const Graph& g = v->graph;
  for (const std::string kind : {"tp_all_gather", "tp_reduce_scatter"}) {
    for (const Op* op : InLayer(g, kind)) EXPECT_EQ(IntAttr(op->attrs, "flat", 0, "").value(), 1);
  }
  // The experts' output is held through the reduce-scatter that ends combine_preprocess; the
  // all-to-all's outputs (not the gathered rows) to the layer's end.
  const Op* scatter = InLayer(g, "tp_reduce_scatter")[0];
  const int scatter_op = static_cast<int>(scatter - g.ops.data());
  int through = 0;
  for (const HeldTensor& h : g.held)
    through += h.until_op >= scatter_op && h.until_op <= scatter_op + 1;
  EXPECT_GE(through, 3);  // the sorted tokens and weights, the experts' output
  for (const HeldTensor& h : g.held) {
    const int producer = g.tensors[h.tensor].producer;
    EXPECT_TRUE(producer < 0 || g.ops[producer].kind != "tp_all_gather")
        << "a gathered tensor held";
  }
}

}  // namespace
}  // namespace memest
