// T5 configs (engine/models/t5.h, engine/models/hf_encoders.h): the encoder-decoder's
// structure (the cross-attention over the encoder's output, each stack's position bias made
// once, the tied head's rescaling, the gated feed-forward) and the configurations refused,
// naming the field. Parameter counts are in hf_config_test.cc; the graph against real
// transformers in tests/conformance/hf_config_check.py.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "engine/models/hf_config.h"
#include "tests/engine/hf_json.h"
#include "tests/engine/test_graphs.h"

namespace memest {
namespace {

using enginetest::FromJson;

nlohmann::json SmallT5() {
  return {{"model_type", "t5"}, {"d_model", 64},  {"d_kv", 16},       {"d_ff", 128},
          {"num_layers", 2},    {"num_heads", 4}, {"vocab_size", 512}};
}

StatusOr<Graph> Build(const nlohmann::json& config, int64_t seq = 16) {
  return BuildHfConfig(HfConfigSpec{FromJson(config), seq}, enginetest::MakeContext(2));
}

int Count(const Graph& g, const std::string& kind, const std::string& scope_part) {
  int n = 0;
  for (const Op& op : g.ops) n += op.kind == kind && op.scope.find(scope_part) != std::string::npos;
  return n;
}

const Tensor* Named(const Graph& g, const std::string& name) {
  for (const Tensor& t : g.tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

TEST(HfT5Test, TheDecoderAttendsToTheEncodersOutput) {
  StatusOr<Graph> g = Build(SmallT5());
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  // The encoder's output: its stack's last op (the final dropout) feeds every cross-attention's
  // key and value projections.
  int encoder_out = -1;
  for (const Op& op : g->ops) {
    if (op.scope.rfind("encoder", 0) == 0) encoder_out = op.outputs[0];
  }
  int cross_inputs = 0;
  for (const Op& op : g->ops) {
    const bool kv = op.scope.find("EncDecAttention.k") != std::string::npos ||
                    op.scope.find("EncDecAttention.v") != std::string::npos;
    if (kv && op.kind == "linear") cross_inputs += op.inputs[0] == encoder_out;
  }
  EXPECT_EQ(cross_inputs, 4);  // k and v of 2 decoder blocks
  // One relative_attention_bias a stack (block 0's self-attention), looked up once; the
  // cross-attention's bias is zeros, made once; every attention adds its bias in place.
  EXPECT_NE(Named(*g, "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"),
            nullptr);
  EXPECT_NE(Named(*g, "decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"),
            nullptr);
  EXPECT_EQ(Named(*g, "encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight"),
            nullptr);
  EXPECT_EQ(Count(*g, "embedding", "relative_attention_bias"), 2);
  EXPECT_EQ(Count(*g, "add_", "Attention"), 6);  // 2 encoder, 2 decoder self, 2 cross
  EXPECT_EQ(g->blocks.size(), 4u);               // both stacks' blocks checkpoint
  // The tied head rescales the decoder's output by d_model ** -0.5 and reads shared.weight.
  EXPECT_EQ(Count(*g, "mul", "lm_head") + Count(*g, "linear", "lm_head"), 1);
  EXPECT_EQ(Named(*g, "lm_head.weight"), nullptr);
}

TEST(HfT5Test, GatedFeedForwardAndAnUntiedHead) {
  nlohmann::json flan = SmallT5();
  flan["feed_forward_proj"] = "gated-gelu";
  flan["tie_word_embeddings"] = false;
  flan["num_decoder_layers"] = 3;
  StatusOr<Graph> g = Build(flan);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_NE(Named(*g, "decoder.block.2.layer.2.DenseReluDense.wi_1.weight"), nullptr);
  EXPECT_EQ(Named(*g, "encoder.block.2.layer.0.SelfAttention.q.weight"),
            nullptr);  // 2 encoder blocks
  ASSERT_NE(Named(*g, "lm_head.weight"), nullptr);
  EXPECT_EQ(Named(*g, "lm_head.weight")->shape, (Shape{512, 64}));
  EXPECT_EQ(Count(*g, "tanh", "DenseReluDense.act"), 5);  // gelu_new in each of 5 blocks
}

// A saved config's dense_act_fn and is_gated_act win over feed_forward_proj (PretrainedConfig
// sets them after T5Config derived its own); float16 keeps wo in float32
// (_keep_in_fp32_modules), whose output promotes the residual stream.
TEST(HfT5Test, SavedActivationFieldsAndAFloat32Wo) {
  nlohmann::json t5 = SmallT5();
  t5["dense_act_fn"] = "gelu_new";
  t5["is_gated_act"] = true;
  StatusOr<Graph> g = Build(t5);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_NE(Named(*g, "encoder.block.0.layer.1.DenseReluDense.wi_0.weight"), nullptr);
  EXPECT_EQ(Count(*g, "tanh", "DenseReluDense.act"), 4);
  BuildContext half = enginetest::MakeContext(2, Mode::kTraining, DType::kFloat16);
  StatusOr<Graph> h = BuildHfConfig(HfConfigSpec{FromJson(SmallT5()), 16}, half);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(Named(*h, "encoder.block.0.layer.1.DenseReluDense.wo.weight")->dtype, DType::kFloat32);
  EXPECT_EQ(Named(*h, "encoder.block.0.layer.1.DenseReluDense.wi.weight")->dtype, DType::kFloat16);
  // The clamps run while the residual stream is float16: block 0's attention layer only.
  EXPECT_EQ(Count(*h, "clamp", "encoder.block.0"), 1);
  EXPECT_EQ(Count(*h, "clamp", "encoder.block.1"), 0);
}

TEST(HfT5Test, RefusesWhatItDoesNotBuildNamingTheField) {
  struct Case {
    const char* key;
    nlohmann::json value;
    const char* message;
  };
  const Case cases[] = {
      {"feed_forward_proj", "gated-gelu-x",
       "model.hf_config.config.feed_forward_proj: 'gated-gelu-x'"},
      {"feed_forward_proj", "relu6",
       "model.hf_config.config.feed_forward_proj: the activation 'relu6'"},
      {"is_encoder_decoder", false, "model.hf_config.config.is_encoder_decoder"},
      {"is_decoder", true, "model.hf_config.config.is_decoder"},
      {"relative_attention_num_buckets", 1,
       "model.hf_config.config.relative_attention_num_buckets"},
      {"num_decoder_layers", 0, "model.hf_config.config.num_decoder_layers"},
      {"d_kv", "sixteen", "model.hf_config.config.d_kv"},
      {"dense_act_fn", "relu6", "model.hf_config.config.dense_act_fn: the activation 'relu6'"},
      {"is_gated_act", "yes", "model.hf_config.config.is_gated_act"},
  };
  for (const Case& k : cases) {
    nlohmann::json config = SmallT5();
    config[k.key] = k.value;
    StatusOr<Graph> g = Build(config);
    ASSERT_FALSE(g.ok()) << k.key;
    EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument) << k.key;
    EXPECT_NE(g.status().message().find(k.message), std::string::npos) << g.status().message();
  }
}

}  // namespace
}  // namespace memest
