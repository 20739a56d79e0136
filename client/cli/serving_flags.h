// The flags of a served model (`--serve`, vLLM's engine arguments under their own names:
// `--gpu-memory-utilization 0.9 --max-model-len 8192 --kv-cache-dtype fp8`, and the questions
// `--request-tokens N`, `--concurrency N`; with --lora-rank, `--max-loras N`): config.serving.
#ifndef MEMEST_CLIENT_CLI_SERVING_FLAGS_H_
#define MEMEST_CLIENT_CLI_SERVING_FLAGS_H_

#include <CLI/CLI.hpp>

#include <cstdint>
#include <optional>
#include <string>

#include "engine/ir/status.h"
#include "memest/v1/memest.pb.h"

namespace memest::cli {

struct ServingFlags {
  bool serve = false;
  std::optional<double> gpu_memory_utilization;
  std::optional<int64_t> block_size;
  std::optional<int64_t> max_num_seqs;
  std::optional<int64_t> max_num_batched_tokens;
  std::optional<int64_t> max_model_len;
  std::string kv_cache_dtype;  // auto | fp8 | fp8_e4m3 | fp8_e5m2
  std::optional<int64_t> request_tokens;
  std::optional<int64_t> concurrency;
  std::optional<int64_t> max_loras;
  bool fully_sharded_loras = false;
};

void AddServingFlags(CLI::App* app, ServingFlags* flags);

// Sets config.serving when --serve is given; a serving flag without it is refused, naming the
// flag. Ranges are the engine's to check.
Status ApplyServingFlags(const ServingFlags& flags, v1::RunConfig* config);

}  // namespace memest::cli

#endif  // MEMEST_CLIENT_CLI_SERVING_FLAGS_H_
