// DeepSeek-V3 from its config (engine/models/hf_deepseek.h): latent attention, the grouped
// sigmoid router, the shared experts and the dense first layers as transformers 4.57 builds
// them; what autograd keeps, against PyTorch 2.15 and transformers 4.57.1; bad configs refused
// naming the field.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/estimator.h"
#include "engine/models/hf_config.h"
#include "engine/passes/linear_modules.h"
#include "tests/engine/hf_json.h"
#include "tests/engine/test_graphs.h"

namespace memest {
namespace {

using enginetest::FromJson;
using enginetest::KindsIn;
using enginetest::Named;
using enginetest::ReadConfig;

StatusOr<Graph> Build(const nlohmann::json& config, int64_t seq = 16,
                      const BuildContext& context = enginetest::MakeContext(1)) {
  return BuildHfConfig(HfConfigSpec{FromJson(config), seq}, context);
}

// The conformance check's base config (tests/conformance/hf5_saved_check.py, DS): three layers,
// the first dense, then 8 experts in 2 groups, 2 chosen, one shared expert.
nlohmann::json Small() {
  return {{"model_type", "deepseek_v3"},
          {"vocab_size", 512},
          {"hidden_size", 64},
          {"intermediate_size", 128},
          {"moe_intermediate_size", 32},
          {"num_hidden_layers", 3},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 4},
          {"n_shared_experts", 1},
          {"n_routed_experts", 8},
          {"routed_scaling_factor", 2.5},
          {"kv_lora_rank", 32},
          {"q_lora_rank", 48},
          {"qk_rope_head_dim", 8},
          {"v_head_dim", 16},
          {"qk_nope_head_dim", 16},
          {"n_group", 2},
          {"topk_group", 1},
          {"num_experts_per_tok", 2},
          {"first_k_dense_replace", 1},
          {"norm_topk_prob", true},
          {"max_position_embeddings", 64}};
}

// The real checkpoints' configs, as transformers 4.57.1 counts them on the meta device
// (DeepseekV3ForCausalLM, sum(p.numel())): DeepSeek-V3's 671 B without its multi-token
// prediction layer (transformers ignores layer 61), Moonlight's 16 B.
TEST(HfDeepseekTest, ParameterCountsAreTransformers) {
  nlohmann::json v3 = ReadConfig("deepseek-v3");
  v3.erase("quantization_config");  // the bfloat16 model; the fp8 checkpoint is served
  StatusOr<Graph> g = Build(v3);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->ParameterCount(), 671'026'404'352);
  g = Build(ReadConfig("moonlight-16b-a3b"));
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->ParameterCount(), 15'960'108'544);
}

// DeepseekV3Attention: the query through its low-rank latent (or q_proj with q_lora_rank
// null), one latent for keys and values with the shared rotary key, each head's key and value
// from kv_b_proj.
TEST(HfDeepseekTest, LatentAttentionHasItsProjections) {
  StatusOr<Graph> g = Build(Small());
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const std::string a = "model.layers.0.self_attn.";
  EXPECT_EQ(Named(*g, a + "q_a_proj.weight")->shape, (Shape{48, 64}));
  EXPECT_EQ(Named(*g, a + "q_a_layernorm.weight")->shape, Shape{48});
  EXPECT_EQ(Named(*g, a + "q_b_proj.weight")->shape, (Shape{4 * 24, 48}));
  EXPECT_EQ(Named(*g, a + "kv_a_proj_with_mqa.weight")->shape, (Shape{32 + 8, 64}));
  EXPECT_EQ(Named(*g, a + "kv_a_layernorm.weight")->shape, Shape{32});
  EXPECT_EQ(Named(*g, a + "kv_b_proj.weight")->shape, (Shape{4 * (16 + 16), 32}));
  EXPECT_EQ(Named(*g, a + "o_proj.weight")->shape, (Shape{64, 4 * 16}));
  EXPECT_EQ(Named(*g, a + "q_proj.weight"), nullptr);
  // The rotary tables are qk_rope_head_dim wide.
  EXPECT_EQ(Named(*g, "model.rotary_emb.cos_cached")->shape, (Shape{1, 16, 8}));
  // rope_interleave (the default): the rotary part of q and of the shared key reordered by a
  // copying reshape before the rotation.
  const std::vector<std::string> kinds = KindsIn(*g, "model.layers.0.self_attn");
  int reshapes = 0;
  for (const std::string& k : kinds) reshapes += k == "reshape";
  EXPECT_EQ(reshapes, 2);

  nlohmann::json plain = Small();
  plain["q_lora_rank"] = nullptr;
  plain["rope_interleave"] = false;
  g = Build(plain);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(Named(*g, a + "q_proj.weight")->shape, (Shape{4 * 24, 64}));
  EXPECT_EQ(Named(*g, a + "q_a_proj.weight"), nullptr);
  for (const std::string& k : KindsIn(*g, "model.layers.0.self_attn")) EXPECT_NE(k, "reshape");
}

// DeepseekV3MoE from first_k_dense_replace on: the router's float32 weight copy and its
// correction bias, every routed expert, the ungated shared experts; the router is not an
// nn.Linear, so PEFT's all-linear and bitsandbytes leave it alone.
TEST(HfDeepseekTest, MoeLayersFollowTheDenseOnes) {
  StatusOr<Graph> g = Build(Small());
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_NE(Named(*g, "model.layers.0.mlp.gate_proj.weight"), nullptr);
  EXPECT_EQ(Named(*g, "model.layers.0.mlp.gate.weight"), nullptr);
  EXPECT_EQ(Named(*g, "model.layers.1.mlp.gate.weight")->shape, (Shape{8, 64}));
  EXPECT_EQ(Named(*g, "model.layers.1.mlp.gate.e_score_correction_bias")->shape, Shape{8});
  EXPECT_EQ(Named(*g, "model.layers.2.mlp.experts.7.down_proj.weight")->shape, (Shape{64, 32}));
  EXPECT_EQ(Named(*g, "model.layers.1.mlp.shared_experts.up_proj.weight")->shape, (Shape{32, 64}));
  EXPECT_EQ(Named(*g, "model.layers.1.mlp.shared_expert_gate.weight"), nullptr);
  const std::vector<std::string> gate = KindsIn(*g, "model.layers.1.mlp.gate");
  EXPECT_EQ(std::vector<std::string>(gate.begin(), gate.begin() + 4),
            (std::vector<std::string>{"to", "to", "linear", "sigmoid"}));
  const std::vector<std::string> linears = LinearModules(*g);
  EXPECT_EQ(std::count(linears.begin(), linears.end(), "model.layers.1.mlp.gate"), 0);
  EXPECT_EQ(std::count(linears.begin(), linears.end(), "model.layers.1.mlp.experts.0.up_proj"), 1);
  // Two shared experts are one MLP twice as wide.
  nlohmann::json two = Small();
  two["n_shared_experts"] = 2;
  g = Build(two);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(Named(*g, "model.layers.1.mlp.shared_experts.up_proj.weight")->shape, (Shape{64, 64}));
}

// transformers' DynamicCache keeps every head's key [qk_nope + qk_rope] and value [v_head_dim],
// not the latents.
TEST(HfDeepseekTest, InferenceCachesEveryHeadsKeysAndValues) {
  BuildContext c = enginetest::MakeContext(1, Mode::kInference);
  c.generate_tokens = 4;
  StatusOr<Graph> g = Build(Small(), 16, c);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(Named(*g, "model.layers.0.self_attn.k_cache")->shape, (Shape{1, 4, 4, 24}));
  EXPECT_EQ(Named(*g, "model.layers.0.self_attn.v_cache")->shape, (Shape{1, 4, 4, 16}));
}

// What autograd keeps in a training step (float32, eager attention, batch 2 of 16 tokens, SGD,
// the loop holding only the loss): PyTorch 2.15 with transformers 4.57.1 on the CPU kept
// 752,004 bytes (hf5_saved_check.py --cases deepseek, 2026-11-29), 1,024 of them the rotary
// tables transformers computes each forward and memest keeps as buffers.
TEST(HfDeepseekTest, SavedForBackwardIsMeasuredPyTorchs) {
  ModelSpec model;
  model.source = HfConfigSpec{FromJson(Small()), 16};
  RunConfig c;
  c.batch_size = 2;
  c.attention = AttentionImpl::kEager;
  c.optimizer.kind = OptimizerKind::kSgd;
  c.hold_outputs = false;
  StatusOr<Report> r = Estimate(model, c, {.advice = false});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->saved_for_backward_bytes, 752'004 - 1'024);
}

