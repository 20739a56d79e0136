// A config.json's quantization_config (engine/models/hf_quantization.h): the blocks of real
// quantized checkpoints read as config.quantization, estimated whole, and refused where memest
// does not model them.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <string>

#include "engine/estimator.h"
#include "engine/models/hf_quantization.h"
#include "engine/plan/planner.h"
#include "tests/engine/hf_json.h"

namespace memest {
namespace {

using enginetest::FromJson;
using enginetest::ReadConfig;

// The quantization_config blocks of published checkpoints' config.json.
// RedHatAI/Qwen2.5-7B-Instruct-FP8-dynamic (llm-compressor, compressed-tensors).
constexpr const char* kFp8Dynamic = R"({
  "config_groups": {"group_0": {
    "input_activations": {"actorder": null, "block_structure": null, "dynamic": true,
      "group_size": null, "num_bits": 8, "observer": null, "observer_kwargs": {},
      "strategy": "token", "symmetric": true, "type": "float"},
    "output_activations": null, "targets": ["Linear"],
    "weights": {"actorder": null, "block_structure": null, "dynamic": false, "group_size": null,
      "num_bits": 8, "observer": "minmax", "observer_kwargs": {}, "strategy": "channel",
      "symmetric": true, "type": "float"}}},
  "format": "float-quantized", "ignore": ["lm_head"], "kv_cache_scheme": null,
  "quant_method": "compressed-tensors", "quantization_status": "compressed"})";
// RedHatAI/Qwen2.5-7B-Instruct-quantized.w8a8.
constexpr const char* kW8A8Int8 = R"({
  "config_groups": {"group_0": {
    "input_activations": {"dynamic": true, "num_bits": 8, "strategy": "token",
      "symmetric": true, "type": "int"},
    "output_activations": null, "targets": ["Linear"],
    "weights": {"dynamic": false, "num_bits": 8, "strategy": "channel", "symmetric": true,
      "type": "int"}}},
  "format": "int-quantized", "ignore": ["lm_head"], "quant_method": "compressed-tensors"})";
// A GPTQ W4A16 checkpoint (AutoGPTQ / GPTQModel's quantize_config).
constexpr const char* kGptq = R"({"bits": 4, "damp_percent": 0.01, "desc_act": false,
  "group_size": 128, "model_file_base_name": null, "model_name_or_path": null,
  "quant_method": "gptq", "static_groups": false, "sym": true, "true_sequential": true})";
// hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4 (AutoAWQ).
constexpr const char* kAwq = R"({"bits": 4, "group_size": 128, "modules_to_not_convert": null,
  "quant_method": "awq", "version": "gemm", "zero_point": true})";
// Qwen/Qwen3-8B-FP8 (block-wise fp8).
constexpr const char* kFp8Block = R"({"activation_scheme": "dynamic", "fmt": "e4m3",
  "quant_method": "fp8", "weight_block_size": [128, 128]})";
// unsloth's bnb-4bit checkpoints (transformers' BitsAndBytesConfig.to_dict()).
constexpr const char* kBnb = R"({"_load_in_4bit": true, "_load_in_8bit": false,
  "bnb_4bit_compute_dtype": "bfloat16", "bnb_4bit_quant_storage": "uint8",
  "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": true,
  "llm_int8_enable_fp32_cpu_offload": false, "llm_int8_has_fp16_weight": false,
  "llm_int8_skip_modules": null, "llm_int8_threshold": 6.0, "load_in_4bit": true,
  "load_in_8bit": false, "quant_method": "bitsandbytes"})";
