// Falcon and OPT from their configs (engine/models/hf_falcon_opt.h, the builders in
// falcon_decoder.cc and opt_decoder.cc): the fused query_key_value of each Falcon layout, its
// norms and KV cache, OPT's projections, positions and norms; bad configs refused naming the
// field. The parameter counts are HfParameterCountTest's (hf_config_test.cc).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/models/hf_config.h"
#include "tests/engine/hf_json.h"
#include "tests/engine/test_graphs.h"

namespace memest {
namespace {

using enginetest::FromJson;
using enginetest::ReadConfig;

StatusOr<Graph> Build(const nlohmann::json& config, int64_t seq = 16,
                      const BuildContext& context = enginetest::MakeContext(1)) {
  return BuildHfConfig(HfConfigSpec{FromJson(config), seq}, context);
}

BuildContext Context(AttentionImpl attention, Mode mode = Mode::kTraining, int64_t generate = 0) {
  BuildContext c = enginetest::MakeContext(2, mode);
  c.attention = attention;
  c.generate_tokens = generate;
  return c;
}

// Falcon-7B's layout, small: hidden 64, 4 heads of 16, multi_query, parallel_attn.
nlohmann::json SmallFalcon() {
  return {{"model_type", "falcon"},
          {"hidden_size", 64},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 4},
          {"vocab_size", 512}};
}

// OPT-125m's layout, small: hidden 64, 4 heads, ffn 128, 64 positions.
nlohmann::json SmallOpt() {
  return {{"model_type", "opt"},          {"hidden_size", 64}, {"num_hidden_layers", 2},
          {"num_attention_heads", 4},     {"ffn_dim", 128},    {"vocab_size", 512},
          {"max_position_embeddings", 64}};
}

const Tensor* Named(const Graph& g, const std::string& name) {
  for (const Tensor& t : g.tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

int Count(const Graph& g, const std::string& scope, const std::string& kind) {
  int n = 0;
  for (const Op& op : g.ops) n += op.scope == scope && op.kind == kind;
  return n;
}

TEST(HfFalconTest, MultiQuerySharesOneKeyAndValueHead) {
  StatusOr<Graph> g = Build(SmallFalcon());
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const Tensor* qkv = Named(*g, "transformer.h.0.self_attention.query_key_value.weight");
  ASSERT_NE(qkv, nullptr);
  EXPECT_EQ(qkv->shape, (Shape{64 + 2 * 16, 64}));
  EXPECT_EQ(Named(*g, "transformer.h.0.self_attention.query_key_value.bias"), nullptr);
  EXPECT_NE(Named(*g, "transformer.h.1.input_layernorm.weight"), nullptr);
  EXPECT_EQ(Named(*g, "transformer.h.1.post_attention_layernorm.weight"), nullptr);
  EXPECT_EQ(Named(*g, "lm_head.weight"), nullptr);  // tie_word_embeddings defaults to true
  // k and v are x[..., [-2], :] and x[..., [-1], :]: copies; the MLP adds the attention in place.
  EXPECT_EQ(Count(*g, "transformer.h.0.self_attention", "index"), 2);
  EXPECT_EQ(Count(*g, "transformer.h.0", "add_"), 1);
  // Inference: the cache holds the one shared head, the prompt's the forward returns and room
  // for the 8 generated tokens.
  StatusOr<Graph> inference =
      Build(SmallFalcon(), 16, Context(AttentionImpl::kEager, Mode::kInference, 8));
  ASSERT_TRUE(inference.ok()) << inference.status().ToString();
  const Tensor* cache = Named(*inference, "transformer.h.0.self_attention.k_cache");
  ASSERT_NE(cache, nullptr);
  EXPECT_EQ(cache->shape, (Shape{2, 1, 8, 16}));
  ASSERT_EQ(inference->cache.size(), 4u);
  EXPECT_EQ(inference->tensors[inference->cache[0]].shape, (Shape{2, 1, 16, 16}));
}

TEST(HfFalconTest, NewDecoderArchitectureGroupsKeysAndNormsTwice) {
  nlohmann::json config = SmallFalcon();
  config["new_decoder_architecture"] = true;
  config["num_kv_heads"] = 2;
  config["bias"] = true;
  StatusOr<Graph> g = Build(config, 16, Context(AttentionImpl::kEager, Mode::kInference, 8));
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const Tensor* qkv = Named(*g, "transformer.h.0.self_attention.query_key_value.weight");
  ASSERT_NE(qkv, nullptr);
  EXPECT_EQ(qkv->shape, (Shape{(2 * 2 + 4) * 16, 64}));
  EXPECT_NE(Named(*g, "transformer.h.0.self_attention.dense.bias"), nullptr);
  EXPECT_NE(Named(*g, "transformer.h.0.ln_attn.weight"), nullptr);
  EXPECT_NE(Named(*g, "transformer.h.0.ln_mlp.weight"), nullptr);
  EXPECT_EQ(Named(*g, "transformer.h.0.input_layernorm.weight"), nullptr);
  // The groups' k and v are broadcast to every head before the cache takes them.
  const Tensor* cache = Named(*g, "transformer.h.0.self_attention.v_cache");
  ASSERT_NE(cache, nullptr);
  EXPECT_EQ(cache->shape, (Shape{2, 4, 8, 16}));
  EXPECT_EQ(g->tensors[g->cache[1]].shape, (Shape{2, 4, 16, 16}));
  // One norm when num_ln_in_parallel_attn is 1.
  config["num_ln_in_parallel_attn"] = 1;
  StatusOr<Graph> one = Build(config);
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  EXPECT_NE(Named(*one, "transformer.h.0.input_layernorm.weight"), nullptr);
  EXPECT_EQ(one->ParameterCount(), g->ParameterCount() - 2 * 2 * 64);
}

TEST(HfFalconTest, SequentialLayersNormTwiceAndGiveEachHeadItsKeys) {
  nlohmann::json config = SmallFalcon();
  config["parallel_attn"] = false;
  config["multi_query"] = false;
  config["ffn_hidden_size"] = 96;
  StatusOr<Graph> g = Build(config, 16, Context(AttentionImpl::kSdpa));
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_NE(Named(*g, "transformer.h.0.post_attention_layernorm.weight"), nullptr);
  EXPECT_EQ(Named(*g, "transformer.h.0.self_attention.query_key_value.weight")->shape,
            (Shape{3 * 64, 64}));
  EXPECT_EQ(Named(*g, "transformer.h.0.mlp.dense_h_to_4h.weight")->shape, (Shape{96, 64}));
  EXPECT_EQ(Count(*g, "transformer.h.0", "add_"), 0);
  EXPECT_EQ(Count(*g, "transformer.h.0.self_attention.core", "scaled_dot_product_attention"), 1);
}

TEST(HfFalconTest, MultiQueryUnderSdpaRunsTheMathKernel) {
  StatusOr<Graph> g = Build(SmallFalcon(), 16, Context(AttentionImpl::kSdpa));
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  for (const Op& op : g->ops) {
    if (op.kind != "scaled_dot_product_attention") continue;
    EXPECT_EQ(std::get<std::string>(op.attrs.at("backend")), "math");
  }
}

TEST(HfOptTest, Opt350mProjectsItsEmbeddingsAndNormsAfter) {
  StatusOr<Graph> g = Build(ReadConfig("opt-350m"), 32);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(Named(*g, "model.decoder.project_in.weight")->shape, (Shape{1024, 512}));
  EXPECT_EQ(Named(*g, "model.decoder.project_out.weight")->shape, (Shape{512, 1024}));
  EXPECT_EQ(Named(*g, "model.decoder.embed_positions.weight")->shape, (Shape{2050, 1024}));
  EXPECT_EQ(Named(*g, "model.decoder.final_layer_norm.weight"), nullptr);
  EXPECT_NE(Named(*g, "model.decoder.layers.23.final_layer_norm.weight"), nullptr);
  EXPECT_EQ(Named(*g, "lm_head.weight"), nullptr);
}

TEST(HfOptTest, InferenceComputesEveryPositionsLogits) {
  StatusOr<Graph> g = Build(SmallOpt(), 16, Context(AttentionImpl::kEager, Mode::kInference, 4));
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  for (const Op& op : g->ops) {
    if (op.scope == "lm_head") EXPECT_EQ(g->tensors[op.outputs[0]].shape, (Shape{2, 16, 512}));
  }
  // The generated tokens' room; the prompt's keys and values are the forward's copies.
  EXPECT_EQ(Named(*g, "model.decoder.layers.0.self_attn.k_cache")->shape, (Shape{2, 4, 4, 16}));
  EXPECT_EQ(g->tensors[g->cache[0]].shape, (Shape{2, 4, 16, 16}));
}

TEST(HfOptTest, BiasAndAffineNormsFollowTheConfig) {
  nlohmann::json config = SmallOpt();
  StatusOr<Graph> full = Build(config);
  config["enable_bias"] = false;
  config["layer_norm_elementwise_affine"] = false;
  StatusOr<Graph> bare = Build(config);
  ASSERT_TRUE(full.ok() && bare.ok());
  // Per layer: q, k, v, out biases (4 * 64), fc1 (128), fc2 (64), two norms (4 * 64); the
  // final norm (2 * 64).
  EXPECT_EQ(full->ParameterCount() - bare->ParameterCount(),
            2 * (4 * 64 + 128 + 64 + 4 * 64) + 2 * 64);
  EXPECT_EQ(Named(*bare, "model.decoder.layers.0.fc1.bias"), nullptr);
}

struct BadCase {
  std::string name;
  nlohmann::json config;
  std::string message;
};

nlohmann::json Patched(nlohmann::json config, const nlohmann::json& patch) {
  for (const auto& [key, value] : patch.items()) {
    if (value.is_null()) {
      config.erase(key);
    } else {
      config[key] = value;
    }
  }
  return config;
}

class HfFalconOptBadConfigTest : public testing::TestWithParam<BadCase> {};

TEST_P(HfFalconOptBadConfigTest, IsRefusedNamingTheField) {
  StatusOr<Graph> g = Build(GetParam().config);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(g.status().message().find(GetParam().message), std::string::npos)
      << g.status().message();
}

INSTANTIATE_TEST_SUITE_P(
    Cases, HfFalconOptBadConfigTest,
    testing::Values(
        BadCase{"FalconRw1bAlibi", ReadConfig("falcon-rw-1b"),
                "model.hf_config.config.alibi: true is not modelled: ALiBi"},
        BadCase{"FalconNoHidden", Patched(SmallFalcon(), {{"hidden_size", nullptr}}),
                "model.hf_config.config.hidden_size: missing; a falcon config must give it"},
        BadCase{
            "FalconNewNotParallel",
            Patched(SmallFalcon(), {{"new_decoder_architecture", true}, {"parallel_attn", false}}),
            "model.hf_config.config.parallel_attn: false with new_decoder_architecture"},
        BadCase{"FalconTwoNormsOldLayout", Patched(SmallFalcon(), {{"num_ln_in_parallel_attn", 2}}),
                "model.hf_config.config.num_ln_in_parallel_attn: 2 without"},
        BadCase{"FalconKvHeadsNotDividing",
                Patched(SmallFalcon(), {{"new_decoder_architecture", true}, {"num_kv_heads", 3}}),
                "model.hf_config.config.num_kv_heads: must divide heads 4, got 3"},
        BadCase{"FalconUnknownActivation", Patched(SmallFalcon(), {{"activation", "swiglu"}}),
                "model.hf_config.config.activation: unknown activation 'swiglu'"},
        BadCase{"RefinedWeb", Patched(SmallFalcon(), {{"model_type", "RefinedWebModel"}}),
                "model.hf_config.config.model_type: 'RefinedWebModel' is Falcon's remote-code"},
        BadCase{"OptNoFfn", Patched(SmallOpt(), {{"ffn_dim", nullptr}}),
                "model.hf_config.config.ffn_dim: missing; a opt config must give it"},
        BadCase{"OptSeqPastPositions", Patched(SmallOpt(), {{"max_position_embeddings", 8}}),
                "model.hf_config.seq: must be at most the 8 positions"},
        BadCase{"OptLayerdrop", Patched(SmallOpt(), {{"layerdrop", 1.5}}),
                "model.hf_config.config.layerdrop: must be a probability in [0, 1)"},
        BadCase{"OptActivation", Patched(SmallOpt(), {{"activation_function", "quick_gelu"}}),
                "model.hf_config.config.activation_function: unknown activation"}),
    [](const testing::TestParamInfo<BadCase>& info) { return info.param.name; });

}  // namespace
}  // namespace memest
