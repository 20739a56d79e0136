// config.serving's checks (engine/ir/config.h, ValidateServing).
#include <cmath>
#include <string>

#include "engine/ir/config.h"

namespace memest {
namespace {

std::string Str(int64_t v) { return std::to_string(v); }

Status InRange(int64_t value, int64_t most, const char* field) {
  if (value >= 0 && value <= most) return Status::Ok();
  return InvalidArgument(std::string("config.serving.") + field + ": must be in [1, " +
                         Str(most) + "] (0 or unset: vLLM's default), got " + Str(value));
}

}  // namespace

Status ValidateServing(const RunConfig& c) {
  const ServingConfig& s = c.serving;
  if (!s.enabled) return Status::Ok();
  if (!(s.gpu_memory_utilization > 0 && s.gpu_memory_utilization <= 1)) {
    return InvalidArgument("config.serving.gpu_memory_utilization: must be in (0, 1], got " +
                           std::to_string(s.gpu_memory_utilization));
  }
  // vLLM's CacheConfig.block_size: Literal[1, 8, 16, 32, 64, 128].
  const int64_t b = s.block_size;
  if (b != 1 && b != 8 && b != 16 && b != 32 && b != 64 && b != 128) {
    return InvalidArgument("config.serving.block_size: must be 1, 8, 16, 32, 64 or 128 (vLLM's "
                           "block sizes), got " + Str(b));
  }
  MEMEST_RETURN_IF_ERROR(InRange(s.max_num_seqs, kMaxServingSeqs, "max_num_seqs"));
  MEMEST_RETURN_IF_ERROR(
      InRange(s.max_num_batched_tokens, kMaxServingTokens, "max_num_batched_tokens"));
  MEMEST_RETURN_IF_ERROR(InRange(s.max_model_len, kMaxServingTokens, "max_model_len"));
  MEMEST_RETURN_IF_ERROR(InRange(s.request_tokens, kMaxServingTokens, "request_tokens"));
  MEMEST_RETURN_IF_ERROR(InRange(s.concurrency, kMaxServingSeqs, "concurrency"));
  // The settings against each other are checked once vLLM's defaults are filled in
  // (engine/report/serving.cc).
  if (c.mode != Mode::kInference) {
    return InvalidArgument("config.mode: a server runs inference, and config.serving is set");
  }
  if (c.runtime != Runtime::kCuda) {
    return InvalidArgument("config.runtime: vLLM's engine runs on CUDA, and config.serving is "
                           "set");
  }
  if (c.device.empty() && c.device_capacity_bytes == 0) {
    return InvalidArgument("config.serving: the KV cache takes what the GPU's memory leaves; name "
                           "a device (config.device_name or config.device_capacity_bytes)");
  }
  if (c.generate_tokens > 0) {
    return InvalidArgument("config.generate_tokens: a server's requests end as they will "
                           "(config.serving.max_model_len bounds them); leave it unset");
  }
  if (c.parallelism.pipeline > 1 || c.parallelism.context > 1 || c.parallelism.data > 1 ||
      c.parallelism.sharding != DataSharding::kNone || c.parallelism.sequence_parallel) {
    return InvalidArgument("config.parallelism: a served model is modelled with tensor "
                           "parallelism only (vLLM's --tensor-parallel-size, without sequence "
                           "parallelism); data-parallel replicas are each their own estimate");
  }
  MEMEST_RETURN_IF_ERROR(InRange(s.max_loras, kMaxServingLoras, "max_loras"));
  if (c.lora.rank == 0 && (s.max_loras > 0 || s.fully_sharded_loras)) {
    return InvalidArgument(std::string("config.serving.") +
                           (s.max_loras > 0 ? "max_loras" : "fully_sharded_loras") +
                           ": a LoRA serving setting; set config.lora.rank (vLLM's "
                           "--max-lora-rank) to serve adapters");
  }
  if (c.quantization.format != WeightFormat::kDense &&
      !IsServedWeightFormat(c.quantization.format)) {
    return InvalidArgument(std::string("config.quantization.format: ") +
                           WeightFormatName(c.quantization.format) +
                           " is bitsandbytes' as transformers loads it; a served model's formats "
                           "are w8a8-fp8, w8a8-int8, w4a16 and w8a16");
  }
  return Status::Ok();
}

}  // namespace memest
