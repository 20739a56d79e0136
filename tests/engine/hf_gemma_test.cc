// Gemma 2 and Gemma 3 from their configs (engine/models/hf_gemma.h): the sandwich norms, the
// soft-capping and what autograd keeps of it, the windowed and global layers' masks, rotary
// tables and KV caches, Gemma 3's q/k norms; bad configs refused naming the field. The
// parameter counts are HfParameterCountTest's (hf_config_test.cc).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <set>
#include <string>
#include <vector>

#include "engine/models/hf_config.h"
#include "tests/engine/hf_json.h"
#include "tests/engine/test_graphs.h"

namespace memest {
namespace {

using enginetest::FromJson;

StatusOr<Graph> Build(const nlohmann::json& config, int64_t seq = 16,
                      const BuildContext& context = enginetest::MakeContext(1)) {
  return BuildHfConfig(HfConfigSpec{FromJson(config), seq}, context);
}

BuildContext Context(AttentionImpl attention, Mode mode = Mode::kTraining,
                     int64_t generate = 0) {
  BuildContext c = enginetest::MakeContext(1, mode);
  c.attention = attention;
  c.generate_tokens = generate;
  return c;
}

// A small Gemma 2 (or 3) config: hidden 64, 4 heads of 16, 2 kv heads, window 8.
nlohmann::json Small(const std::string& model_type, int layers = 2) {
  return {{"model_type", model_type}, {"hidden_size", 64},        {"num_hidden_layers", layers},
          {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 16},
          {"intermediate_size", 128}, {"vocab_size", 512},        {"sliding_window", 8}};
}

bool Has(const Graph& g, const std::string& name) {
  for (const Tensor& t : g.tensors) {
    if (t.name == name) return true;
  }
  return false;
}

// The kinds of the ops in `scope`, in order.
std::vector<std::string> Kinds(const Graph& g, const std::string& scope) {
  std::vector<std::string> kinds;
  for (const Op& op : g.ops) {
    if (op.scope == scope) kinds.push_back(op.kind);
  }
  return kinds;
}

// The first op of `kind` in `scope`; null when there is none.
const Op* First(const Graph& g, const std::string& scope, const std::string& kind) {
  for (const Op& op : g.ops) {
    if (op.scope == scope && op.kind == kind) return &op;
  }
  return nullptr;
}

TEST(HfGemmaTest, Gemma2NormsBothSublayersBeforeAndAfter) {
  StatusOr<Graph> g = Build(Small("gemma2"));
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  for (const char* norm : {"input_layernorm", "post_attention_layernorm",
                           "pre_feedforward_layernorm", "post_feedforward_layernorm"}) {
    EXPECT_TRUE(Has(*g, std::string("model.layers.1.") + norm + ".weight")) << norm;
  }
  EXPECT_FALSE(Has(*g, "lm_head.weight"));  // tied by default
  // post_feedforward_layernorm's output is what the second residual add takes.
  const Op* rsqrt = First(*g, "model.layers.0.post_feedforward_layernorm", "rsqrt");
  ASSERT_NE(rsqrt, nullptr);
  EXPECT_EQ(g->tensors[rsqrt->inputs[0]].dtype, DType::kFloat32);
}

// Eager attention: scores * query_pre_attn_scalar ** -0.5, / 50, tanh, * 50, + the mask; the
// logits / 30, tanh, * 30 (Gemma2Config's defaults).
TEST(HfGemmaTest, Gemma2SoftCapsScoresAndLogitsInEagerAttention) {
  nlohmann::json config = Small("gemma2");
  config["query_pre_attn_scalar"] = 144;
  StatusOr<Graph> g = Build(config, 16, Context(AttentionImpl::kEager));
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const std::vector<std::string> core = Kinds(*g, "model.layers.0.self_attn.core");
  const std::vector<std::string> head = {"transpose", "matmul", "mul", "div", "tanh", "mul", "add"};
  ASSERT_GE(core.size(), head.size());
  EXPECT_EQ(std::vector<std::string>(core.begin(), core.begin() + head.size()), head);
  const Op* scale = First(*g, "model.layers.0.self_attn.core", "mul");
  EXPECT_DOUBLE_EQ(std::get<double>(scale->attrs.at("scalar")), 1.0 / 12.0);
  EXPECT_DOUBLE_EQ(
      std::get<double>(First(*g, "model.layers.0.self_attn.core", "div")->attrs.at("scalar")),
      50.0);
  EXPECT_EQ(Kinds(*g, "lm_head"), std::vector<std::string>{"linear"});
  EXPECT_EQ(Kinds(*g, ""), (std::vector<std::string>{"div", "tanh", "mul", "to", "view", "view",
                                                     "cross_entropy"}));
  EXPECT_DOUBLE_EQ(std::get<double>(First(*g, "", "div")->attrs.at("scalar")), 30.0);
}

// What the soft-capping costs: autograd keeps tanh's output, one [N, heads, T, T] per layer and
// the [N, T, vocab] logits' (float32 here), and nothing else (the divisions and products by a
// number keep nothing).
TEST(HfGemmaTest, SoftCappingKeepsEachTanhOutputForBackward) {
  nlohmann::json capped = Small("gemma2");
  nlohmann::json uncapped = capped;
  uncapped["attn_logit_softcapping"] = nullptr;
  uncapped["final_logit_softcapping"] = nullptr;
  const BuildContext c = Context(AttentionImpl::kEager);
  StatusOr<Graph> with = Build(capped, 16, c);
  StatusOr<Graph> without = Build(uncapped, 16, c);
  ASSERT_TRUE(with.ok() && without.ok()) << with.status().ToString();
  const RunConfig run = enginetest::PlainTraining();
  const int64_t scores = 1 * 4 * 16 * 16 * 4;
  const int64_t logits = 1 * 16 * 512 * 4;
  EXPECT_EQ(enginetest::SavedBytes(*with, run, "model.layers.0") -
                enginetest::SavedBytes(*without, run, "model.layers.0"),
            scores);
  EXPECT_EQ(enginetest::SavedBytes(*with, run, "") - enginetest::SavedBytes(*without, run, ""),
            2 * scores + logits);
}

// Layer 0 attends within the window, layer 1 to every key: eager adds each its own mask; SDPA
// gets the window's mask once the sequence reaches it, the global layer runs is_causal and no
// soft-capping (transformers' sdpa_attention_forward drops it).
TEST(HfGemmaTest, Gemma2AlternatesWindowedAndGlobalLayers) {
  StatusOr<Graph> eager = Build(Small("gemma2"), 16, Context(AttentionImpl::kEager));
  ASSERT_TRUE(eager.ok()) << eager.status().ToString();
  auto mask_of = [&](const Graph& g, int layer) {
    const Op* add = First(g, "model.layers." + std::to_string(layer) + ".self_attn.core", "add");
    return add == nullptr ? std::string() : g.tensors[add->inputs[1]].name;
  };
  EXPECT_EQ(mask_of(*eager, 0), "model.sliding_window_mask");
  EXPECT_EQ(mask_of(*eager, 1), "model.causal_mask");
  auto sdpa_inputs = [](const Graph& g, int layer) {
    const Op* op = First(g, "model.layers." + std::to_string(layer) + ".self_attn.core",
                         "scaled_dot_product_attention");
    return op == nullptr ? size_t{0} : op->inputs.size();
  };
  StatusOr<Graph> sdpa = Build(Small("gemma2"), 16, Context(AttentionImpl::kSdpa));
  ASSERT_TRUE(sdpa.ok()) << sdpa.status().ToString();
  EXPECT_EQ(sdpa_inputs(*sdpa, 0), 4u);  // q, k, v and the window's mask
  EXPECT_EQ(sdpa_inputs(*sdpa, 1), 3u);
  int tanh = 0;
  for (const Op& op : sdpa->ops) tanh += op.kind == "tanh";
  EXPECT_EQ(tanh, 1);  // the logits' only
  StatusOr<Graph> within = Build(Small("gemma2"), 7, Context(AttentionImpl::kSdpa));
  ASSERT_TRUE(within.ok());
  EXPECT_EQ(sdpa_inputs(*within, 0), 3u);
  EXPECT_FALSE(Has(*within, "model.sliding_window_mask"));
  // layer_types (transformers 5) decide over the alternation.
  nlohmann::json config = Small("gemma2");
  config["layer_types"] = {"full_attention", "sliding_attention"};
  StatusOr<Graph> typed = Build(config, 16, Context(AttentionImpl::kEager));
  ASSERT_TRUE(typed.ok()) << typed.status().ToString();
  EXPECT_EQ(mask_of(*typed, 0), "model.causal_mask");
  EXPECT_EQ(mask_of(*typed, 1), "model.sliding_window_mask");
}

// Inference: a windowed layer's cache keeps min(seq + generated, max(seq, window)) positions,
// a global layer's all of them: the prompt's keys the forward returns, and room for the rest.
TEST(HfGemmaTest, WindowedLayersCacheTheWindow) {
  StatusOr<Graph> g =
      Build(Small("gemma2"), 6, Context(AttentionImpl::kSdpa, Mode::kInference, 100));
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  auto cached = [&](const std::string& name) {
    for (const Tensor& t : g->tensors) {
      if (t.name == name) return t.shape[2];
    }
    return int64_t{-1};
  };
  EXPECT_EQ(cached("model.layers.0.self_attn.k_cache"), 8 - 6);
  EXPECT_EQ(cached("model.layers.1.self_attn.k_cache"), 100);
  EXPECT_EQ(g->tensors[g->cache[0]].shape[2], 6);
  StatusOr<Graph> longer =
      Build(Small("gemma2"), 16, Context(AttentionImpl::kSdpa, Mode::kInference, 100));
  ASSERT_TRUE(longer.ok());
  // The prompt is past the window: its 16 keys are all the windowed layer keeps, its room empty.
  for (const Tensor& t : longer->tensors) {
    if (t.name == "model.layers.0.self_attn.v_cache") EXPECT_EQ(t.shape[2], 0);
  }
  EXPECT_EQ(longer->tensors[longer->cache[1]].shape[2], 16);
}

// Gemma 3: every sliding_window_pattern-th layer global; q_norm and k_norm GemmaRMSNorms over
// head_dim after the transpose; the windowed layers' own rotary tables; attn_logit_softcapping
// not applied (Gemma3Attention does not pass it), no logit soft-capping by default.
TEST(HfGemmaTest, Gemma3NormsQueriesAndKeysAndRotatesLocalLayersApart) {
  nlohmann::json config = Small("gemma3_text", 3);
  config["sliding_window_pattern"] = 3;
  config["attn_logit_softcapping"] = 50.0;
  StatusOr<Graph> g = Build(config, 16, Context(AttentionImpl::kEager));
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_TRUE(Has(*g, "model.rotary_emb.cos_cached"));
  EXPECT_TRUE(Has(*g, "model.rotary_emb_local.sin_cached"));
  auto rotary_of = [&](int layer) {
    const std::string scope = "model.layers." + std::to_string(layer) + ".self_attn";
    for (const Op& op : g->ops) {
      if (op.scope == scope && op.kind == "unsqueeze") return g->tensors[op.inputs[0]].name;
    }
    return std::string();
  };
  EXPECT_EQ(rotary_of(0), "model.rotary_emb_local.cos_cached");
  EXPECT_EQ(rotary_of(2), "model.rotary_emb.cos_cached");
  const Op* up = First(*g, "model.layers.0.self_attn.q_norm", "to");
  ASSERT_NE(up, nullptr);
  EXPECT_EQ(g->tensors[up->inputs[0]].shape, (Shape{1, 4, 16, 16}));  // [N, heads, T, hd]
  EXPECT_TRUE(Has(*g, "model.layers.0.self_attn.k_norm.weight"));
  for (const Op& op : g->ops) EXPECT_NE(op.kind, "tanh") << op.scope;
  // Two layers of pattern 6: both windowed, so only the local tables are built.
  StatusOr<Graph> local = Build(Small("gemma3_text"), 16, Context(AttentionImpl::kEager));
  ASSERT_TRUE(local.ok());
  EXPECT_FALSE(Has(*local, "model.rotary_emb.cos_cached"));
  EXPECT_TRUE(Has(*local, "model.rotary_emb_local.cos_cached"));
}

TEST(HfGemmaTest, Gemma3ReadsTransformers5RopeParametersPerLayerType) {
  nlohmann::json config = Small("gemma3_text");
  config["rope_parameters"] = {
      {"full_attention", {{"rope_type", "linear"}, {"factor", 8.0}, {"rope_theta", 1e6}}},
      {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 1e4}}}};
  EXPECT_TRUE(Build(config).ok());
  config["rope_parameters"]["sliding_attention"]["rope_type"] = "spiral";
  EXPECT_NE(Build(config).status().message().find(
                "model.hf_config.config.rope_parameters.sliding_attention.rope_type: unknown "
                "'spiral'"),
            std::string::npos)
      << Build(config).status().message();
}

