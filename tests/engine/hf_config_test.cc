// The Hugging Face config front end (engine/models/hf_config.h): real configs build the models
// transformers builds, to the parameter; variants show in the graph; bad configs are refused
// naming the field.
#include "engine/models/hf_config.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <limits>
#include <set>
#include <string>

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

// A small Llama-family config to vary.
nlohmann::json Small(const std::string& model_type) {
  return {{"model_type", model_type}, {"hidden_size", 64},      {"num_hidden_layers", 2},
          {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"intermediate_size", 128},
          {"vocab_size", 512}};
}

std::set<std::string> Names(const Graph& g, TensorRole role) {
  std::set<std::string> names;
  for (const Tensor& t : g.tensors) {
    if (t.role == role) names.insert(t.name);
  }
  return names;
}

// The counts of sum(p.numel() for p in model.parameters()) of
// AutoModelForCausalLM.from_config on the meta device, printed by
// tests/data/hf_configs/count_params.py (transformers 4.47.1, and 5.17.0 for Qwen3, Qwen3-MoE and
// Gemma 3), which are the models' published counts.
struct CountCase {
  std::string file;
  int64_t parameters;
};

class HfParameterCountTest : public testing::TestWithParam<CountCase> {};

TEST_P(HfParameterCountTest, IsWhatTransformersBuilds) {
  const nlohmann::json config = ReadConfig(GetParam().file);
  // An image model's sequence is its image's (0: the config's).
  StatusOr<Graph> g = Build(config, config.value("model_type", "") == "vit" ? 0 : 16);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->ParameterCount(), GetParam().parameters);
  EXPECT_EQ(g->TrainableParameterCount(), GetParam().parameters);
}

