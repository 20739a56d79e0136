// `memest estimate --serve`: vLLM's engine arguments as flags, its startup as the answer (in
// JSON and for a terminal), and the flags that make no sense without --serve refused.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "tests/cli/subprocess.h"

namespace memest {
namespace {

using ::memest::testing::Run;
using ::memest::testing::RunResult;
using ::testing::HasSubstr;

const std::string kMemest = MEMEST_CLI_PATH;
const std::string kLlama31 =
    std::string(MEMEST_SOURCE_DIR) + "/tests/data/hf_configs/llama-3.1-8b.json";

RunResult Serve(std::vector<std::string> flags) {
  std::vector<std::string> args = {kMemest, "estimate", "--local", "--hf-config", kLlama31,
                                   "--serve"};
  args.insert(args.end(), flags.begin(), flags.end());
  return Run(args);
}

TEST(ServingCliTest, AnswersInJsonWithVllmsNames) {
  const RunResult r = Serve({"--device", "h100-80gb", "--gpu-memory-utilization", "0.95",
                             "--max-model-len", "8192", "--kv-cache-dtype", "fp8",
                             "--concurrency", "100", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  const nlohmann::json& s = j.at("serving");
  EXPECT_EQ(s.at("kvCacheDtype"), "fp8_e4m3");
  EXPECT_EQ(s.at("maxNumSeqs"), "1024");  // int64 in the proto's JSON mapping: a string
  EXPECT_EQ(s.at("maxModelLen"), "8192");
  EXPECT_TRUE(s.at("starts").get<bool>());
  // vLLM 0.19.0 logged 952,032 tokens for this run.
  const int64_t tokens = std::stoll(s.at("kvTokens").get<std::string>());
  EXPECT_GT(tokens, 952'032 * 0.995);
  EXPECT_LE(tokens, 952'032 * 1.001);
  const int64_t blocks = std::stoll(s.at("numBlocks").get<std::string>());
  EXPECT_EQ(std::stoll(s.at("longestRequest").get<std::string>()),
            std::min<int64_t>(8192, (blocks - 1) / 100 * 16));
  EXPECT_TRUE(j.at("fit").at("fits").get<bool>());
}

TEST(ServingCliTest, SaysWhyVllmWouldNotStart) {
  const RunResult r = Serve({"--device", "l4"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.out, HasSubstr("DOES NOT START"));
  EXPECT_THAT(r.out, HasSubstr("To serve at least one request with the model's max seq len "
                               "(131072)"));
  EXPECT_THAT(r.out, HasSubstr("max_num_seqs 256, max_num_batched_tokens 2048"));
}

// vLLM's dtype "auto": GPT-2's float32 checkpoint served in bfloat16 on an H100, in float16 on
// a T4 (no bfloat16 before sm_80); a precision given wins.
TEST(ServingCliTest, TheDtypeIsVllmsAuto) {
  const std::string gpt2 = std::string(MEMEST_SOURCE_DIR) + "/tests/data/hf_configs/gpt2.json";
  auto kv_dtype = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {kMemest, "estimate", "--local", "--hf-config", gpt2,
                                     "--serve", "--json"};
    args.insert(args.end(), extra.begin(), extra.end());
    const RunResult r = ::memest::testing::Run(args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return nlohmann::json::parse(r.out).at("serving").at("kvCacheDtype").get<std::string>();
  };
  EXPECT_EQ(kv_dtype({"--device", "h100-80gb"}), "bfloat16");
  EXPECT_EQ(kv_dtype({"--device", "t4"}), "float16");
  EXPECT_EQ(kv_dtype({"--device", "h100-80gb", "--precision", "fp32"}), "float32");
}

TEST(ServingCliTest, RefusesWhatDoesNotApply) {
  const RunResult no_serve =
      ::memest::testing::Run({kMemest, "estimate", "--local", "--hf-config", kLlama31, "--mode",
                              "inference", "--max-model-len", "4096"});
  EXPECT_EQ(no_serve.exit_code, 3);
  EXPECT_THAT(no_serve.err, HasSubstr("--max-model-len: a serving setting; add --serve"));
  const RunResult batch = Serve({"--device", "h100-80gb", "--batch", "8"});
  EXPECT_EQ(batch.exit_code, 3);
  EXPECT_THAT(batch.err, HasSubstr("config.batch_size: a server's batches are its scheduler's"));
  const RunResult seq = Serve({"--device", "h100-80gb", "--seq", "4096"});
  EXPECT_EQ(seq.exit_code, 3);
  EXPECT_THAT(seq.err, HasSubstr("model.hf_config.seq"));
  const RunResult dtype = Serve({"--device", "h100-80gb", "--kv-cache-dtype", "int4"});
  EXPECT_EQ(dtype.exit_code, 3);
  EXPECT_THAT(dtype.err, HasSubstr("--kv-cache-dtype"));
  const RunResult training = Serve({"--device", "h100-80gb", "--mode", "training"});
  EXPECT_EQ(training.exit_code, 3);
  EXPECT_THAT(training.err, HasSubstr("config.mode: a server runs inference"));
}

// A quantized checkpoint: vLLM's --quantization fp8 of Llama-3.1-8B on an H100 (vLLM 0.19.0
// logged 529,248 tokens), and a flag that does not parse.
TEST(ServingCliTest, ServesAQuantizedCheckpoint) {
  const RunResult r = Serve({"--device", "h100-80gb", "--gpu-memory-utilization", "0.95",
                             "--max-model-len", "8192", "--quantize", "fp8", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  const int64_t tokens = std::stoll(j.at("serving").at("kvTokens").get<std::string>());
  EXPECT_GT(tokens, 529'248 * 0.995);
  EXPECT_LE(tokens, 529'248 * 1.001);
  EXPECT_THAT(j.at("notes").dump(), HasSubstr("quantized weights as vLLM serves them (w8a8-fp8)"));
  const RunResult block = Serve({"--device", "h100-80gb", "--quantize", "w8a8-fp8",
                                 "--quant-weight-scales", "block", "--quant-block", "128"});
  EXPECT_EQ(block.exit_code, 3);
  EXPECT_THAT(block.err, HasSubstr("--quant-block: NxK"));
  const RunResult stray = Serve({"--device", "h100-80gb", "--quant-group-size", "64"});
  EXPECT_EQ(stray.exit_code, 3);
  EXPECT_THAT(stray.err, HasSubstr("--quantize: required with the --bnb-*, --int8-*, --quant-*"));
}

// LoRA serving: --lora-rank is vLLM's --max-lora-rank, --lora-targets optional (every module),
// the slots listed under the weights; --max-loras without --serve is refused.
TEST(ServingCliTest, ServesLoraAdapters) {
  const RunResult r = Serve({"--device", "h100-80gb", "--max-model-len", "8192", "--lora-rank",
                             "16", "--max-loras", "4", "--lora-targets", "qkv_proj,o_proj"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("of which LoRA slots"));
  EXPECT_THAT(r.out, HasSubstr("4 adapter slots of rank 16 in 64 modules (o_proj,"));
  const RunResult alone = ::memest::testing::Run(
      {kMemest, "estimate", "--local", "--hf-config", kLlama31, "--max-loras", "4"});
  EXPECT_EQ(alone.exit_code, 3);
  EXPECT_THAT(alone.err, HasSubstr("--max-loras: a serving setting; add --serve"));
  const RunResult rank = Serve({"--device", "h100-80gb", "--lora-rank", "12"});
  EXPECT_EQ(rank.exit_code, 3);
  EXPECT_THAT(rank.err, HasSubstr("config.lora.rank: vLLM's max_lora_rank is one of"));
}

}  // namespace
}  // namespace memest
