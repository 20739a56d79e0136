// config.serving from the proto and the response's serving report to it (server/convert.h).
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "engine/ir/devices.h"
#include "engine/models/hf_config.h"
#include "server/convert.h"

namespace memest {
namespace {

uint64_t Unsigned(int64_t v) { return v < 0 ? 0 : static_cast<uint64_t>(v); }

}  // namespace

StatusOr<ServingConfig> ServingFromProto(const v1::RunConfig& config) {
  const v1::Serving& s = config.serving();
  if (config.batch_size() != 0) {
    return InvalidArgument(
        "config.batch_size: a server's batches are its scheduler's "
        "(config.serving.max_num_seqs, max_num_batched_tokens); leave it unset");
  }
  ServingConfig out;
  out.enabled = true;
  if (s.has_gpu_memory_utilization()) {
    if (!std::isfinite(s.gpu_memory_utilization())) {
      return InvalidArgument("config.serving.gpu_memory_utilization: must be in (0, 1], got " +
                             std::to_string(s.gpu_memory_utilization()));
    }
    out.gpu_memory_utilization = s.gpu_memory_utilization();
  }
  if (s.block_size() != 0) out.block_size = s.block_size();
  out.max_num_seqs = s.max_num_seqs();
  out.max_num_batched_tokens = s.max_num_batched_tokens();
  out.max_model_len = s.max_model_len();
  out.request_tokens = s.request_tokens();
  out.concurrency = s.concurrency();
  out.max_loras = s.max_loras();
  out.fully_sharded_loras = s.fully_sharded_loras();
  switch (s.kv_cache_dtype()) {
    case v1::KV_CACHE_DTYPE_UNSPECIFIED:
      out.kv_cache_dtype = KvCacheDType::kAuto;
      break;
    case v1::KV_CACHE_DTYPE_FP8_E4M3:
      out.kv_cache_dtype = KvCacheDType::kFp8E4m3;
      break;
    case v1::KV_CACHE_DTYPE_FP8_E5M2:
      out.kv_cache_dtype = KvCacheDType::kFp8E5m2;
      break;
    default:
      return InvalidArgument("config.serving.kv_cache_dtype: unknown value " +
                             std::to_string(static_cast<int>(s.kv_cache_dtype())));
  }
  return out;
}

Status ApplyServingDtype(const ModelSpec& model, const v1::RunConfig& proto, RunConfig* run,
                         std::vector<std::string>* notes) {
  if (!proto.has_serving() || proto.precision() != v1::PRECISION_UNSPECIFIED) return Status::Ok();
  std::optional<DType> config_dtype;
  if (const auto* hf = std::get_if<HfConfigSpec>(&model.source)) {
    MEMEST_ASSIGN_OR_RETURN(HfRunHints hints, HfConfigRunHints(hf->config, true, false));
    config_dtype = hints.dtype;
  }
  // CudaPlatform's supported dtypes: bfloat16 from sm_80 (ROCm's GPUs have it too).
  int capability = 90;
  if (!run->device.empty()) {
    StatusOr<DeviceInfo> device = FindDevice(run->device);
    if (device.ok()) capability = device->compute_capability;
  }
  const bool bf16 = capability == 0 || capability >= 80;
  run->precision =
      config_dtype == DType::kFloat16 || !bf16 ? Precision::kFp16Pure : Precision::kBf16Pure;
  if (notes != nullptr) {
    notes->push_back(std::string("precision ") + PrecisionName(run->precision) +
                     " as vLLM's dtype auto picks it (config/model.py, _resolve_auto_dtype: the "
                     "config's torch_dtype " +
                     (config_dtype ? std::string(DTypeName(*config_dtype)) : "(none)") +
                     ", float32 downcast to the GPU's first supported dtype); set the "
                     "precision to choose another");
  }
  return Status::Ok();
}

void ServingToProto(const ServingReport& s, v1::ServingReport* out) {
  out->set_gpu_memory_utilization(s.gpu_memory_utilization);
  out->set_block_size(s.block_size);
  out->set_max_num_seqs(s.max_num_seqs);
  out->set_max_num_batched_tokens(s.max_num_batched_tokens);
  out->set_max_model_len(s.max_model_len);
  out->set_kv_cache_dtype(s.kv_cache_dtype);
  out->set_profile_requests(s.profile_requests);
  out->set_requested_bytes(Unsigned(s.requested_bytes));
  out->set_weights_bytes(Unsigned(s.weights_bytes));
  out->set_activation_peak_bytes(Unsigned(s.activation_peak_bytes));
  out->set_non_torch_bytes(Unsigned(s.non_torch_bytes));
  out->set_kv_cache_bytes(s.kv_cache_bytes);
  out->set_kv_bytes_per_token(Unsigned(s.kv_bytes_per_token));
  out->set_kv_layers(s.kv_layers);
  out->set_num_blocks(s.num_blocks);
  out->set_kv_tokens(s.kv_tokens);
  out->set_max_concurrency(s.max_concurrency);
  out->set_request_tokens(s.request_tokens);
  out->set_concurrent_requests(s.concurrent_requests);
  out->set_concurrency(s.concurrency);
  out->set_longest_request(s.longest_request);
  out->set_longest_single_request(s.longest_single_request);
  out->set_baseline_bytes(Unsigned(s.baseline_bytes));
  out->set_starts(s.starts);
  out->set_refusal(s.refusal);
  out->set_lora_bytes(Unsigned(s.lora_bytes));
}

}  // namespace memest
