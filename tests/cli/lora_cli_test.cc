// `memest estimate` with LoRA: the --lora-* flags and PEFT's own adapter_config.json
// (--lora-config, a file or the adapter's directory) ask the same question; what the file says
// that memest does not model is refused naming the file's field.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/cli/subprocess.h"

namespace memest {
namespace {

using ::memest::testing::Run;
using ::memest::testing::RunResult;
using ::testing::HasSubstr;

const std::string kMemest = MEMEST_CLI_PATH;
const std::string kLlama = std::string(MEMEST_SOURCE_DIR) + "/tests/data/hf_configs/llama-2-7b.json";

RunResult Estimate(std::vector<std::string> lora) {
  std::vector<std::string> args = {kMemest, "estimate", "--local", "--hf-config", kLlama,
                                   "--seq", "256", "--precision", "bf16-pure", "--json",
                                   "--no-advice"};
  args.insert(args.end(), lora.begin(), lora.end());
  return Run(args);
}

std::string AdapterDir(const std::string& name, const nlohmann::json& config) {
  const std::string dir = ::testing::TempDir() + "/" + name;
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/adapter_config.json") << config.dump(1);
  return dir;
}

// What save_pretrained writes for LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05,
// target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM") (peft 0.13.2), trimmed of
// fields memest does not read.
nlohmann::json PeftAdapterConfig() {
  return {{"peft_type", "LORA"}, {"task_type", "CAUSAL_LM"}, {"r", 16}, {"lora_alpha", 32},
          {"lora_dropout", 0.05}, {"target_modules", {"v_proj", "q_proj"}},
          {"modules_to_save", nullptr}, {"bias", "none"}, {"use_dora", false},
          {"rank_pattern", nlohmann::json::object()}, {"layers_to_transform", nullptr},
          {"fan_in_fan_out", false}, {"init_lora_weights", true}};
}

TEST(LoraCliTest, FlagsAndAdapterConfigAgree) {
  const RunResult flags = Estimate({"--lora-rank", "16", "--lora-alpha", "32", "--lora-dropout",
                                    "0.05", "--lora-targets", "v_proj,q_proj"});
  ASSERT_EQ(flags.exit_code, 0) << flags.err;
  const RunResult file = Estimate({"--lora-config", AdapterDir("adapter", PeftAdapterConfig())});
  ASSERT_EQ(file.exit_code, 0) << file.err;
  EXPECT_EQ(nlohmann::json::parse(flags.out), nlohmann::json::parse(file.out));
  const nlohmann::json reply = nlohmann::json::parse(file.out);
  EXPECT_EQ(reply.at("trainableParameterCount"), "8388608");
  // A flag overrides the file's field.
  const RunResult rank8 = Estimate({"--lora-config", AdapterDir("adapter", PeftAdapterConfig()),
                                    "--lora-rank", "8"});
  ASSERT_EQ(rank8.exit_code, 0) << rank8.err;
  EXPECT_EQ(nlohmann::json::parse(rank8.out).at("trainableParameterCount"), "4194304");
}

// DoRA from the adapter's config or the flag: a magnitude per output feature trains too.
TEST(LoraCliTest, DoraFromTheConfigOrTheFlag) {
  nlohmann::json config = PeftAdapterConfig();
  config["use_dora"] = true;
  const RunResult file = Estimate({"--lora-config", AdapterDir("dora", config)});
  ASSERT_EQ(file.exit_code, 0) << file.err;
  EXPECT_EQ(nlohmann::json::parse(file.out).at("trainableParameterCount"), "8650752");
  const RunResult flag = Estimate({"--lora-config", AdapterDir("adapter", PeftAdapterConfig()),
                                   "--lora-use-dora"});
  ASSERT_EQ(flag.exit_code, 0) << flag.err;
  EXPECT_EQ(nlohmann::json::parse(flag.out).at("trainableParameterCount"), "8650752");
}

TEST(LoraCliTest, RefusesWhatItDoesNotModelNamingTheField) {
  struct Case {
    const char* field;
    nlohmann::json value;
    const char* message;
  } cases[] = {
      {"layers_to_transform", {0, 1}, "layers_to_transform: set, and memest models plain LoRA"},
      {"bias", "all", "bias: 'all' trains the base model's biases"},
      {"target_modules", ".*q_proj", "target_modules: '.*q_proj' is a regular expression"},
      {"peft_type", "IA3", "peft_type: 'IA3'; memest models LoRA adapters"},
      {"r", "sixteen", "r: the adapters' rank (a number) is required"},
      {"rank_pattern", {{"q_proj", 4}}, "rank_pattern: set"},
  };
  for (const Case& c : cases) {
    nlohmann::json config = PeftAdapterConfig();
    config[c.field] = c.value;
    const RunResult r = Estimate({"--lora-config", AdapterDir(c.field, config)});
    EXPECT_EQ(r.exit_code, 3) << c.field;
    EXPECT_THAT(r.err, HasSubstr(c.message)) << r.err;
  }
  const RunResult no_rank = Estimate({"--lora-targets", "q_proj"});
  EXPECT_EQ(no_rank.exit_code, 3);
  EXPECT_THAT(no_rank.err, HasSubstr("--lora-rank: required"));
  const RunResult no_file = Estimate({"--lora-config", ::testing::TempDir()});
  EXPECT_EQ(no_file.exit_code, 3);
  EXPECT_THAT(no_file.err, HasSubstr("the directory has no adapter_config.json"));
}

// QLoRA: the 4-bit base under the adapters; the --bnb-* flags need --quantize.
TEST(LoraCliTest, QuantizeFlagsStoreTheBaseIn4Bits) {
  const RunResult dense = Estimate({"--lora-rank", "16", "--lora-targets", "q_proj,v_proj"});
  const RunResult nf4 = Estimate({"--lora-rank", "16", "--lora-targets", "q_proj,v_proj",
                                  "--quantize", "bnb-nf4", "--bnb-double-quant",
                                  "--bnb-compute-dtype", "bfloat16"});
  ASSERT_EQ(dense.exit_code, 0) << dense.err;
  ASSERT_EQ(nf4.exit_code, 0) << nf4.err;
  const auto parameters = [](const RunResult& r) {
    return std::stoll(nlohmann::json::parse(r.out).at("endOfStep").at("parameters").get<std::string>());
  };
  EXPECT_LT(parameters(nf4), parameters(dense) / 2);
  EXPECT_EQ(nlohmann::json::parse(nf4.out).at("parameterCount"),
            nlohmann::json::parse(dense.out).at("parameterCount"));
  const RunResult alone = Estimate({"--bnb-double-quant"});
  EXPECT_EQ(alone.exit_code, 3);
  EXPECT_THAT(alone.err, HasSubstr("--quantize: required"));
  const RunResult unknown = Estimate({"--quantize", "gptq"});
  EXPECT_EQ(unknown.exit_code, 3);
  EXPECT_THAT(unknown.err, HasSubstr("--quantize: unknown value \"gptq\""));
}

// LLM.int8: a byte a weight and a float32 per row; the --int8-* flags need --quantize and make
// sense with bnb-int8 only.
TEST(LoraCliTest, QuantizeInt8StoresTheBaseInABytePerWeight) {
  const RunResult dense = Estimate({"--lora-rank", "16", "--lora-targets", "q_proj,v_proj"});
  const RunResult int8 = Estimate({"--lora-rank", "16", "--lora-targets", "q_proj,v_proj",
                                   "--quantize", "bnb-int8", "--int8-outlier-columns", "32"});
  ASSERT_EQ(dense.exit_code, 0) << dense.err;
  ASSERT_EQ(int8.exit_code, 0) << int8.err;
  const auto parameters = [](const RunResult& r) {
    return std::stoll(nlohmann::json::parse(r.out).at("endOfStep").at("parameters").get<std::string>());
  };
  // float32 by default: the linears a quarter, the embeddings and the output layer as they were.
  EXPECT_LT(parameters(int8), parameters(dense) * 3 / 5);
  EXPECT_THAT(int8.out, HasSubstr("LLM.int8"));
  EXPECT_THAT(int8.out, HasSubstr("32 such columns a layer"));
  const RunResult alone = Estimate({"--int8-threshold", "4"});
  EXPECT_EQ(alone.exit_code, 3);
  EXPECT_THAT(alone.err, HasSubstr("--quantize: required"));
  const RunResult nf4 = Estimate({"--lora-rank", "16", "--lora-targets", "q_proj",
                                  "--quantize", "bnb-nf4", "--int8-threshold", "4"});
  EXPECT_EQ(nf4.exit_code, 3);
  EXPECT_THAT(nf4.err, HasSubstr("config.quantization.int8_threshold: LLM.int8's setting"));
}

// torchao's weight-only formats: inference of a bf16 model; int4 takes --quant-group-size.
TEST(LoraCliTest, QuantizeTorchaoForInference) {
  const std::vector<std::string> base = {"--mode", "inference"};  // Estimate's bf16-pure
  auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> args = base;
    args.insert(args.end(), more.begin(), more.end());
    return Estimate(args);
  };
  const RunResult dense = with({});
  const RunResult int4 = with({"--quantize", "torchao-int4", "--quant-group-size", "64"});
  const RunResult int8 = with({"--quantize", "torchao-int8"});
  ASSERT_EQ(dense.exit_code, 0) << dense.err;
  ASSERT_EQ(int4.exit_code, 0) << int4.err;
  ASSERT_EQ(int8.exit_code, 0) << int8.err;
  const auto parameters = [](const RunResult& r) {
    return std::stoll(nlohmann::json::parse(r.out).at("endOfStep").at("parameters").get<std::string>());
  };
  EXPECT_LT(parameters(int4), parameters(int8));
  EXPECT_LT(parameters(int8), parameters(dense));
  EXPECT_THAT(int4.out, HasSubstr("Int4WeightOnlyConfig, group_size 64"));
  const RunResult training = Estimate({"--quantize", "torchao-int8"});
  EXPECT_EQ(training.exit_code, 3);
  EXPECT_THAT(training.err, HasSubstr("for inference"));
}

}  // namespace
}  // namespace memest
