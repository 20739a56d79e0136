// The keys and values a Hugging Face model returns under use_cache (Graph::cache): which
// tensors each family's cache holds, and what a loop holding the model's outputs then keeps
// through backward and the optimizer step. Counted under the cpu-1.13 runtime, exactly; the
// same against real transformers in tests/conformance/hf_config_check.py --use-cache.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "engine/estimator.h"
#include "engine/models/hf_config.h"
#include "engine/models/presets.h"
#include "engine/step/python_refs.h"
#include "tests/engine/hf_json.h"
#include "tests/engine/test_graphs.h"

namespace memest {
namespace {

using enginetest::FromJson;

// hidden 64 in 4 heads of 16, 2 key/value heads: a layer's k [2, 2, 16, 16] and v_proj's
// output [2, 16, 32], float32 at batch 2 and 16 tokens: 4,096 bytes each.
nlohmann::json SmallLlama() {
  return {{"model_type", "llama"},    {"hidden_size", 64},        {"num_hidden_layers", 2},
          {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"intermediate_size", 128},
          {"vocab_size", 512}};
}
constexpr int64_t kLlamaCacheBytes = 2 * (4096 + 4096);

// d_model 64 in 4 heads of 16, 2 encoder and 2 decoder blocks.
nlohmann::json SmallT5() {
  return {{"model_type", "t5"}, {"d_model", 64},  {"d_kv", 16},       {"d_ff", 128},
          {"num_layers", 2},    {"num_heads", 4}, {"vocab_size", 512}};
}

ModelSpec Spec(const nlohmann::json& config) { return {HfConfigSpec{FromJson(config), 16}}; }

StatusOr<Graph> Build(const nlohmann::json& config, Mode mode = Mode::kTraining) {
  return BuildHfConfig(HfConfigSpec{FromJson(config), 16}, enginetest::MakeContext(2, mode));
}

// An SGD step of batch 2 on the CPU runtime (exact bytes) whose loop holds the outputs.
RunConfig Holding() {
  RunConfig c = enginetest::PlainTraining();
  c.runtime = Runtime::kCpuTorch113;
  c.batch_size = 2;
  c.hold_outputs = true;
  return c;
}

int64_t PhaseBytes(const Report& r, Phase phase) {
  for (const PeakPoint& p : r.phases) {
    if (p.phase == phase) return p.allocated_bytes;
  }
  return -1;
}

// The optimizer step's peak of `config` with the model's use_cache as given, less without it.
int64_t CacheHeldAtTheStep(nlohmann::json model, const RunConfig& config) {
  EstimateOptions quiet;
  quiet.advice = false;
  model["use_cache"] = true;
  StatusOr<Report> with = Estimate(Spec(model), config, quiet);
  model["use_cache"] = false;
  StatusOr<Report> without = Estimate(Spec(model), config, quiet);
  EXPECT_TRUE(with.ok() && without.ok());
  if (!with.ok() || !without.ok()) return -1;
  return PhaseBytes(*with, Phase::kOptimizerStep) - PhaseBytes(*without, Phase::kOptimizerStep);
}

int Base(const Graph& g, int t) {
  while (g.tensors[t].alias_of >= 0) t = g.tensors[t].alias_of;
  return t;
}

TEST(HfCacheTest, LlamaReturnsEachLayersKeyAfterTheRotaryAndItsValue) {
  StatusOr<Graph> g = Build(SmallLlama());
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  ASSERT_EQ(g->cache.size(), 4u);  // k and v of 2 layers
  for (int layer = 0; layer < 2; ++layer) {
    const std::string scope = "model.layers." + std::to_string(layer) + ".self_attn";
    const int k = g->cache[2 * layer], v = g->cache[2 * layer + 1];
    EXPECT_EQ(g->tensors[k].shape, (Shape{2, 2, 16, 16}));
    // k_embed = (k * cos) + (rotate_half(k) * sin): the rotary's add, a tensor of its own.
    const Op& made = g->ops[g->tensors[k].producer];
    EXPECT_EQ(made.kind, "add");
    EXPECT_EQ(made.scope, scope);
    EXPECT_EQ(g->tensors[k].alias_of, -1);
    // The value is v_proj's output seen as heads: the cache keeps its storage.
    const Op& projected = g->ops[g->tensors[Base(*g, v)].producer];
    EXPECT_EQ(projected.kind, "linear");
    EXPECT_EQ(projected.scope, scope + ".v_proj");
  }
}

TEST(HfCacheTest, TheLoopHoldsTheCacheThroughTheOptimizerStep) {
  const RunConfig holding = Holding();
  EXPECT_EQ(CacheHeldAtTheStep(SmallLlama(), holding), kLlamaCacheBytes);
  // The same loop in fp32 AMP: the keys come out of the rotary in float32 (cos and sin are),
  // the values of the bfloat16 v_proj: 4,096 + 2,048 bytes a layer.
  RunConfig amp = holding;
  amp.precision = Precision::kBf16Amp;
  EXPECT_EQ(CacheHeldAtTheStep(SmallLlama(), amp), 2 * (4096 + 2048));
  // A loop that lets the outputs go, and gradient checkpointing of every block (the models turn
  // use_cache off under it), hold none.
  RunConfig dropping = holding;
  dropping.hold_outputs = false;
  EXPECT_EQ(CacheHeldAtTheStep(SmallLlama(), dropping), 0);
  RunConfig checkpointed = holding;
  checkpointed.checkpoint.policy = CheckpointPolicy::kEveryBlock;
  EXPECT_EQ(CacheHeldAtTheStep(SmallLlama(), checkpointed), 0);
  // Checkpointing every sqrt(L) blocks is not gradient_checkpointing_enable(): the model's flag
  // stays off and it returns its cache.
  checkpointed.checkpoint.policy = CheckpointPolicy::kSqrtBlocks;
  EXPECT_EQ(CacheHeldAtTheStep(SmallLlama(), checkpointed), kLlamaCacheBytes);
}

TEST(HfCacheTest, ASteadyStepStartsWithThePreviousStepsCache) {
  // The previous step's outputs (logits [2, 16, 512] float32 and the cache) are there from the
  // step's start until its forward and loss have returned.
  EstimateOptions quiet;
  quiet.advice = false;
  nlohmann::json model = SmallLlama();
  StatusOr<Report> with = Estimate(Spec(model), Holding(), quiet);
  model["use_cache"] = false;
  StatusOr<Report> without = Estimate(Spec(model), Holding(), quiet);
  ASSERT_TRUE(with.ok() && without.ok());
  EXPECT_EQ(PhaseBytes(*with, Phase::kData) - PhaseBytes(*without, Phase::kData), kLlamaCacheBytes);
  RunConfig first = Holding();
  first.step = StepKind::kFirstStep;
  StatusOr<Report> first_with = Estimate(Spec(SmallLlama()), first, quiet);
  ASSERT_TRUE(first_with.ok());
  EXPECT_EQ(PhaseBytes(*with, Phase::kData) - PhaseBytes(*first_with, Phase::kData),
            2 * 16 * 512 * 4 + kLlamaCacheBytes);
}

TEST(HfCacheTest, TheNoteAndTheAdviceMeasureIt) {
  RunConfig c = Holding();
  StatusOr<Report> r = Estimate(Spec(SmallLlama()), c);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  bool noted = false;
  for (const std::string& n : r->notes) {
    noted |= n.find("of them 16.0 KiB are every layer's keys and values") != std::string::npos;
  }
  EXPECT_TRUE(noted);
  int64_t saving = -1;
  for (const Advice& a : r->advice) {
    if (a.kind == "use_cache") saving = a.saving_bytes;
  }
  // The peak is backward's, before the optimizer step: the cache is there already (k and v
  // are saved for backward), so the peak moves by what the gradients have freed of them.
  EXPECT_GT(saving, 0);
  EXPECT_LE(saving, kLlamaCacheBytes);
  nlohmann::json off = SmallLlama();
  off["use_cache"] = false;
  StatusOr<Report> without = Estimate(Spec(off), c);
  ASSERT_TRUE(without.ok());
  EXPECT_EQ(r->peak.allocated_bytes - without->peak.allocated_bytes, saving);
  for (const Advice& a : without->advice) EXPECT_NE(a.kind, "use_cache");
}

TEST(HfCacheTest, T5ReturnsTheDecodersCachesAndTheEncodersOutput) {
  const nlohmann::json t5 = SmallT5();
  StatusOr<Graph> g = Build(t5);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  // Each decoder block's self-attention and cross-attention keys and values; the encoder runs
  // with use_cache=False.
  ASSERT_EQ(g->cache.size(), 8u);
  for (int t : g->cache) {
    EXPECT_EQ(g->ops[g->tensors[Base(*g, t)].producer].scope.rfind("decoder.block.", 0), 0u);
  }
  // Seq2SeqLMOutput: the logits and encoder_last_hidden_state, the encoder stack's last output.
  ASSERT_EQ(g->outputs.size(), 2u);
  EXPECT_EQ(g->ops[g->tensors[g->outputs[0]].producer].scope, "lm_head");
  EXPECT_EQ(g->ops[g->tensors[g->outputs[1]].producer].scope.rfind("encoder", 0), 0u);
  // Cross-attention keys and values over the encoder's 16 positions, as the self-attention's:
  // 4 x [2, 16, 64] float32 a block, 2 blocks.
  EXPECT_EQ(CacheHeldAtTheStep(t5, Holding()), 2 * 4 * 8192);
}

TEST(HfCacheTest, InferenceKeepsThePromptsCacheAndRoomForTheGeneratedTokens) {
  // generate's prefill: the keys and values the forward returns (8,192 bytes a layer) and room
  // for 4 more positions ([2, 2, 4, 16] float32 for k and for v, 2,048 bytes a layer), counted
  // as kv_cache: the 20 positions' 10,240 bytes a layer that a config without use_cache gets as
  // room alone.
  RunConfig c = Holding();
  c.mode = Mode::kInference;
  c.hold_outputs = false;
  c.generate_tokens = 4;
  EstimateOptions quiet;
  quiet.advice = false;
  nlohmann::json model = SmallLlama();
  StatusOr<Report> cached = Estimate(Spec(model), c, quiet);
  model["use_cache"] = false;
  StatusOr<Report> room = Estimate(Spec(model), c, quiet);
  ASSERT_TRUE(cached.ok() && room.ok());
  const int kv = static_cast<int>(Category::kKvCache);
  // At the peak, in the last layer's MLP, every layer's keys and values are there.
  EXPECT_EQ(room->peak.by_category[kv], 2 * 10240);
  EXPECT_EQ(cached->peak.by_category[kv], 2 * 10240);
  StatusOr<Graph> g = Build(SmallLlama(), Mode::kInference);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->cache.size(), 4u);
  // T5's generation is not modelled: refused, naming the field.
  const nlohmann::json t5 = SmallT5();
  BuildContext ctx = enginetest::MakeContext(2, Mode::kInference);
  ctx.generate_tokens = 4;
  StatusOr<Graph> refused = BuildHfConfig(HfConfigSpec{FromJson(t5), 16}, ctx);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().message().rfind("config.generate_tokens: T5's generation", 0), 0u)
      << refused.status().ToString();
}