INSTANTIATE_TEST_SUITE_P(
    Configs, HfParameterCountTest,
    testing::Values(CountCase{"falcon-7b", 6'921'720'704},
                    CountCase{"falcon-40b", 41'303'293'952},
                    CountCase{"gemma-2b", 2'506'172'416},
                    CountCase{"gemma-2-2b", 2'614'341'888},
                    CountCase{"gemma-2-9b", 9'241'705'984},
                    CountCase{"gemma-2-27b", 27'227'128'320},
                    CountCase{"gemma-3-1b-it", 999'885'952},
                    CountCase{"gemma-3-4b-text", 3'880'263'168}, CountCase{"gpt2", 124'439'808},
                    CountCase{"gpt2-xl", 1'557'611'200},
                    CountCase{"llama-2-7b", 6'738'415'616},
                    CountCase{"llama-3-8b", 8'030'261'248},
                    CountCase{"llama-3.1-8b", 8'030'261'248},
                    CountCase{"llama-3.2-1b", 1'235'814'400},
                    CountCase{"mistral-7b-v0.1", 7'241'732'096},
                    CountCase{"phi-3-mini-4k", 3'821'079'552},
                    CountCase{"pythia-1b", 1'011'781'632},
                    CountCase{"qwen2.5-0.5b", 494'032'768},
                    CountCase{"qwen2.5-7b", 7'615'616'512},
                    CountCase{"qwen3-0.6b", 596'049'920},
                    CountCase{"mixtral-8x7b", 46'702'792'704},
                    CountCase{"qwen1.5-moe-a2.7b", 14'315'784'192},
                    CountCase{"qwen3-30b-a3b", 30'532'122'624},
                    CountCase{"qwen3-8b", 8'190'735'360},
                    CountCase{"opt-125m", 125'239'296}, CountCase{"opt-350m", 331'196'416},
                    CountCase{"bert-base-uncased", 109'514'298},
                    CountCase{"bert-large-uncased", 335'174'458},
                    CountCase{"roberta-base", 124'697'433},
                    // its id2label's 1000 labels written as num_labels
                    CountCase{"vit-base-patch16-224", 86'567'656},
                    CountCase{"t5-small", 60'506'624},
                    CountCase{"flan-t5-base", 247'577'856},
                    CountCase{"opt-1.3b", 1'315'758'080},
                    CountCase{"opt-6.7b", 6'658'473'984}),
    [](const testing::TestParamInfo<CountCase>& info) {
      std::string name;
      for (char ch : info.param.file) name += std::isalnum(ch) ? ch : '_';
      return name;
    });

TEST(HfConfigTest, BertIsTheBertBasePresetAndRobertaNumbersItsPositions) {
  const BuildContext ctx = enginetest::MakeContext(2);
  StatusOr<Graph> from_config = Build(ReadConfig("bert-base-uncased"), 128, ctx);
  StatusOr<Graph> preset = BuildGraph(ModelSpec{PresetSpec{"bert-base", {{"seq", 128}}}}, ctx);
  ASSERT_TRUE(from_config.ok()) << from_config.status().ToString();
  ASSERT_TRUE(preset.ok()) << preset.status().ToString();
  ASSERT_EQ(from_config->ops.size(), preset->ops.size());
  for (size_t i = 0; i < preset->ops.size(); ++i) EXPECT_EQ(from_config->ops[i].kind, preset->ops[i].kind);
  EXPECT_EQ(from_config->ParameterCount(), preset->ParameterCount());

  StatusOr<Graph> r = Build(ReadConfig("roberta-base"), 512, ctx);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  bool cumsum = false;
  for (const Op& op : r->ops) cumsum |= op.kind == "cumsum";
  EXPECT_TRUE(cumsum);  // create_position_ids_from_input_ids
  // 514 positions numbered from pad_token_id + 1 = 2: 512 tokens at most.
  StatusOr<Graph> too_long = Build(ReadConfig("roberta-base"), 513, ctx);
  ASSERT_FALSE(too_long.ok());
  EXPECT_NE(too_long.status().message().find("model.hf_config.seq: must be at most 512"),
            std::string::npos) << too_long.status().message();
}

TEST(HfConfigTest, VitTakesItsTokensFromTheImage) {
  nlohmann::json vit = {{"model_type", "vit"},       {"hidden_size", 64},  {"num_hidden_layers", 2},
                        {"num_attention_heads", 4}, {"intermediate_size", 128},
                        {"image_size", 32},         {"patch_size", 8},
                        {"id2label", {{"0", "a"}, {"1", "b"}, {"2", "c"}}}};
  StatusOr<Graph> g = Build(vit, 0);  // no seq: (32 / 8)^2 + 1 = 17 tokens
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  bool classifier = false;
  for (const Tensor& t : g->tensors) {
    if (t.name == "classifier.weight") classifier = t.shape == Shape{3, 64};  // id2label's 3
  }
  EXPECT_TRUE(classifier);
  EXPECT_TRUE(Build(vit, 17).ok());
  StatusOr<Graph> wrong = Build(vit, 16);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("model.hf_config.seq: a vit config's sequence"),
            std::string::npos) << wrong.status().message();
  vit["num_labels"] = 1000;  // transformers takes id2label's count over it
  g = Build(vit, 0);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  for (const Tensor& t : g->tensors) {
    if (t.name == "classifier.weight") EXPECT_EQ(t.shape, (Shape{3, 64}));
  }
  vit["patch_size"] = 5;  // the conv floors: (32 // 5)^2 + 1 = 37 tokens
  EXPECT_TRUE(Build(vit, 37).ok());
  vit["patch_size"] = 64;
  StatusOr<Graph> patch = Build(vit, 0);
  ASSERT_FALSE(patch.ok());
  EXPECT_NE(patch.status().message().find("model.hf_config.config.patch_size"), std::string::npos)
      << patch.status().message();
  vit["patch_size"] = 8;
  vit["problem_type"] = "regression";
  StatusOr<Graph> regression = Build(vit, 0);
  ASSERT_FALSE(regression.ok());
  EXPECT_NE(regression.status().message().find("model.hf_config.config.problem_type"),
            std::string::npos) << regression.status().message();
}

TEST(HfConfigTest, Qwen2BiasesQkvButNotTheOutput) {
  StatusOr<Graph> g = Build(Small("qwen2"));
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const std::set<std::string> params = Names(*g, TensorRole::kParameter);
  EXPECT_TRUE(params.count("model.layers.0.self_attn.q_proj.bias"));
  EXPECT_TRUE(params.count("model.layers.0.self_attn.v_proj.bias"));
  EXPECT_FALSE(params.count("model.layers.0.self_attn.o_proj.bias"));
  EXPECT_FALSE(params.count("model.layers.0.mlp.up_proj.bias"));
}

TEST(HfConfigTest, LlamaAttentionBiasBiasesAllFourAndMlpBiasTheMlp) {
  nlohmann::json config = Small("llama");
  config["attention_bias"] = true;
  config["mlp_bias"] = true;
  StatusOr<Graph> g = Build(config);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const std::set<std::string> params = Names(*g, TensorRole::kParameter);
  EXPECT_TRUE(params.count("model.layers.1.self_attn.o_proj.bias"));
  EXPECT_TRUE(params.count("model.layers.1.self_attn.k_proj.bias"));
  EXPECT_TRUE(params.count("model.layers.1.mlp.down_proj.bias"));
}

TEST(HfConfigTest, Qwen3NormsQueriesAndKeysOverAnExplicitHeadDim) {
  nlohmann::json config = Small("qwen3");
  config["head_dim"] = 32;  // 4 heads of 32: q_proj is 64 -> 128
  StatusOr<Graph> g = Build(config);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  bool q_norm = false;
  for (const Tensor& t : g->tensors) {
    if (t.name == "model.layers.0.self_attn.q_norm.weight") q_norm = t.shape == Shape{32};
    if (t.name == "model.layers.0.self_attn.q_proj.weight") {
      EXPECT_EQ(t.shape, (Shape{128, 64}));
    }
    if (t.name == "model.layers.0.self_attn.o_proj.weight") {
      EXPECT_EQ(t.shape, (Shape{64, 128}));
    }
  }
  EXPECT_TRUE(q_norm);
}

// Gemma scales its embeddings by sqrt(d_model) and normalises in float32 with (1 + weight).
TEST(HfConfigTest, GemmaScalesEmbeddingsAndNormsInFloat32) {
  nlohmann::json config = Small("gemma");
  config.erase("num_key_value_heads");  // GemmaConfig: 16, more than the 4 heads here
  config["num_key_value_heads"] = 1;
  config["head_dim"] = 32;
  StatusOr<Graph> g = Build(config, 16, enginetest::MakeContext(1, Mode::kTraining,
                                                                DType::kBFloat16));
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_FALSE(Names(*g, TensorRole::kParameter).count("lm_head.weight"));  // tied by default
  const Op& scale = g->ops[1];  // after the embedding
  EXPECT_EQ(scale.kind, "mul");
  EXPECT_DOUBLE_EQ(std::get<double>(scale.attrs.at("scalar")), 8.0);
  int rsqrt_fp32 = 0;
  for (const Op& op : g->ops) {
    if (op.kind == "rsqrt" && op.scope.find("input_layernorm") != std::string::npos &&
        g->tensors[op.inputs[0]].dtype == DType::kFloat32) {
      ++rsqrt_fp32;
    }
  }
  EXPECT_EQ(rsqrt_fp32, 2);  // one per layer
}

// What Hugging Face's Python code keeps referenced past its last use in the graph: the MLP's
// input until down_proj has run (LlamaMLP.forward's `x`), a layer's input until the layer's
// last op (the decoder loop's variable), the embeddings until the final norm.
TEST(HfConfigTest, HuggingFaceLocalsAreHeld) {
  StatusOr<Graph> g = Build(Small("llama"), 16, enginetest::MakeContext(1, Mode::kInference));
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  auto op_in = [&](const std::string& scope, const std::string& kind) {
    for (size_t i = 0; i < g->ops.size(); ++i) {
      if (g->ops[i].scope == scope && g->ops[i].kind == kind) return static_cast<int>(i);
    }
    return -1;
  };
  auto held_until = [&](int op) {
    const int tensor = g->ops[op].outputs[0];
    int until = -1;
    for (const HeldTensor& h : g->held) {
      if (h.tensor == tensor) until = std::max(until, h.until_op);
    }
    return until;
  };
  const int norm = op_in("model.layers.0.post_attention_layernorm", "rms_norm");
  const int down = op_in("model.layers.0.mlp.down_proj", "linear");
  ASSERT_GE(norm, 0);
  ASSERT_GE(down, 0);
  EXPECT_EQ(held_until(norm), down);
  const int embed = op_in("model.embed_tokens", "embedding");
  EXPECT_EQ(held_until(embed), op_in("model.norm", "rms_norm"));
}

// Phi-3 fuses q, k, v into qkv_proj and gate and up into gate_up_proj, and rotates the first
// head_dim * partial_rotary_factor dims of each head, then cats the rest back.
TEST(HfConfigTest, Phi3FusesItsProjectionsAndRotatesPartOfEachHead) {
  nlohmann::json config = Small("phi3");
  config["partial_rotary_factor"] = 0.5;  // 8 of the 16 dims
  StatusOr<Graph> g = Build(config);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const std::set<std::string> params = Names(*g, TensorRole::kParameter);
  EXPECT_TRUE(params.count("model.layers.0.self_attn.qkv_proj.weight"));
  EXPECT_TRUE(params.count("model.layers.0.mlp.gate_up_proj.weight"));
  EXPECT_FALSE(params.count("model.layers.0.self_attn.q_proj.weight"));
  for (const Tensor& t : g->tensors) {
    if (t.name == "model.layers.0.self_attn.qkv_proj.weight") {
      EXPECT_EQ(t.shape, (Shape{(4 + 2 * 2) * 16, 64}));
    }
    if (t.name == "model.rotary_emb.cos_cached") {
      EXPECT_EQ(t.shape, (Shape{1, 16, 8}));
    }
  }
  int cats = 0;
  for (const Op& op : g->ops) {
    if (op.kind == "cat" && op.scope == "model.layers.0.self_attn" && op.inputs.size() == 2 &&
        g->tensors[op.inputs[1]].shape.back() == 8) {
      ++cats;  // q and k: rotated half, then the half left as it was
    }
  }
  EXPECT_EQ(cats, 2);
  config["partial_rotary_factor"] = 1.5;
  EXPECT_NE(Build(config).status().message().find(
                "model.hf_config.config.partial_rotary_factor: must be in (0, 1]"),
            std::string::npos);
}

// GPT-NeoX runs the attention and the MLP on the layer's input and adds both to it
// (use_parallel_residual), or one after the other; its rotary covers rotary_pct of each head.
TEST(HfConfigTest, GptNeoxAddsItsParallelBranches) {
  nlohmann::json config = {{"model_type", "gpt_neox"},   {"hidden_size", 64},
                           {"num_hidden_layers", 2},     {"num_attention_heads", 4},
                           {"intermediate_size", 128},   {"vocab_size", 512},
                           {"max_position_embeddings", 32}};
  auto adds_in_layer = [](const Graph& g) {
    int adds = 0;
    for (const Op& op : g.ops) adds += op.kind == "add" && op.scope == "gpt_neox.layers.0";
    return adds;
  };
  StatusOr<Graph> parallel = Build(config);
  ASSERT_TRUE(parallel.ok()) << parallel.status().ToString();
  EXPECT_EQ(adds_in_layer(*parallel), 2);  // (mlp + attn) + x
  for (const Tensor& t : parallel->tensors) {
    if (t.name == "gpt_neox.rotary_emb.cos_cached") {
      EXPECT_EQ(t.shape, (Shape{1, 16, 4}));  // 16-dim heads, rotary_pct 0.25
    }
    if (t.name == "gpt_neox.layers.0.attention.bias") {
      EXPECT_EQ(t.shape, (Shape{1, 1, 32, 32}));  // transformers 4.x's mask buffer
    }
  }
  config["use_parallel_residual"] = false;
  StatusOr<Graph> sequential = Build(config);
  ASSERT_TRUE(sequential.ok()) << sequential.status().ToString();
  EXPECT_EQ(adds_in_layer(*sequential), 2);  // attn + x, then mlp + that
  EXPECT_EQ(sequential->ParameterCount(), parallel->ParameterCount());
  config["rotary_pct"] = 0.1;  // 1.6 dims: int() makes 1, odd
  EXPECT_NE(Build(config).status().message().find("model.hf_config.config.rotary_pct: must "
                                                  "rotate an even number"),
            std::string::npos);
}

TEST(HfConfigTest, TiedEmbeddingsHaveNoLmHeadWeight) {
  nlohmann::json config = Small("llama");
  config["tie_word_embeddings"] = true;
  StatusOr<Graph> tied = Build(config);
  config["tie_word_embeddings"] = false;
  StatusOr<Graph> untied = Build(config);
  ASSERT_TRUE(tied.ok() && untied.ok());
  EXPECT_FALSE(Names(*tied, TensorRole::kParameter).count("lm_head.weight"));
  EXPECT_TRUE(Names(*untied, TensorRole::kParameter).count("lm_head.weight"));
  EXPECT_EQ(untied->ParameterCount() - tied->ParameterCount(), 512 * 64);
}

// The inputs of the graph's first scaled_dot_product_attention, and its backend.
std::pair<size_t, std::string> Sdpa(const Graph& g) {
  for (const Op& op : g.ops) {
    if (op.kind == "scaled_dot_product_attention") {
      return {op.inputs.size(), std::get<std::string>(op.attrs.at("backend"))};
    }
  }
  return {0, ""};
}

TEST(HfConfigTest, MistralWindowTheSequenceReachesGivesSdpaAMask) {
  nlohmann::json config = Small("mistral");
  config["sliding_window"] = 8;
  BuildContext c = enginetest::MakeContext(1, Mode::kTraining, DType::kBFloat16);
  c.attention = AttentionImpl::kSdpa;
  StatusOr<Graph> longer = Build(config, 16, c);
  StatusOr<Graph> within = Build(config, 7, c);
  StatusOr<Graph> reaching = Build(config, 8, c);  // kv_length >= sliding_window: the mask
  ASSERT_TRUE(reaching.ok()) << reaching.status().ToString();
  EXPECT_EQ(Sdpa(*reaching).first, 4u);
  ASSERT_TRUE(longer.ok() && within.ok()) << longer.status().ToString();
  EXPECT_EQ(Sdpa(*longer).first, 4u);  // q, k, v and the mask: no flash kernel
  EXPECT_NE(Sdpa(*longer).second, "flash");
  EXPECT_EQ(Sdpa(*within).first, 3u);
  EXPECT_EQ(Sdpa(*within).second, "flash");
  // flash-attn takes the window as an argument.
  c.attention = AttentionImpl::kFlash;
  StatusOr<Graph> flash = Build(config, 16, c);
  ASSERT_TRUE(flash.ok()) << flash.status().ToString();
  EXPECT_EQ(Sdpa(*flash).first, 3u);
  // "sliding_window": null is full attention; left out, MistralConfig's 4096.
  config["sliding_window"] = nullptr;
  c.attention = AttentionImpl::kSdpa;
  StatusOr<Graph> full = Build(config, 16, c);
  ASSERT_TRUE(full.ok());
  EXPECT_EQ(Sdpa(*full).first, 3u);
}

TEST(HfConfigTest, Gpt2FollowsItsConfig) {
  nlohmann::json config = {{"model_type", "gpt2"}, {"n_embd", 64}, {"n_layer", 2},
                           {"n_head", 4},          {"vocab_size", 512}, {"n_positions", 32},
                           {"n_inner", 100},       {"activation_function", "relu"}};
  StatusOr<Graph> g = Build(config, 32);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  bool relu = false;
  for (const Op& op : g->ops) relu = relu || op.kind == "relu";
  EXPECT_TRUE(relu);
  for (const Tensor& t : g->tensors) {
    if (t.name == "transformer.h.0.mlp.c_fc.weight") {
      EXPECT_EQ(t.shape, (Shape{64, 100}));
    }
    if (t.name == "transformer.wpe.weight") {
      EXPECT_EQ(t.shape, (Shape{32, 64}));
    }
  }
  StatusOr<Graph> longer = Build(config, 33);
  EXPECT_EQ(longer.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(longer.status().message().find("model.hf_config.seq: must be at most the 32"),
            std::string::npos)
      << longer.status().message();
}

struct BadCase {
  std::string name;
  nlohmann::json patch;  // merged into Small("llama"); null values remove the key
  std::string message;
};

class HfBadConfigTest : public testing::TestWithParam<BadCase> {};

TEST_P(HfBadConfigTest, IsRefusedNamingTheField) {
  nlohmann::json config = Small("llama");
  for (const auto& [key, value] : GetParam().patch.items()) {
    if (value.is_null()) {
      config.erase(key);
    } else {
      config[key] = value;
    }
  }
  StatusOr<Graph> g = Build(config);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(g.status().message().find(GetParam().message), std::string::npos)
      << g.status().message();
}

INSTANTIATE_TEST_SUITE_P(
    Cases, HfBadConfigTest,
    testing::Values(
        BadCase{"UnknownType", {{"model_type", "llama9"}},
                "model.hf_config.config.model_type: 'llama9' is not supported; supported: bert, "
                "deepseek_v3, falcon, gemma, gemma2, gemma3_text, gpt2, gpt_neox, llama, mistral, "
                "mixtral, opt, phi3, qwen2, qwen2_moe, qwen3, qwen3_moe, roberta, t5, vit"},
        BadCase{"NoType", {{"model_type", nullptr}}, "model.hf_config.config.model_type: missing"},
        BadCase{"MissingSize", {{"hidden_size", nullptr}},
                "model.hf_config.config.hidden_size: missing; a llama config must give it"},
        BadCase{"SizeAsText", {{"intermediate_size", "128"}},
                "model.hf_config.config.intermediate_size: must be a positive integer, got a "
                "string"},
        BadCase{"FractionalSize", {{"vocab_size", 512.5}},
                "model.hf_config.config.vocab_size: must be an integer from 1 to 16777216, got "
                "512.5"},
        BadCase{"NegativeSize", {{"num_hidden_layers", -2}},
                "model.hf_config.config.num_hidden_layers: must be an integer from 1"},
        BadCase{"HeadsNotDividing", {{"num_attention_heads", 3}},
                "model.hf_config.config.num_attention_heads: must divide hidden_size 64, got 3"},
        BadCase{"KvHeadsNotDividing", {{"num_key_value_heads", 3}},
                "model.hf_config.config.num_key_value_heads: must divide heads 4, got 3"},
        BadCase{"OddHeadDim", {{"head_dim", 7}}, "model.hf_config.config.head_dim: must leave an "
                                                  "even head_dim"},
        BadCase{"OtherArchitecture", {{"architectures", {"LlamaForSequenceClassification"}}},
                "model.hf_config.config.architectures[0]: 'LlamaForSequenceClassification' is "
                "not built; a config of this model_type builds LlamaForCausalLM"},
        BadCase{"UnknownActivation", {{"hidden_act", "quick_gelu"}},
                "model.hf_config.config.hidden_act: unknown activation 'quick_gelu'"},
        BadCase{"UnknownRope", {{"rope_scaling", {{"rope_type", "spiral"}, {"factor", 2}}}},
                "model.hf_config.config.rope_scaling.rope_type: unknown 'spiral'"},
        BadCase{"DropoutOfOne", {{"attention_dropout", 1.0}},
                "model.hf_config.config.attention_dropout: must be a probability in [0, 1)"},
        BadCase{"Quantized", {{"quantization_config", {{"load_in_4bit", true}}}},
                "model.hf_config.config.quantization_config: a quantized checkpoint is estimated and planned"},
        BadCase{"RopeTypeWins", {{"rope_scaling", {{"type", "spiral"}, {"rope_type", "linear"}}}},
                "model.hf_config.config.rope_scaling.type: unknown 'spiral'"},
        BadCase{"TinySize", {{"hidden_size", 1e-7}},
                "model.hf_config.config.hidden_size: must be an integer from 1 to 16777216, got "
                "9.9999999999999995e-08"},
        BadCase{"BiasAsNumber", {{"attention_bias", 1}},
                "model.hf_config.config.attention_bias: must be true or false, got a number"}),
    [](const testing::TestParamInfo<BadCase>& info) { return info.param.name; });

// num_key_value_heads: null is the heads' count; left out, the Config class's default.
TEST(HfConfigTest, KvHeadsDefaultAsTheConfigClassesDo) {
  auto kv_width = [](const std::string& type, const nlohmann::json& kv) {
    nlohmann::json config = Small(type);
    config["num_attention_heads"] = 32;
    config["hidden_size"] = 256;
    if (kv.is_string()) {
      config.erase("num_key_value_heads");
    } else {
      config["num_key_value_heads"] = kv;
    }
    StatusOr<Graph> g = Build(config);
    EXPECT_TRUE(g.ok()) << g.status().ToString();
    for (const Tensor& t : g->tensors) {
      if (t.name == "model.layers.0.self_attn.k_proj.weight") return t.shape[0];
    }
    return int64_t{-1};
  };
  // head_dim 8: k_proj's rows are kv_heads * 8.
  EXPECT_EQ(kv_width("llama", "absent"), 32 * 8);
  EXPECT_EQ(kv_width("mistral", "absent"), 8 * 8);
  EXPECT_EQ(kv_width("qwen2", "absent"), 32 * 8);
  EXPECT_EQ(kv_width("mistral", nullptr), 32 * 8);
  EXPECT_EQ(kv_width("qwen2", 4), 4 * 8);
}

TEST(HfConfigTest, SeqIsRequiredAndBounded) {
  StatusOr<Graph> none = Build(Small("llama"), 0);
  EXPECT_NE(none.status().message().find("model.hf_config.seq: required"), std::string::npos);
  StatusOr<Graph> negative = Build(Small("llama"), -5);
  EXPECT_NE(negative.status().message().find("model.hf_config.seq: must be from 1"),
            std::string::npos);
}

TEST(HfConfigTest, QwenSlidingWindowLayersAreRefused) {
  nlohmann::json config = Small("qwen2");
  config["use_sliding_window"] = true;
  StatusOr<Graph> g = Build(config);
  EXPECT_NE(g.status().message().find("model.hf_config.config.use_sliding_window: true is not "
                                      "modelled"),
            std::string::npos)
      << g.status().message();
}

TEST(HfConfigTest, NotAnObjectIsRefused) {
  StatusOr<Graph> g = Build(nlohmann::json::array({1, 2}));
  EXPECT_NE(g.status().message().find("model.hf_config.config: must be the object of a "
                                      "config.json, got a list"),
            std::string::npos);
}

// A deep config is refused by its op count before it is built.
TEST(HfConfigTest, DeepConfigIsRefusedBeforeItIsBuilt) {
  nlohmann::json config = Small("llama");
  config["num_hidden_layers"] = 16'000'000;
  StatusOr<Graph> g = Build(config);
  EXPECT_EQ(g.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(g.status().message().find("model.hf_config.config.num_hidden_layers: a llama config "
                                      "with 16000000 layers expands to"),
            std::string::npos)
      << g.status().message();
}

TEST(HfConfigTest, RunHintsReadTheDtypeAndAttention) {
  nlohmann::json config = Small("llama");
  config["torch_dtype"] = "bfloat16";
  config["_attn_implementation"] = "flash_attention_2";
  StatusOr<HfRunHints> hints = HfConfigRunHints(FromJson(config), true, true);
  ASSERT_TRUE(hints.ok());
  EXPECT_EQ(hints->dtype, DType::kBFloat16);
  EXPECT_EQ(hints->attention, AttentionImpl::kFlash);
  config["dtype"] = "float16";  // transformers >= 4.56 writes dtype, which wins
  EXPECT_EQ(HfConfigRunHints(FromJson(config), true, true)->dtype, DType::kFloat16);
  config["torch_dtype"] = "int8";
  config.erase("dtype");
  EXPECT_NE(HfConfigRunHints(FromJson(config), true, true).status().message().find(
                "model.hf_config.config.torch_dtype: unknown 'int8'"),
            std::string::npos);
  // A request that sets the precision does not read torch_dtype.
  EXPECT_TRUE(HfConfigRunHints(FromJson(config), false, true).ok());
}

}  // namespace
}  // namespace memest