// An 8-bit checkpoint's (BitsAndBytesConfig(load_in_8bit=True).to_dict(): the 4-bit keys at
// their defaults, unread).
constexpr const char* kBnb8 = R"({"_load_in_4bit": false, "_load_in_8bit": true,
  "bnb_4bit_compute_dtype": "float32", "bnb_4bit_quant_storage": "uint8",
  "bnb_4bit_quant_type": "fp4", "bnb_4bit_use_double_quant": false,
  "llm_int8_enable_fp32_cpu_offload": false, "llm_int8_has_fp16_weight": false,
  "llm_int8_skip_modules": ["lm_head", "mlp.down_proj"], "llm_int8_threshold": 5.5,
  "load_in_4bit": false, "load_in_8bit": true, "quant_method": "bitsandbytes"})";

JsonValue With(const std::string& config, const std::string& block) {
  nlohmann::json j = ReadConfig(config);
  j["quantization_config"] = nlohmann::json::parse(block);
  return FromJson(j);
}

QuantizationConfig Read(const std::string& block) {
  StatusOr<QuantizationConfig> q = HfConfigQuantization(With("llama-3.1-8b", block));
  EXPECT_TRUE(q.ok()) << q.status().message();
  return q.ok() ? *q : QuantizationConfig{};
}

TEST(HfQuantizationTest, ReadsPublishedCheckpoints) {
  QuantizationConfig fp8 = Read(kFp8Dynamic);
  EXPECT_EQ(fp8.format, WeightFormat::kW8A8Fp8);
  EXPECT_EQ(fp8.weight_scales, ScaleGranularity::kChannel);
  EXPECT_EQ(fp8.inputs, InputQuantization::kDynamicToken);
  EXPECT_EQ(fp8.skip_modules, std::vector<std::string>{"lm_head"});
  QuantizationConfig int8 = Read(kW8A8Int8);
  EXPECT_EQ(int8.format, WeightFormat::kW8A8Int8);
  EXPECT_FALSE(int8.asymmetric_inputs);
  QuantizationConfig gptq = Read(kGptq);
  EXPECT_EQ(gptq.format, WeightFormat::kW4A16);
  EXPECT_EQ(gptq.group_size, 128);
  EXPECT_TRUE(gptq.gptq_layout);
  EXPECT_FALSE(gptq.zero_point || gptq.act_order);
  QuantizationConfig awq = Read(kAwq);
  EXPECT_EQ(awq.format, WeightFormat::kW4A16);
  EXPECT_TRUE(awq.zero_point);
  EXPECT_FALSE(awq.gptq_layout);
  QuantizationConfig block = Read(kFp8Block);
  EXPECT_EQ(block.weight_scales, ScaleGranularity::kBlock);
  EXPECT_EQ(block.block_n, 128);
  EXPECT_EQ(block.block_k, 128);
  QuantizationConfig bnb = Read(kBnb);
  EXPECT_EQ(bnb.format, WeightFormat::kBnbNf4);
  EXPECT_TRUE(bnb.double_quant);
  EXPECT_EQ(bnb.compute_dtype, DType::kBFloat16);
  QuantizationConfig bnb8 = Read(kBnb8);
  EXPECT_EQ(bnb8.format, WeightFormat::kBnbInt8);
  EXPECT_EQ(bnb8.int8_threshold, 5.5);
  EXPECT_EQ(bnb8.skip_modules, (std::vector<std::string>{"lm_head", "mlp.down_proj"}));
  EXPECT_FALSE(bnb8.double_quant);
  EXPECT_EQ(bnb8.compute_dtype, DType::kFloat32);
}

RunConfig Served() {
  RunConfig c;
  c.mode = Mode::kInference;
  c.precision = Precision::kBf16Pure;
  c.device = "h100-80gb";
  c.serving.enabled = true;
  c.serving.gpu_memory_utilization = 0.95;
  c.serving.max_model_len = 8192;
  return c;
}

