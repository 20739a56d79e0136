// Quantized checkpoints served by vLLM (engine/passes/served_quantize.h): weights, profile peak
// and KV-cache tokens against vLLM 0.19.0's startup logs on H100-80GB (llm-d-planner's,
// docs/serving.md "Quantized checkpoints"), what each format keeps per linear, and refusals.
#include <gtest/gtest.h>

#include <functional>
#include <ostream>
#include <string>

#include "engine/estimator.h"
#include "tests/engine/hf_json.h"

namespace memest {
namespace {

using enginetest::HfModel;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

RunConfig Served(WeightFormat format, Precision precision = Precision::kBf16Pure) {
  RunConfig c;
  c.mode = Mode::kInference;
  c.precision = precision;
  c.device = "h100-80gb";
  c.serving.enabled = true;
  c.serving.gpu_memory_utilization = 0.95;
  c.serving.max_model_len = 8192;
  c.quantization.format = format;
  return c;
}

QuantizationConfig Fp8Dynamic() {  // llm-compressor's FP8-dynamic: channel scales, token inputs
  QuantizationConfig q;
  q.format = WeightFormat::kW8A8Fp8;
  return q;
}
QuantizationConfig Fp8Online() {  // vLLM's --quantization fp8: one scale a weight and an input
  QuantizationConfig q;
  q.format = WeightFormat::kW8A8Fp8;
  q.weight_scales = ScaleGranularity::kTensor;
  q.inputs = InputQuantization::kDynamicTensor;
  return q;
}
QuantizationConfig Int8() {  // llm-compressor's W8A8 int8: channel scales, token inputs
  QuantizationConfig q;
  q.format = WeightFormat::kW8A8Int8;
  return q;
}
QuantizationConfig Gptq4() {  // a GPTQ W4A16 checkpoint, group 128, symmetric, no act-order
  QuantizationConfig q;
  q.format = WeightFormat::kW4A16;
  q.gptq_layout = true;
  return q;
}

// A startup log of vLLM 0.19.0 serving a quantized checkpoint: `vllm serve MODEL
// --gpu-memory-utilization 0.95 --max-model-len 8192 [-tp N] [--dtype float16]` on H100-80GB.
struct Logged {
  const char* what;
  const char* config;
  QuantizationConfig (*quantization)();
  int64_t tensor;
  bool fp16;
  double weights_gib;
  double peak_gib;
  int64_t kv_tokens;
};

void PrintTo(const Logged& l, std::ostream* os) { *os << l.what; }

class QuantizedLogTest : public testing::TestWithParam<Logged> {};

TEST_P(QuantizedLogTest, MatchesTheStartupLog) {
  const Logged& l = GetParam();
  RunConfig c = Served(WeightFormat::kDense, l.fp16 ? Precision::kFp16Pure : Precision::kBf16Pure);
  c.quantization = l.quantization();
  c.parallelism.tensor = l.tensor;
  StatusOr<Report> r = Estimate(HfModel(l.config), c);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_TRUE(r->serving);
  const ServingReport& s = *r->serving;
  EXPECT_NEAR(s.weights_bytes / kGiB, l.weights_gib, 0.05) << l.what;
  EXPECT_NEAR(s.activation_peak_bytes / kGiB, l.peak_gib, 0.05) << l.what;
  const double ratio = static_cast<double>(s.kv_tokens) / static_cast<double>(l.kv_tokens);
  EXPECT_LE(ratio, 1.001) << l.what << ": " << s.kv_tokens << " tokens, logged " << l.kv_tokens;
  EXPECT_GE(ratio, 0.995) << l.what << ": " << s.kv_tokens << " tokens, logged " << l.kv_tokens;
  EXPECT_TRUE(s.starts) << s.refusal;
}

INSTANTIATE_TEST_SUITE_P(
    H100, QuantizedLogTest,
    testing::Values(
        Logged{"RedHatAI/Qwen2.5-7B-Instruct-fp8-dynamic", "qwen2.5-7b", Fp8Dynamic, 1, false,
               8.14, 2.21, 1'210'304},
        Logged{"RedHatAI/Qwen2.5-7B-Instruct-quantized.w8a8", "qwen2.5-7b", Int8, 1, false,
               8.14, 2.21, 1'210'272},
        Logged{"Llama-3.1-8B-Instruct --quantization fp8", "llama-3.1-8b", Fp8Online, 1, false,
               8.49, 1.89, 529'248},
        Logged{"RedHatAI/Meta-Llama-3.1-8B-Instruct-quantized.w8a8 --dtype float16",
               "llama-3.1-8b", Int8, 1, true, 8.49, 1.89, 529'200},
        Logged{"RedHatAI/Meta-Llama-3.1-8B-Instruct-quantized.w4a16 --dtype float16",
               "llama-3.1-8b", Gptq4, 1, true, 5.38, 1.89, 554'704},
        Logged{"RedHatAI/Llama-3.3-70B-Instruct-fp8-dynamic -tp 2", "llama-3.3-70b", Fp8Dynamic,
               2, false, 33.88, 1.96, 244'304},
        Logged{"RedHatAI/Llama-3.3-70B-Instruct-fp8-dynamic -tp 4", "llama-3.3-70b", Fp8Dynamic,
               4, false, 16.96, 1.97, 708'992},
        Logged{"redhatai/Llama-3.3-70B-Instruct-quantized.w8a8 -tp 2", "llama-3.3-70b", Int8, 2,
               false, 33.88, 1.96, 244'304}));

// What each format keeps beside its weights, from the report's parameter bytes: the same
// model's weights differ by exactly the linears' storage, each tensor as the caching allocator
// rounds it (to 512 bytes).
TEST(ServedQuantizeTest, EachFormatKeepsWhatVllmKeeps) {
  auto weights = [](const QuantizationConfig& q) {
    RunConfig c = Served(WeightFormat::kDense);
    c.quantization = q;
    StatusOr<Report> r = Estimate(HfModel("qwen2.5-0.5b"), c);
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.ok() ? r->serving->weights_bytes : 0;
  };
  auto block = [](int64_t bytes) { return (bytes + 511) / 512 * 512; };
  // Qwen2.5-0.5B's 24 layers, [out, in]: q and o [896, 896], k and v [128, 896], gate and up
  // [4864, 896], down [896, 4864]; the tied lm_head stays dense. `per` gives a linear's bytes.
  auto layers = [&](const std::function<int64_t(int64_t, int64_t)>& per) {
    const int64_t shapes[][2] = {{896, 896}, {128, 896}, {128, 896}, {896, 896},
                                 {4864, 896}, {4864, 896}, {896, 4864}};
    int64_t sum = 0;
    for (const auto& s : shapes) sum += per(s[0], s[1]);
    return 24 * sum;
  };
  const int64_t dense = weights(QuantizationConfig{});
  const int64_t bf16 = layers([&](int64_t o, int64_t i) { return block(2 * o * i); });
  EXPECT_EQ(dense - weights(Fp8Dynamic()),
            bf16 - layers([&](int64_t o, int64_t i) { return block(o * i) + block(4 * o); }));
  QuantizationConfig tensor = Fp8Dynamic();
  tensor.weight_scales = ScaleGranularity::kTensor;
  EXPECT_EQ(dense - weights(tensor),
            bf16 - layers([&](int64_t o, int64_t i) { return block(o * i) + block(4); }));
  QuantizationConfig asym = Int8();
  asym.asymmetric_inputs = true;  // azp_adj: int32 per output channel
  EXPECT_EQ(weights(asym) - weights(Int8()),
            layers([&](int64_t o, int64_t) { return block(4 * o); }));
  // W4A16 on H100 (Machete): half a byte a value, bf16 scales per 128 inputs, and AWQ's zero
  // points pre-scaled in bf16 as well.
  QuantizationConfig w4;
  w4.format = WeightFormat::kW4A16;
  auto scales = [&](int64_t o, int64_t i) { return block(2 * (i / 128) * o); };
  EXPECT_EQ(dense - weights(w4), bf16 - layers([&](int64_t o, int64_t i) {
                                   return block(o * i / 2) + scales(o, i);
                                 }));
  QuantizationConfig awq = w4;
  awq.zero_point = true;
  EXPECT_EQ(weights(awq) - weights(w4), layers(scales));
}

TEST(ServedQuantizeTest, RefusesWhatVllmRefuses) {
  struct Case {
    const char* field;
    const char* device;
    void (*edit)(RunConfig*);
  };
  const Case cases[] = {
      {"config.quantization.format", "h100-80gb",
       [](RunConfig* c) { c->serving = ServingConfig{}; }},
      {"config.quantization.format", "h100-80gb",
       [](RunConfig* c) { c->quantization.format = WeightFormat::kBnbNf4; }},
      {"config.quantization.format", "v100-32gb", [](RunConfig* c) {  // sm_75 and later
         c->precision = Precision::kFp16Pure;
       }},
      {"config.quantization: no vLLM kernel", "a100-80gb", [](RunConfig* c) {
         c->quantization.format = WeightFormat::kW8A16;  // Marlin's zero points are 4-bit
         c->quantization.zero_point = true;
       }},
      {"config.quantization.group_size", "h100-80gb", [](RunConfig* c) {
         c->quantization.group_size = 96;
       }},
      {"config.quantization.group_size", "h100-80gb", [](RunConfig* c) {
         c->quantization.group_size = 0;
       }},
      {"config.quantization.act_order", "h100-80gb", [](RunConfig* c) {
         c->quantization.group_size = -1;
         c->quantization.act_order = true;
       }},
      {"config.quantization.weight_scales", "h100-80gb", [](RunConfig* c) {
         c->quantization.weight_scales = ScaleGranularity::kTensor;
       }},
      {"config.quantization.skip_modules[0]", "h100-80gb", [](RunConfig* c) {
         c->quantization.skip_modules = {"no_such_proj"};
       }},
      {"config.quantization.skip_modules[1]", "h100-80gb", [](RunConfig* c) {
         c->quantization.skip_modules = {"re:.*mlp\\.down_proj$", "re:(a+)+b"};
       }},
  };
  for (const Case& k : cases) {
    RunConfig c = Served(WeightFormat::kW4A16);
    c.device = k.device;
    k.edit(&c);
    StatusOr<Report> r = Estimate(HfModel("llama-3.1-8b"), c);
    ASSERT_FALSE(r.ok()) << k.field;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << k.field;
    EXPECT_EQ(r.status().message().rfind(k.field, 0), 0u) << r.status().message();
  }
}

// Before sm_89 vLLM runs fp8 weight-only through Marlin: the same bytes a value, scales per
// channel in the model's dtype, the inputs unquantized.
TEST(ServedQuantizeTest, Fp8BeforeAdaRunsThroughMarlin) {
  RunConfig c = Served(WeightFormat::kW8A8Fp8);
  c.device = "a100-80gb";
  StatusOr<Report> fp8 = Estimate(HfModel("llama-3.1-8b"), c);
  ASSERT_TRUE(fp8.ok()) << fp8.status().message();
  c.device = "h100-80gb";
  StatusOr<Report> h100 = Estimate(HfModel("llama-3.1-8b"), c);
  ASSERT_TRUE(h100.ok()) << h100.status().message();
  // Per linear, float32 scales per channel on H100, bf16 ones (and Marlin's 108-SM int32
  // workspace) on the A100: 7 linears a layer, 32 layers.
  const int64_t channels = 4096 + 1024 + 1024 + 4096 + 14336 + 14336 + 4096;
  EXPECT_EQ(h100->serving->weights_bytes - fp8->serving->weights_bytes,
            32 * (2 * channels - 7 * 512));
}

// 8-bit per-channel weights on an A100 run through AllSpark, whose kept workspace holds the
// largest merged layer dequantized for cuBLAS past 1024 tokens: gate_up, 4096 x 28672 halves.
TEST(ServedQuantizeTest, AllSparkKeepsItsDequantizationWorkspace) {
  RunConfig c = Served(WeightFormat::kW8A16);
  c.device = "a100-80gb";
  c.quantization.group_size = -1;
  StatusOr<Report> allspark = Estimate(HfModel("llama-3.1-8b"), c);
  ASSERT_TRUE(allspark.ok()) << allspark.status().message();
  bool named = false;
  for (const std::string& n : allspark->notes) named = named || n.find("allspark") != std::string::npos;
  EXPECT_TRUE(named);
  c.quantization.group_size = 128;  // grouped: Marlin, no such workspace
  StatusOr<Report> marlin = Estimate(HfModel("llama-3.1-8b"), c);
  ASSERT_TRUE(marlin.ok()) << marlin.status().message();
  EXPECT_GE(allspark->serving->activation_peak_bytes - marlin->serving->activation_peak_bytes,
            int64_t{2} * 4096 * 28672 - (int64_t{64} << 20));
}

// With act-order, a row-parallel shard keeps the whole layer's groups of scales
// (marlin_repeat_scales_on_all_ranks): Llama-3.3-70B at TP 4 on A100s.
TEST(ServedQuantizeTest, ActOrderKeepsEveryGroupOnEachRank) {
  RunConfig c = Served(WeightFormat::kW4A16);
  c.device = "a100-80gb";
  c.parallelism.tensor = 4;
  c.quantization.gptq_layout = true;
  StatusOr<Report> plain = Estimate(HfModel("llama-3.3-70b"), c);
  c.quantization.act_order = true;
  StatusOr<Report> ordered = Estimate(HfModel("llama-3.3-70b"), c);
  ASSERT_TRUE(plain.ok() && ordered.ok());
  // o_proj [8192, 8192 / 4] and down_proj [8192, 28672 / 4] per rank: 3/4 of their groups
  // more, bf16, 80 layers; and g_idx with its sorting indices for every linear.
  const int64_t extra_scales = int64_t{80} * 8192 * 2 * (8192 + 28672) / 128 * 3 / 4;
  EXPECT_GE(ordered->serving->weights_bytes - plain->serving->weights_bytes, extra_scales);
}

TEST(ServedQuantizeTest, SkippedModulesStayDense) {
  RunConfig c = Served(WeightFormat::kW8A8Fp8);
  StatusOr<Report> all = Estimate(HfModel("llama-3.1-8b"), c);
  c.quantization.skip_modules = {"re:.*mlp\\.down_proj$"};
  StatusOr<Report> skipped = Estimate(HfModel("llama-3.1-8b"), c);
  ASSERT_TRUE(all.ok() && skipped.ok());
  // 32 down_proj [4096, 14336] in bf16 instead of fp8 with a float32 scale per channel.
  EXPECT_EQ(skipped->serving->weights_bytes - all->serving->weights_bytes,
            int64_t{32} * (4096 * 14336 - 4 * 4096));
}

}  // namespace
}  // namespace memest