TEST(HfCacheTest, EncodersReturnNone) {
  for (const char* type : {"bert", "roberta"}) {
    nlohmann::json bert = {{"model_type", type},
                           {"hidden_size", 64},
                           {"num_hidden_layers", 2},
                           {"num_attention_heads", 4},
                           {"intermediate_size", 128},
                           {"vocab_size", 512},
                           {"max_position_embeddings", 80},
                           {"use_cache", true}};
    StatusOr<Graph> g = Build(bert);
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    EXPECT_TRUE(g->cache.empty()) << type;
  }
}

TEST(HfCacheTest, UseCacheMustBeABoolean) {
  nlohmann::json model = SmallLlama();
  model["use_cache"] = 1;
  StatusOr<Graph> g = Build(model);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("model.hf_config.config.use_cache"), std::string::npos)
      << g.status().ToString();
}

TEST(HfCacheTest, Gpt2PresetsCacheViewsOfTheFusedProjection) {
  StatusOr<Graph> g =
      BuildPreset({"gpt2-small", {{"layers", 2}, {"seq", 16}}}, enginetest::MakeContext(2));
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  ASSERT_EQ(g->cache.size(), 4u);
  // GPT2Attention's present = (key, value): split views of c_attn's output (Conv1D's addmm,
  // [2 * 16, 3 * 768]), which the cache keeps whole.
  for (int t : g->cache) {
    const Tensor& base = g->tensors[Base(*g, t)];
    EXPECT_EQ(base.shape, (Shape{2 * 16, 3 * 768}));
    EXPECT_NE(g->ops[base.producer].scope.find(".attn.c_attn"), std::string::npos);
  }
}

}  // namespace
}  // namespace memest
