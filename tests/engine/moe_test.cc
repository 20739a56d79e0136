// Mixture-of-experts layers (engine/models/moe_layers.cc) from Mixtral, Qwen2-MoE and Qwen3-MoE
// configs: how the tokens are spread over the experts, what the routing load changes, the
// router's auxiliary loss, the layer layouts, and the configs and settings refused.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "engine/estimator.h"
#include "engine/models/hf_config.h"
#include "engine/models/layers.h"
#include "tests/engine/hf_json.h"
#include "tests/engine/test_graphs.h"

namespace memest {
namespace {

using enginetest::FromJson;
using enginetest::SmallMixtral;

nlohmann::json SmallQwenMoe() {
  return {{"model_type", "qwen2_moe"},
          {"hidden_size", 64},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2},
          {"intermediate_size", 128},
          {"vocab_size", 512},
          {"num_experts", 4},
          {"num_experts_per_tok", 2},
          {"moe_intermediate_size", 48},
          {"shared_expert_intermediate_size", 96},
          {"norm_topk_prob", true}};
}

ModelSpec Spec(const nlohmann::json& config, int64_t seq = 16) {
  return ModelSpec{HfConfigSpec{FromJson(config), seq}};
}

// The CPU runtime counts bytes unrounded: sums over the experts are exact.
RunConfig Cpu(Mode mode, ExpertLoad load) {
  RunConfig c = enginetest::PlainTraining();
  c.mode = mode;
  c.batch_size = 2;
  c.runtime = Runtime::kCpuTorch113;
  c.expert_load = load;
  return c;
}

Report EstimateOf(const nlohmann::json& config, const RunConfig& run) {
  EstimateOptions options;
  options.advice = false;
  StatusOr<Report> r = Estimate(Spec(config), run, options);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : Report{};
}

std::vector<int64_t> NonzeroCounts(const Graph& g) {
  std::vector<int64_t> counts;
  for (const Op& op : g.ops) {
    if (op.kind == "nonzero") counts.push_back(IntAttr(op.attrs, "count", -1, "").value());
  }
  return counts;
}

TEST(ExpertTokens, SpreadTheChoicesAsTheLoadSays) {
  EXPECT_EQ(ExpertTokens(32, 4, 2, ExpertLoad::kBalanced), (std::vector<int64_t>{16, 16, 16, 16}));
  // 10 tokens x 3 choices = 30 over 4 experts: 8, 8, 7, 7.
  EXPECT_EQ(ExpertTokens(10, 4, 3, ExpertLoad::kBalanced), (std::vector<int64_t>{8, 8, 7, 7}));
  EXPECT_EQ(ExpertTokens(10, 4, 3, ExpertLoad::kWorst), (std::vector<int64_t>{0, 10, 10, 10}));
  EXPECT_EQ(ExpertTokens(10, 4, 3, ExpertLoad::kDefault), ExpertTokens(10, 4, 3, ExpertLoad::kWorst));
  // tokens * top_k past 2^63: no count rather than a wrapped one.
  EXPECT_EQ(ExpertTokens(int64_t{1} << 62, 4, 3, ExpertLoad::kBalanced),
            std::vector<int64_t>(4, 0));
}

TEST(Moe, EveryExpertRunsOnTheTokensTheLoadGivesIt) {
  BuildContext ctx = enginetest::MakeContext(2);
  StatusOr<Graph> worst = BuildHfConfig(HfConfigSpec{FromJson(SmallMixtral()), 16}, ctx);
  ASSERT_TRUE(worst.ok()) << worst.status().ToString();
  // 2 x 16 tokens; by default experts 2 and 3 take all of them, in each of the 2 layers, and
  // experts 0 and 1 still run (on nothing).
  EXPECT_EQ(NonzeroCounts(*worst), (std::vector<int64_t>{0, 0, 32, 32, 0, 0, 32, 32}));
  ctx.expert_load = ExpertLoad::kBalanced;
  StatusOr<Graph> balanced = BuildHfConfig(HfConfigSpec{FromJson(SmallMixtral()), 16}, ctx);
  ASSERT_TRUE(balanced.ok());
  EXPECT_EQ(NonzeroCounts(*balanced), std::vector<int64_t>(8, 16));
  // Mixtral's names: block_sparse_moe, experts.<e>.w1 / w3 / w2, the router `gate`.
  std::set<std::string> names;
  for (const Tensor& t : worst->tensors) names.insert(t.name);
  for (const char* name : {"model.layers.0.block_sparse_moe.gate.weight",
                           "model.layers.1.block_sparse_moe.experts.3.w1.weight",
                           "model.layers.1.block_sparse_moe.experts.3.w3.weight",
                           "model.layers.1.block_sparse_moe.experts.3.w2.weight"}) {
    EXPECT_TRUE(names.count(name)) << name;
  }
}

TEST(Moe, TheLoadMovesThePeakNotWhatAutogradSaves) {
  // What each expert saves is linear in its tokens, so the sum over the experts is the same for
  // any spread; the worst spread's working set is the larger.
  const Report worst = EstimateOf(SmallQwenMoe(), Cpu(Mode::kTraining, ExpertLoad::kWorst));
  const Report balanced = EstimateOf(SmallQwenMoe(), Cpu(Mode::kTraining, ExpertLoad::kBalanced));
  EXPECT_EQ(worst.saved_for_backward_bytes, balanced.saved_for_backward_bytes);
  const Report worst_inference = EstimateOf(SmallQwenMoe(), Cpu(Mode::kInference, ExpertLoad::kWorst));
  const Report balanced_inference =
      EstimateOf(SmallQwenMoe(), Cpu(Mode::kInference, ExpertLoad::kBalanced));
  EXPECT_GT(worst_inference.peak.allocated_bytes, balanced_inference.peak.allocated_bytes);
}

TEST(Moe, TheRouterAuxiliaryLossKeepsItsSoftmaxChoicesAndCounts) {
  nlohmann::json config = SmallQwenMoe();
  const Report plain = EstimateOf(config, Cpu(Mode::kTraining, ExpertLoad::kBalanced));
  config["output_router_logits"] = true;
  const Report aux = EstimateOf(config, Cpu(Mode::kTraining, ExpertLoad::kBalanced));
  // load_balancing_loss_func over 2 layers x 32 tokens and 4 experts, 2 per token: softmax keeps
  // its float32 [64, 4] output, topk its int64 [64, 2] indices, and the product with the router
  // probabilities keeps the float32 [2, 4] token shares: 1024 + 1024 + 32 bytes (the tracer's
  // graph of transformers 4.47's function keeps the same). PyTorch drops topk's indices sooner,
  // with its node, once the unread values `_` go when the function returns: docs/moe.md.
  EXPECT_EQ(aux.saved_for_backward_bytes - plain.saved_for_backward_bytes, 2080);
  StatusOr<Graph> g = BuildHfConfig(HfConfigSpec{FromJson(config), 16}, enginetest::MakeContext(2));
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->ops[g->tensors[g->loss].producer].kind, "add_");  // loss += coef * aux_loss
}