// A quantized config estimates as the dense config with the same config.quantization.
TEST(HfQuantizationTest, AConfigEstimatesAsItsQuantization) {
  for (const char* block : {kFp8Dynamic, kW8A8Int8, kGptq, kAwq, kFp8Block}) {
    ModelSpec quantized;
    quantized.source = HfConfigSpec{With("qwen2.5-7b", block), 0};
    StatusOr<Report> a = Estimate(quantized, Served());
    ASSERT_TRUE(a.ok()) << a.status().message();
    ModelSpec dense;
    dense.source = HfConfigSpec{FromJson(ReadConfig("qwen2.5-7b")), 0};
    RunConfig c = Served();
    c.quantization = Read(block);
    StatusOr<Report> b = Estimate(dense, c);
    ASSERT_TRUE(b.ok()) << b.status().message();
    EXPECT_EQ(a->serving->weights_bytes, b->serving->weights_bytes) << block;
    EXPECT_EQ(a->serving->kv_tokens, b->serving->kv_tokens) << block;
    EXPECT_EQ(a->notes.back().rfind("quantization ", 0), 0u) << a->notes.back();
  }
  // A bnb-4bit checkpoint fine-tuned with QLoRA: its quantization as --quantize bnb-nf4's.
  ModelSpec bnb;
  bnb.source = HfConfigSpec{With("llama-3.2-1b", kBnb), 128};
  RunConfig train;
  train.mode = Mode::kTraining;
  train.precision = Precision::kBf16Pure;
  train.device = "rtx-4090";
  train.lora.rank = 16;
  train.lora.target_modules = {"q_proj", "v_proj"};
  StatusOr<Report> r = Estimate(bnb, train);
  ASSERT_TRUE(r.ok()) << r.status().message();
}

// The planner plans a bnb-4bit checkpoint's config as its quantization (QLoRA of Llama-3.2-1B).
TEST(HfQuantizationTest, APlanUsesTheCheckpointsQuantization) {
  auto plans = [](const ModelSpec& model, const QuantizationConfig& q) {
    PlanQuery query;
    query.model = model;
    query.run.mode = Mode::kTraining;
    query.run.precision = Precision::kBf16Pure;
    query.run.batch_size = 4;
    query.run.device = "rtx-4090";
    query.run.quantization = q;
    query.run.lora.rank = 16;
    query.run.lora.target_modules = {"q_proj", "v_proj"};
    query.max_gpus = 2;
    std::vector<Plan> out;
    Budget unlimited;
    Status s = PlanJob(query, &unlimited, [&](const Plan& p) {
      out.push_back(p);
      return true;
    });
    EXPECT_TRUE(s.ok()) << s.message();
    return out;
  };
  ModelSpec checkpoint;
  checkpoint.source = HfConfigSpec{With("llama-3.2-1b", kBnb), 512};
  ModelSpec dense;
  dense.source = HfConfigSpec{FromJson(ReadConfig("llama-3.2-1b")), 512};
  const std::vector<Plan> a = plans(checkpoint, QuantizationConfig{});
  const std::vector<Plan> b = plans(dense, Read(kBnb));
  ASSERT_FALSE(a.empty());
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].required_bytes, b[i].required_bytes);
}