struct BadGemma {
  std::string name;
  std::string model_type;
  nlohmann::json patch;  // merged into Small(model_type)
  std::string message;
};

class HfGemmaBadConfigTest : public testing::TestWithParam<BadGemma> {};

TEST_P(HfGemmaBadConfigTest, IsRefusedNamingTheField) {
  nlohmann::json config = Small(GetParam().model_type);
  for (const auto& [key, value] : GetParam().patch.items()) config[key] = value;
  StatusOr<Graph> g = Build(config);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(g.status().message().find(GetParam().message), std::string::npos)
      << g.status().message();
}

INSTANTIATE_TEST_SUITE_P(
    Cases, HfGemmaBadConfigTest,
    testing::Values(
        BadGemma{"LayerTypesTooFew", "gemma2", {{"layer_types", {"sliding_attention"}}},
                 "model.hf_config.config.layer_types: must give one type for each of the 2 "
                 "layers (num_hidden_layers), got 1"},
        BadGemma{"UnknownLayerType", "gemma3_text",
                 {{"layer_types", {"sliding_attention", "chunked_attention"}}},
                 "model.hf_config.config.layer_types[1]: 'chunked_attention' is not a Gemma "
                 "layer type"},
        BadGemma{"NullWindow", "gemma2", {{"sliding_window", nullptr}},
                 "model.hf_config.config.sliding_window: null is refused by transformers"},
        BadGemma{"ZeroScalar", "gemma2", {{"query_pre_attn_scalar", 0}},
                 "model.hf_config.config.query_pre_attn_scalar: must be a finite number > 0, "
                 "got 0"},
        BadGemma{"CapAsText", "gemma2", {{"attn_logit_softcapping", "50"}},
                 "model.hf_config.config.attn_logit_softcapping: must be a positive number, "
                 "got a string"},
        BadGemma{"NegativeFinalCap", "gemma3_text", {{"final_logit_softcapping", -30}},
                 "model.hf_config.config.final_logit_softcapping: must be a finite number > 0"},
        BadGemma{"HeadsNotDividingHidden", "gemma2", {{"num_attention_heads", 6},
                                                      {"num_key_value_heads", 2}},
                 "model.hf_config.config.num_attention_heads: must divide hidden_size 64, got 6"},
        BadGemma{"ZeroPattern", "gemma3_text", {{"sliding_window_pattern", 0}},
                 "model.hf_config.config.sliding_window_pattern: must be an integer from 1"},
        BadGemma{"Bidirectional", "gemma3_text", {{"use_bidirectional_attention", true}},
                 "model.hf_config.config.use_bidirectional_attention: true is not modelled"},
        BadGemma{"OtherArchitecture", "gemma3_text",
                 {{"architectures", {"Gemma3ForConditionalGeneration"}}},
                 "a config of this model_type builds Gemma3ForCausalLM"},
        BadGemma{"Multimodal", "gemma3_text",
                 {{"model_type", "gemma3"}, {"text_config", {{"model_type", "gemma3_text"}}}},
                 "model.hf_config.config.model_type: 'gemma3' is "
                 "Gemma3ForConditionalGeneration, the multimodal model"}),
    [](const testing::TestParamInfo<BadGemma>& info) { return info.param.name; });

}  // namespace
}  // namespace memest
