// Expert parallelism (engine/passes/expert_parallel.h) over Megatron-LM's MoELayer
// (engine/models/megatron_moe.cc): the layer Megatron trains, each rank's experts and the rows
// it receives under each expert load, the experts' own buffers in Megatron's DDP, NCCL's expert
// groups, and the configurations refused.
#include "engine/passes/expert_parallel.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "engine/estimator.h"
#include "engine/ir/nccl.h"
#include "engine/models/hf_config.h"
#include "engine/passes/megatron_ddp.h"
#include "tests/engine/hf_json.h"
#include "tests/engine/test_graphs.h"

namespace memest {
namespace {

using enginetest::FromJson;
using enginetest::SmallMixtral;

// Each expert: linear_fc1 [2 x 96, 64] and linear_fc2 [64, 96].
constexpr int64_t kExpertParams = 2 * 96 * 64 + 64 * 96;  // 18,432

Graph Megatron(const nlohmann::json& config, ExpertLoad load = ExpertLoad::kDefault,
               DType dtype = DType::kFloat32) {
  BuildContext ctx = enginetest::MakeContext(2, Mode::kTraining, dtype);
  ctx.megatron = true;
  ctx.expert_load = load;
  StatusOr<Graph> g = BuildHfConfig(HfConfigSpec{FromJson(config), 16}, ctx);
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return g.ok() ? *std::move(g) : Graph{};
}

std::map<std::string, int> OpCounts(const Graph& g) {
  std::map<std::string, int> n;
  for (const Op& op : g.ops) ++n[op.kind];
  return n;
}

const Tensor* Named(const Graph& g, const std::string& name) {
  for (const Tensor& t : g.tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

ParallelismConfig Experts(int64_t expert, int64_t data) {
  ParallelismConfig p;
  p.data = data;
  p.sharding = DataSharding::kMegatronDistOpt;
  p.expert = expert;
  return p;
}

TEST(MegatronMoeTest, IsMegatronsLayerWithTheModelsParameters) {
  const Graph megatron = Megatron(SmallMixtral());
  StatusOr<Graph> hf = BuildHfConfig(HfConfigSpec{FromJson(SmallMixtral()), 16},
                                     enginetest::MakeContext(2));
  ASSERT_TRUE(hf.ok());
  // linear_fc1 holds w1 and w3 stacked: the same parameters, named as Megatron names them.
  EXPECT_EQ(megatron.ParameterCount(), hf->ParameterCount());
  const Tensor* fc1 = Named(megatron, "model.layers.1.block_sparse_moe.experts.local_experts.3.linear_fc1.weight");
  ASSERT_NE(fc1, nullptr);
  EXPECT_EQ(fc1->shape, (Shape{192, 64}));
  EXPECT_TRUE(IsExpertParameter(*fc1));
  const Tensor* router = Named(megatron, "model.layers.0.block_sparse_moe.router.weight");
  ASSERT_NE(router, nullptr);
  EXPECT_FALSE(IsExpertParameter(*router));
  const std::map<std::string, int> ops = OpCounts(megatron);
  EXPECT_EQ(ops.at("ep_all_to_all"), 6);     // per layer: tokens and weights out, tokens back
  EXPECT_EQ(ops.at("megatron_swiglu"), 8);   // one per expert
  EXPECT_EQ(ops.at("index_select"), 2);      // the permutation
  EXPECT_EQ(ops.at("scatter_add_"), 2);      // the unpermutation
  EXPECT_EQ(ops.count("index_add_"), 0u);    // Hugging Face's loop is gone
  EXPECT_EQ(ops.count("nonzero"), 0u);
}

TEST(MegatronMoeTest, TheSharedExpertRunsOnTheLayersInput) {
  nlohmann::json qwen = {{"model_type", "qwen2_moe"}, {"hidden_size", 64},
                         {"num_hidden_layers", 1},    {"num_attention_heads", 4},
                         {"num_key_value_heads", 2},  {"intermediate_size", 128},
                         {"vocab_size", 512},         {"num_experts", 4},
                         {"num_experts_per_tok", 2},  {"moe_intermediate_size", 48},
                         {"shared_expert_intermediate_size", 96}};
  const Graph g = Megatron(qwen);
  const Tensor* shared = Named(g, "model.layers.0.mlp.shared_experts.linear_fc1.weight");
  ASSERT_NE(shared, nullptr);
  EXPECT_EQ(shared->shape, (Shape{192, 64}));
  EXPECT_FALSE(IsExpertParameter(*shared));  // replicated, reduced with the dense parameters
  EXPECT_NE(Named(g, "model.layers.0.mlp.shared_experts.gate.weight"), nullptr);
}

TEST(ExpertParallelTest, BalancedEveryRankReceivesItsShare) {
  const Graph whole = Megatron(SmallMixtral(), ExpertLoad::kBalanced);
  StatusOr<ExpertParallelView> v =
      ShardExpertParallel(whole, Experts(2, 2), ExpertLoad::kBalanced);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  // 2 x 16 tokens x 2 choices over 4 experts: 16 per expert from each rank; a rank's two
  // experts receive 2 x 16 each from the two ranks: 64 rows, every rank the same.
  EXPECT_EQ(v->local_experts, 2);
  EXPECT_EQ(v->layers, 2);
  EXPECT_EQ(v->rank, 0);
  EXPECT_EQ(v->received_rows, 64);
  EXPECT_EQ(v->least_received_rows, 64);
  // Half of each layer's experts leave, with their parameters.
  EXPECT_EQ(v->graph.ParameterCount(), whole.ParameterCount() - 2 * 2 * kExpertParams);
  EXPECT_EQ(Named(v->graph, "model.layers.0.block_sparse_moe.experts.local_experts.2.linear_fc1.weight"),
            nullptr);
  EXPECT_NE(Named(v->graph, "model.layers.0.block_sparse_moe.experts.local_experts.1.linear_fc1.weight"),
            nullptr);
  int dispatched = 0;
  for (const Op& op : v->graph.ops) {
    if (op.kind != "ep_all_to_all") continue;
    EXPECT_EQ(IntAttr(op.attrs, "ep", 0, "").value(), 2);
    EXPECT_FALSE(v->graph.tensors[op.outputs[0]].alias_of >= 0);  // a buffer of its own now
    dispatched += StringAttr(op.attrs, "role", "", "").value() == "dispatch";
  }
  EXPECT_EQ(dispatched, 4);
  // Per layer the tokens [64, 64], their weights [64] and the tokens back, float32, half of
  // each leaving the rank, forward and backward: 2 x (16384 + 256 + 16384) / 2 per layer.
  EXPECT_EQ(v->communicated_bytes, 2 * (16384 + 256 + 16384));
}

TEST(ExpertParallelTest, WorstLoadTheLastRankReceivesEveryChoice) {
  const Graph whole = Megatron(SmallMixtral(), ExpertLoad::kWorst);
  StatusOr<ExpertParallelView> v = ShardExpertParallel(whole, Experts(2, 2), ExpertLoad::kWorst);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  // Every token's two choices are experts 2 and 3, both on rank 1: 2 ranks x 32 tokens each.
  EXPECT_EQ(v->rank, 1);
  EXPECT_EQ(v->received_rows, 128);
  EXPECT_EQ(v->least_rank, 0);
  EXPECT_EQ(v->least_received_rows, 0);
  for (const Op& op : v->graph.ops) {
    if (op.kind == "split" && StringAttr(op.attrs, "moe", "", "").value() == "experts") {
      EXPECT_EQ(IntsAttr(op.attrs, "sizes", {}, "").value(), (std::vector<int64_t>{64, 64}));
    }
  }
  // More rows, more activations: the busiest rank's step needs more than a balanced one's.
  RunConfig c;
  c.precision = Precision::kBf16Pure;
  c.optimizer.kind = OptimizerKind::kAdam;
  c.parallelism = Experts(2, 2);
  EstimateOptions options;
  options.advice = false;
  c.expert_load = ExpertLoad::kWorst;
  StatusOr<Report> worst = Estimate(ModelSpec{HfConfigSpec{FromJson(SmallMixtral()), 16}}, c, options);
  c.expert_load = ExpertLoad::kBalanced;
  StatusOr<Report> balanced = Estimate(ModelSpec{HfConfigSpec{FromJson(SmallMixtral()), 16}}, c, options);
  ASSERT_TRUE(worst.ok() && balanced.ok()) << worst.status().ToString();
  EXPECT_GT(worst->saved_for_backward_bytes, balanced->saved_for_backward_bytes);
  bool noted = false;
  for (const std::string& n : worst->notes) noted |= n.find("this is rank 1 of the group") != std::string::npos;
  EXPECT_TRUE(noted);
}

TEST(ExpertParallelTest, OneLocalExpertRunsOnWhatArrivedWithoutCopies) {
  const Graph whole = Megatron(SmallMixtral(), ExpertLoad::kBalanced);
  StatusOr<ExpertParallelView> v = ShardExpertParallel(whole, Experts(4, 4), ExpertLoad::kBalanced);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(v->local_experts, 1);
  // Megatron's `if self.num_local_experts > 1` sorts and SequentialMLP's split and cat are gone:
  // the one expert's linear_fc1 reads the all-to-all's output itself.
  for (const Op& op : v->graph.ops) {  // sorts, splits, cats (the aux loss's add stays marked)
    EXPECT_TRUE(!HasAttr(op.attrs, "moe") || op.kind == "add") << op.kind << " at " << op.scope;
  }
  for (const Op& op : v->graph.ops) {
    if (op.kind != "linear" || op.scope.find("local_experts.0.linear_fc1") == std::string::npos) continue;
    EXPECT_EQ(v->graph.ops[v->graph.tensors[op.inputs[0]].producer].kind, "ep_all_to_all");
  }
}

TEST(ExpertParallelTest, RefusesExpertCountsPastTheLimit) {
  GraphBuilder b;
  const int x = b.Input("x", {4, 8}, DType::kFloat32);
  b.Add1("ep_all_to_all", {x}, {{"ep", AttrValue(int64_t{1})}, {"rows", AttrValue(int64_t{4})},
                                {"experts", AttrValue(int64_t{1} << 40)},
                                {"top_k", AttrValue(int64_t{1})},
                                {"role", AttrValue(std::string("dispatch"))}});
  StatusOr<Graph> g = b.Finish();
  if (!g.ok()) {  // the rule refuses it first
    EXPECT_NE(g.status().message().find("experts"), std::string::npos) << g.status().message();
    return;
  }
  const Status s = ShardExpertParallel(*g, Experts(2, 2), ExpertLoad::kWorst).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("config.parallelism.expert"), std::string::npos) << s.message();
}

TEST(ExpertParallelTest, MegatronsDdpShardsTheExpertsOverTheirOwnGroup) {
  const Graph whole = Megatron(SmallMixtral(), ExpertLoad::kBalanced, DType::kBFloat16);
  StatusOr<ExpertParallelView> v = ShardExpertParallel(whole, Experts(2, 4), ExpertLoad::kBalanced);
  ASSERT_TRUE(v.ok());
  RunConfig c;
  c.precision = Precision::kBf16Pure;
  c.optimizer.kind = OptimizerKind::kAdam;
  c.parallelism = Experts(2, 4);
  const MegatronDdp m = PlanMegatronDdp(v->graph, c).value();
  // The rank's 2 experts of 2 layers (each parameter a multiple of 64 elements), padded to
  // lcm(4 / 2, 128), sharded over the 2 ranks of the expert-data-parallel group.
  EXPECT_EQ(m.expert_data, 2);
  EXPECT_EQ(m.expert_buffer_elements, 2 * 2 * kExpertParams);
  EXPECT_EQ(m.expert_shard_elements, kExpertParams * 2);
  // The rest over the 4 data ranks.
  const int64_t dense = whole.ParameterCount() - 4 * 2 * kExpertParams;
  EXPECT_EQ(m.buffer_elements % 128, 0);
  EXPECT_GE(m.buffer_elements, dense);
  EXPECT_EQ(m.shard_elements, m.buffer_elements / 4);
  EXPECT_EQ(m.master_bytes, 4 * (m.shard_elements + m.expert_shard_elements));
  EXPECT_EQ(m.grad_buffer_bytes, 4 * (m.buffer_elements + m.expert_buffer_elements));
  // With one expert-parallel rank Megatron keeps the experts with the dense parameters
  // (transformer_engine.py: use_expert_pgs needs expert_model_parallel_size > 1).
  c.parallelism = Experts(1, 4);
  const MegatronDdp one = PlanMegatronDdp(whole, c).value();
  EXPECT_EQ(one.expert_buffer_elements, 0);
  EXPECT_EQ(one.buffer_elements, (whole.ParameterCount() + 127) / 128 * 128);  // lcm(4, 128)
}

TEST(ExpertParallelTest, NcclConnectsTheExpertGroups) {
  DeviceInfo h100 = FindDevice("h100-80gb").value();
  ParallelismConfig p = Experts(8, 16);
  const NcclMemory m = NcclMemoryOf(p, h100).value();
  std::map<std::string, NcclCommunicator> by_group;
  for (const NcclCommunicator& c : m.communicators) by_group[c.group] = c;
  ASSERT_TRUE(by_group.count("expert"));
  EXPECT_EQ(by_group["expert"].ranks, 8);
  EXPECT_EQ(by_group["expert"].local_ranks, 8);  // one node
  EXPECT_EQ(by_group["expert"].p2p_peers, 7);    // the all-to-all reaches every peer
  ASSERT_TRUE(by_group.count("expert tensor x expert"));
  EXPECT_EQ(by_group["expert tensor x expert"].ranks, 8);
  EXPECT_EQ(by_group["expert tensor x expert"].p2p_peers, 0);
  ASSERT_TRUE(by_group.count("expert data"));
  EXPECT_EQ(by_group["expert data"].ranks, 2);
  EXPECT_EQ(by_group["expert data"].local_ranks, 1);  // across the two nodes
  p.expert = 1;
  EXPECT_LT(NcclMemoryOf(p, h100).value().bytes, m.bytes);
}

TEST(ExpertParallelTest, APipelineStageWithoutExpertsIsLeftAsItIs) {
  // Qwen's mlp_only_layers: layer 0 dense, layer 1 with experts; two stages of one layer each.
  nlohmann::json qwen = {{"model_type", "qwen2_moe"}, {"hidden_size", 64},
                         {"num_hidden_layers", 2},    {"num_attention_heads", 4},
                         {"num_key_value_heads", 2},  {"intermediate_size", 128},
                         {"vocab_size", 512},         {"num_experts", 4},
                         {"num_experts_per_tok", 2},  {"moe_intermediate_size", 48},
                         {"shared_expert_intermediate_size", 96}, {"mlp_only_layers", {0}}};
  RunConfig c;
  c.precision = Precision::kBf16Pure;
  c.optimizer.kind = OptimizerKind::kAdam;
  c.parallelism = Experts(2, 2);
  c.parallelism.pipeline = 2;
  c.grad_accum_steps = 2;
  c.batch_size = 2;
  EstimateOptions options;
  options.advice = false;
  StatusOr<Report> r = Estimate(ModelSpec{HfConfigSpec{FromJson(qwen), 16}}, c, options);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_TRUE(r->pipeline.has_value());
  EXPECT_EQ(r->pipeline->per_stage.size(), 2u);
}

Status EstimateStatus(const nlohmann::json& config, const RunConfig& c) {
  EstimateOptions options;
  options.advice = false;
  return Estimate(ModelSpec{HfConfigSpec{FromJson(config), 16}}, c, options).status();
}

TEST(ExpertParallelTest, RefusesWhatItCannotSplitNamingTheField) {
  RunConfig c;
  c.precision = Precision::kBf16Pure;
  c.optimizer.kind = OptimizerKind::kAdam;
  struct Case {
    ParallelismConfig p;
    nlohmann::json model;
    std::string field;
  };
  nlohmann::json dense = SmallMixtral();
  dense["model_type"] = "mistral";
  ParallelismConfig ddp = Experts(2, 2);
  ddp.sharding = DataSharding::kDdp;
  ParallelismConfig tensor = Experts(1, 2);
  tensor.tensor = 2;
  ParallelismConfig context = Experts(2, 2);
  context.context = 2;
  const Case cases[] = {
      {Experts(8, 8), SmallMixtral(), "config.parallelism.expert: 4 experts"},  // 4 % 8
      {Experts(4, 6), SmallMixtral(), "config.parallelism.expert: 4 expert-parallel ranks"},
      {Experts(2, 2), dense, "config.parallelism.expert: the model has no mixture-of-experts"},
      {ddp, SmallMixtral(), "config.parallelism.expert: expert parallelism is modelled as "},
      {Experts(0, 2), SmallMixtral(), "config.parallelism.expert: must be in [1, 1024]"},
      {tensor, SmallMixtral(), "config.parallelism.sequence_parallel: Megatron-LM's MoELayer"},
      {context, SmallMixtral(), "config.parallelism.expert: with context parallelism"},
  };
  for (const Case& k : cases) {
    c.parallelism = k.p;
    const Status s = EstimateStatus(k.model, c);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << k.field;
    EXPECT_NE(s.message().find(k.field), std::string::npos) << s.message();
  }
  // PEFT's adapters on a model Megatron trains (they landed on its linear_fc1/fc2 silently).
  c.parallelism = Experts(2, 2);
  c.lora.rank = 8;
  c.lora.target_modules = {"all-linear"};
  const Status lora = EstimateStatus(SmallMixtral(), c);
  EXPECT_NE(lora.message().find("config.lora: PEFT's adapters"), std::string::npos)
      << lora.message();
}

}  // namespace
}  // namespace memest