TEST(Moe, QwenLayersFollowSparseStepDenseLayersAndTheSharedExpert) {
  nlohmann::json config = SmallQwenMoe();
  config["num_hidden_layers"] = 4;
  config["decoder_sparse_step"] = 2;  // layers 1 and 3
  config["mlp_only_layers"] = {3};    // layer 3 dense after all
  StatusOr<Graph> g = BuildHfConfig(HfConfigSpec{FromJson(config), 16}, enginetest::MakeContext(1));
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  std::set<std::string> names;
  for (const Tensor& t : g->tensors) names.insert(t.name);
  EXPECT_TRUE(names.count("model.layers.0.mlp.gate_proj.weight"));
  EXPECT_TRUE(names.count("model.layers.1.mlp.experts.0.gate_proj.weight"));
  EXPECT_TRUE(names.count("model.layers.1.mlp.shared_expert.down_proj.weight"));
  EXPECT_TRUE(names.count("model.layers.1.mlp.shared_expert_gate.weight"));
  EXPECT_FALSE(names.count("model.layers.2.mlp.experts.0.gate_proj.weight"));
  EXPECT_TRUE(names.count("model.layers.3.mlp.up_proj.weight"));
  EXPECT_FALSE(names.count("model.layers.3.mlp.gate.weight"));
}

struct BadConfig {
  std::string key;
  nlohmann::json value;
  std::string field;
};

class MoeBadConfigTest : public testing::TestWithParam<BadConfig> {};

TEST_P(MoeBadConfigTest, IsRefusedNamingTheField) {
  nlohmann::json config = SmallQwenMoe();
  config[GetParam().key] = GetParam().value;
  StatusOr<Graph> g = BuildHfConfig(HfConfigSpec{FromJson(config), 16}, enginetest::MakeContext(1));
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(g.status().message().find("model.hf_config.config." + GetParam().field),
            std::string::npos)
      << g.status().message();
}

INSTANTIATE_TEST_SUITE_P(
    Configs, MoeBadConfigTest,
    testing::Values(BadConfig{"num_experts_per_tok", 5, "num_experts_per_tok"},
                    BadConfig{"num_experts", 0, "num_experts"},
                    BadConfig{"mlp_only_layers", {0, 2}, "mlp_only_layers[1]"},
                    BadConfig{"mlp_only_layers", "1", "mlp_only_layers"},
                    BadConfig{"router_aux_loss_coef", -1, "router_aux_loss_coef"},
                    BadConfig{"decoder_sparse_step", 0, "decoder_sparse_step"},
                    BadConfig{"moe_intermediate_size", -48, "moe_intermediate_size"}));

TEST(Moe, RouterNoiseIsRefusedNamingIt) {
  nlohmann::json config = SmallMixtral();
  config["router_jitter_noise"] = 0.1;
  StatusOr<Graph> g = BuildHfConfig(HfConfigSpec{FromJson(config), 16}, enginetest::MakeContext(1));
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("model.hf_config.config.router_jitter_noise"),
            std::string::npos);
}

TEST(Moe, AnExpertLoadNeedsExperts) {
  RunConfig run = Cpu(Mode::kTraining, ExpertLoad::kBalanced);
  nlohmann::json dense = SmallQwenMoe();
  dense["model_type"] = "qwen2";
  EstimateOptions options;
  options.advice = false;
  StatusOr<Report> r = Estimate(Spec(dense), run, options);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message().rfind("config.expert_load: ", 0), 0u) << r.status().message();
  run.expert_load = ExpertLoad::kWorst;
  EXPECT_FALSE(Estimate(ModelSpec{PresetSpec{"gpt2-small", {}}}, run, options).ok());
}

}  // namespace
}  // namespace memest