TEST(HfQuantizationTest, RefusesWhatIsNotModelled) {
  struct Case {
    const char* block;
    const char* field;
  };
  const Case cases[] = {
      {R"({"quant_method": "gguf"})", "quant_method"},
      {R"({"bits": 4})", "quant_method"},
      {R"({"quant_method": "gptq", "bits": 3, "group_size": 128, "sym": true, "desc_act": false})",
       "bits"},
      {R"({"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": true, "desc_act": false,
           "lm_head": true})", "lm_head"},
      {R"({"quant_method": "gptq", "bits": 4, "group_size": 0, "sym": true, "desc_act": false})",
       "group_size"},
      // vLLM runs these with GPTQ's or AWQ's own dequantizing kernels, not Marlin's.
      {R"({"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": false, "desc_act": false})",
       "sym"},
      {R"({"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": true})", "desc_act"},
      {R"({"quant_method": "gptq", "bits": 4, "group_size": 256, "sym": true, "desc_act": false})",
       "group_size"},
      {R"({"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": true, "desc_act": false,
           "dynamic": {"-:.*mlp.*": {}}})", "dynamic"},
      {R"({"quant_method": "awq", "bits": 8, "group_size": 128, "zero_point": true})", "bits"},
      {R"({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": false})",
       "zero_point"},
      {R"({"quant_method": "awq", "w_bit": 4, "q_group_size": 128, "zero_point": true})", "bits"},
      {R"({"quant_method": "compressed-tensors", "format": "marlin-24", "config_groups": {"g":
           {"weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128}}}})",
       "format"},
      {R"({"quant_method": "compressed-tensors", "config_groups": {"g": {"targets": ["Attention"],
           "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128}}}})",
       "config_groups.g.targets"},
      {R"({"quant_method": "compressed-tensors", "ignore": ["re:.*layers\\.[0-3]\\..*"],
           "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int", "strategy": "group",
           "group_size": 128}}}})", "ignore[0]"},
      {R"({"quant_method": "compressed-tensors", "config_groups": {"g": {"weights":
           {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128},
           "input_activations": {"num_bits": 8, "type": "int", "strategy": "token",
           "dynamic": true}}}})", "config_groups.g.weights.num_bits"},
      {R"({"quant_method": "fp8", "activation_scheme": "sometimes"})", "activation_scheme"},
      {R"({"quant_method": "fp8", "weight_block_size": [128]})", "weight_block_size"},
      {R"({"quant_method": "bitsandbytes", "load_in_8bit": true, "load_in_4bit": true})",
       "load_in_4bit"},
      {R"({"quant_method": "bitsandbytes"})", "load_in_4bit"},
      {R"({"quant_method": "bitsandbytes", "load_in_8bit": true,
           "llm_int8_has_fp16_weight": true})", "llm_int8_has_fp16_weight"},
      {R"({"quant_method": "bitsandbytes", "load_in_8bit": true, "llm_int8_threshold": -1})",
       "llm_int8_threshold"},
      {R"({"quant_method": "compressed-tensors"})", "config_groups"},
      {R"({"quant_method": "compressed-tensors", "sparsity_config": {"format": "sparse-24"},
           "config_groups": {}})", "sparsity_config"},
      {R"({"quant_method": "compressed-tensors", "config_groups": {"g": {"weights":
           {"num_bits": 2, "type": "int", "strategy": "channel"}}}})",
       "config_groups.g.weights.num_bits"},
      {R"({"quant_method": "compressed-tensors", "config_groups": {
           "a": {"weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128}},
           "b": {"weights": {"num_bits": 8, "type": "int", "strategy": "channel"}}}})",
       "config_groups.b"},
      {R"({"quant_method": "compressed-tensors", "ignore": "lm_head", "config_groups": {"g":
           {"weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128}}}})",
       "ignore"},
  };
  for (const Case& k : cases) {
    ModelSpec m;
    m.source = HfConfigSpec{With("llama-3.1-8b", k.block), 0};
    StatusOr<Report> r = Estimate(m, Served());
    ASSERT_FALSE(r.ok()) << k.block;
    const std::string field = std::string("model.hf_config.config.quantization_config.") + k.field;
    EXPECT_EQ(r.status().message().rfind(field, 0), 0u) << r.status().message();
  }
  // The request may not quantize a quantized checkpoint again.
  ModelSpec m;
  m.source = HfConfigSpec{With("llama-3.1-8b", kAwq), 0};
  RunConfig c = Served();
  c.quantization.format = WeightFormat::kW8A8Fp8;
  StatusOr<Report> r = Estimate(m, c);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message().rfind("config.quantization: the checkpoint is quantized", 0), 0u);
  // Nor estimate it for training with vLLM's formats.
  RunConfig train = Served();
  train.serving = ServingConfig{};
  train.mode = Mode::kTraining;
  r = Estimate(m, train);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message().rfind("config.quantization.format", 0), 0u) << r.status().message();
}

}  // namespace
}  // namespace memest
