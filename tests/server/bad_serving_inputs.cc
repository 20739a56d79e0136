// Rows of the bad-input catalogue for EstimateRequest.config.serving: vLLM's settings out of
// range or against each other, and what a server does not take (a batch size, training, a model
// that is not a decoder, no device to divide).
#include <string>
#include <vector>

#include "tests/server/bad_inputs.h"

namespace memest::testing {
namespace {

constexpr grpc::StatusCode kInvalid = grpc::StatusCode::INVALID_ARGUMENT;

const std::string kInt64Max = "9223372036854775807";

// GPT-2 small cut small, served on an H100 with `serving` (a Serving message's text) and
// `config` (more RunConfig fields).
std::string Served(const std::string& serving, const std::string& config = "") {
  return std::string(kGpt2) + "config { device_name: \"h100-80gb\" serving { " + serving + " } " +
         config + " }";
}

}  // namespace

std::vector<BadInput> BadServingInputs() {
  return {
      {"ServingWithBatch", Served("", "batch_size: 4"), kInvalid,
       "config.batch_size: a server's batches are its scheduler's"},
      {"ServingTraining", Served("", "mode: MODE_TRAINING"), kInvalid,
       "config.mode: a server runs inference"},
      {"ServingNoDevice", std::string(kGpt2) + "config { serving { } }", kInvalid,
       "config.serving: the KV cache takes what the GPU's memory leaves"},
      {"ServingUtilizationNaN", Served("gpu_memory_utilization: nan"), kInvalid,
       "config.serving.gpu_memory_utilization"},
      {"ServingUtilizationAboveOne", Served("gpu_memory_utilization: 1.2"), kInvalid,
       "config.serving.gpu_memory_utilization: must be in (0, 1]"},
      {"ServingBlockSize", Served("block_size: 24"), kInvalid, "config.serving.block_size"},
      {"ServingSeqsNegative", Served("max_num_seqs: -1"), kInvalid, "config.serving.max_num_seqs"},
      {"ServingTokensInt64Max", Served("max_num_batched_tokens: " + kInt64Max), kInvalid,
       "config.serving.max_num_batched_tokens"},
      {"ServingTokensBelowSeqs", Served("max_num_seqs: 64 max_num_batched_tokens: 32"), kInvalid,
       "config.serving.max_num_batched_tokens: max_num_batched_tokens 32 must be at least "
       "max_num_seqs 64"},
      {"ServingLenBeyondContext", Served("max_model_len: 4096"), kInvalid,
       "config.serving.max_model_len: 4096 is beyond the model's context of 32 tokens"},
      {"ServingRequestBeyondLen", Served("max_model_len: 16 request_tokens: 17"), kInvalid,
       "config.serving.request_tokens"},
      {"ServingKvDtypeUndefined", Served("kv_cache_dtype: 99"), kInvalid,
       "config.serving.kv_cache_dtype"},
      {"ServingAttentionEager", Served("", "attention: ATTENTION_EAGER"), kInvalid,
       "config.attention: eager: vLLM runs its own attention backend"},
      {"ServingLoraOnGpt2", Served("", "lora { rank: 16 }"), kInvalid,
       "config.lora: vLLM serves 'gpt2' without LoRA"},
      {"ServingLoraRank", Served("", "lora { rank: 12 }"), kInvalid,
       "config.lora.rank: vLLM's max_lora_rank is one of"},
      {"ServingLoraDropout", Served("", "lora { rank: 16 dropout: 0.1 }"), kInvalid,
       "config.lora.dropout: a server runs its adapters without dropout"},
      {"ServingLoraAllLinear", Served("", "lora { rank: 16 target_modules: \"all-linear\" }"),
       kInvalid, "config.lora.target_modules[0]: vLLM's target_modules are module suffixes"},
      {"ServingMaxLorasAlone", Served("max_loras: 4"), kInvalid,
       "config.serving.max_loras: a LoRA serving setting"},
      {"ServingMaxLorasNegative", Served("max_loras: -1", "lora { rank: 16 }"), kInvalid,
       "config.serving.max_loras: must be in [1, 65536]"},
      {"ServingLayerModel",
       std::string(kLinearLayers) + "config { device_name: \"h100-80gb\" serving { } }", kInvalid,
       "model: a layer list is not served"},
  };
}

}  // namespace memest::testing