// vLLM's profile run: q_a_proj and kv_a_proj_with_mqa as one fused_qkv_a_proj, kv_b_proj's
// weight over no token, the latent attention as its profile runs it (served_mla_test.cc).
TEST(HfDeepseekTest, ServingBuildsVllmsLatentAttentionAndMegatronIsRefused) {
  BuildContext serving = enginetest::MakeContext(1, Mode::kInference);
  serving.serving = true;
  serving.mla_workspace_rows = 64;
  StatusOr<Graph> g = Build(Small(), 16, serving);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const std::string a = "model.layers.0.self_attn.";
  EXPECT_EQ(Named(*g, a + "fused_qkv_a_proj.weight")->shape, (Shape{48 + 32 + 8, 64}));
  EXPECT_EQ(Named(*g, a + "q_a_proj.weight"), nullptr);
  EXPECT_NE(Named(*g, a + "kv_b_proj.weight"), nullptr);
  EXPECT_EQ(KindsIn(*g, a + "mla_attn"), std::vector<std::string>{"mla_profile_attention"});
  EXPECT_EQ(Named(*g, "model.layers.1.mlp.gate.e_score_correction_bias")->dtype, DType::kFloat32);
  BuildContext megatron = enginetest::MakeContext(1);
  megatron.megatron = true;
  g = Build(Small(), 16, megatron);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("n_routed_experts"), std::string::npos);
}

struct BadCase {
  const char* name;
  nlohmann::json patch;
  const char* field;
};

class HfDeepseekBadConfigTest : public testing::TestWithParam<BadCase> {};

TEST_P(HfDeepseekBadConfigTest, IsRefusedNamingTheField) {
  nlohmann::json config = Small();
  config.merge_patch(GetParam().patch);
  StatusOr<Graph> g = Build(config);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(g.status().message().find(std::string("config.") + GetParam().field), std::string::npos)
      << g.status().ToString();
}

INSTANTIATE_TEST_SUITE_P(
    Configs, HfDeepseekBadConfigTest,
    testing::Values(
        BadCase{"GroupsNotDividing", {{"n_group", 3}}, "n_group"},
        BadCase{"GroupsOfOne", {{"n_group", 8}}, "n_group"},
        BadCase{"MoreTopGroupsThanGroups", {{"topk_group", 3}}, "topk_group"},
        BadCase{"MoreChosenThanExperts", {{"num_experts_per_tok", 9}}, "num_experts_per_tok"},
        BadCase{"OddRotaryWidth", {{"qk_rope_head_dim", 7}}, "qk_rope_head_dim"},
        BadCase{"HeadDimNotTheRotaryWidth", {{"head_dim", 16}}, "head_dim"},
        BadCase{"FewerKvHeads", {{"num_key_value_heads", 2}}, "num_key_value_heads"},
        BadCase{"NegativeDenseLayers", {{"first_k_dense_replace", -1}}, "first_k_dense_replace"},
        BadCase{"ZeroLatent", {{"kv_lora_rank", 0}}, "kv_lora_rank"},
        BadCase{"NoSharedExpert", {{"n_shared_experts", 0}}, "n_shared_experts"},
        BadCase{"ScalingNotANumber", {{"routed_scaling_factor", "big"}}, "routed_scaling_factor"},
        BadCase{"InfiniteScaling",
                {{"routed_scaling_factor", std::numeric_limits<double>::infinity()}},
                "routed_scaling_factor"},
        BadCase{"MoeEveryOtherLayer", {{"moe_layer_freq", 2}}, "moe_layer_freq"},
        BadCase{"MscaleWithoutFactor",
                {{"rope_scaling", {{"type", "yarn"}, {"mscale_all_dim", 1.0}}}},
                "rope_scaling.factor"}),
    [](const testing::TestParamInfo<BadCase>& info) { return info.param.name; });

}  // namespace
}  // namespace memest
