#include "fuzz/estimate_target.h"

#include <google/protobuf/util/message_differencer.h>

#include <algorithm>
#include <string>
#include <vector>

#include "engine/ir/devices.h"
#include "engine/ir/dtype.h"
#include "engine/models/layers.h"
#include "engine/models/presets.h"
#include "engine/rules/op_rules.h"
#include "server/estimator_service.h"
#include "server/status_conversion.h"

namespace memest::fuzz {
namespace {

uint64_t Sum(const v1::MemoryByCategory& c) {
  return c.parameters() + c.gradients() + c.optimizer_state() + c.master_and_casts() +
         c.activations() + c.temporaries() + c.inputs() + c.kv_cache() + c.workspace() +
         c.communication() + c.allocator_overhead() + c.cuda_context();
}

std::string Str(uint64_t v) { return std::to_string(v); }

// `exact`: the CPU runtime counts each tensor at its own size, so the categories add up to the
// allocated bytes exactly. Under the caching allocator a block may be larger than the rounded
// request it serves (a remainder too small to split stays with it): allocated_bytes counts the
// block, the categories the rounded request, so they add up to at most allocated_bytes.
std::string CheckPeak(const std::string& name, const v1::Peak& peak, bool exact) {
  const uint64_t sum = Sum(peak.by_category());
  if (exact ? sum != peak.allocated_bytes() : sum > peak.allocated_bytes()) {
    return name + ": categories add up to " + Str(sum) + ", allocated_bytes is " +
           Str(peak.allocated_bytes());
  }
  if (peak.allocated_bytes() > peak.reserved_bytes()) {
    return name + ": allocated_bytes " + Str(peak.allocated_bytes()) + " > reserved_bytes " +
           Str(peak.reserved_bytes());
  }
  return "";
}

// A served model (config.serving): the profile run's requests are its micro-batch; the fit is
// whether vLLM starts, its requirement what the server takes (at least its share of the GPU).
std::string CheckServing(const v1::EstimateResponse& r) {
  if (!r.has_serving() || !r.has_fit()) return "a served model without serving or fit";
  const v1::ServingReport& s = r.serving();
  if (r.micro_batch() != static_cast<uint64_t>(s.profile_requests())) {
    return "micro_batch " + Str(r.micro_batch()) + " is not the profile's " +
           std::to_string(s.profile_requests()) + " requests";
  }
  const int64_t kv = static_cast<int64_t>(s.requested_bytes()) -
                     static_cast<int64_t>(r.peak().allocated_bytes() + s.non_torch_bytes());
  if (s.kv_cache_bytes() != kv) {
    return "serving.kv_cache_bytes " + std::to_string(s.kv_cache_bytes()) + " is not " +
           std::to_string(kv);
  }
  if (s.num_blocks() < 0 || s.kv_tokens() != s.num_blocks() * s.block_size() ||
      (s.kv_cache_bytes() <= 0 && s.num_blocks() != 0)) {
    return "serving: " + std::to_string(s.num_blocks()) + " blocks, " +
           std::to_string(s.kv_tokens()) + " tokens from " + std::to_string(s.kv_cache_bytes()) +
           " bytes";
  }
  const v1::DeviceFit& fit = r.fit();
  if (fit.fits() != s.starts() || s.starts() != s.refusal().empty() ||
      fit.required_bytes() < s.baseline_bytes() + s.requested_bytes() ||
      fit.headroom_bytes() != static_cast<int64_t>(fit.capacity_bytes() - fit.required_bytes())) {
    return "serving fit: starts " + std::string(s.starts() ? "true" : "false") + ", required " +
           Str(fit.required_bytes()) + ", headroom " + std::to_string(fit.headroom_bytes());
  }
  return "";
}

std::string CheckAnswer(const v1::EstimateRequest& request, const v1::EstimateResponse& r) {
  const bool exact = request.config().runtime() == v1::RUNTIME_CPU_TORCH_1_13;
  if (std::string broken = CheckPeak("peak", r.peak(), exact); !broken.empty()) return broken;
  if (r.peak().reserved_bytes() > r.peak_reserved_bytes()) {
    return "peak.reserved_bytes " + Str(r.peak().reserved_bytes()) + " > peak_reserved_bytes " +
           Str(r.peak_reserved_bytes());
  }
  for (int i = 0; i < r.phases_size(); ++i) {
    const v1::Peak& phase = r.phases(i);
    const std::string name = "phases[" + std::to_string(i) + "]";
    if (std::string broken = CheckPeak(name, phase, exact); !broken.empty()) return broken;
    if (phase.allocated_bytes() > r.peak().allocated_bytes()) {
      return name + ".allocated_bytes " + Str(phase.allocated_bytes()) +
             " > peak.allocated_bytes " + Str(r.peak().allocated_bytes());
    }
    if (phase.reserved_bytes() > r.peak_reserved_bytes()) {
      return name + ".reserved_bytes " + Str(phase.reserved_bytes()) + " > peak_reserved_bytes " +
             Str(r.peak_reserved_bytes());
    }
  }
  const v1::RunConfig& config = request.config();
  if (config.has_serving()) return CheckServing(r);
  const uint64_t steps = config.has_grad_accum_steps() ? config.grad_accum_steps() : 1;
  if (r.micro_batch() * steps != static_cast<uint64_t>(config.batch_size())) {
    return "micro_batch " + Str(r.micro_batch()) + " * " + Str(steps) + " steps is not batch " +
           std::to_string(config.batch_size());
  }
  const bool device = config.device_case() != v1::RunConfig::DEVICE_NOT_SET;
  if (r.has_fit() != device) {
    return device ? "no fit although a device was named" : "a fit although no device was named";
  }
  if (device) {
    const v1::DeviceFit& fit = r.fit();
    if (fit.required_bytes() !=
        r.peak_reserved_bytes() + r.breakdown().cuda_context() + r.breakdown().nccl()) {
      return "fit.required_bytes " + Str(fit.required_bytes()) + " is not peak_reserved_bytes " +
             Str(r.peak_reserved_bytes()) + " + cuda_context " +
             Str(r.breakdown().cuda_context()) + " + nccl " + Str(r.breakdown().nccl());
    }
    const int64_t headroom = static_cast<int64_t>(fit.capacity_bytes() - fit.required_bytes());
    if (fit.headroom_bytes() != headroom || fit.fits() != (headroom >= 0)) {
      return "fit: capacity " + Str(fit.capacity_bytes()) + ", required " +
             Str(fit.required_bytes()) + ", headroom " + std::to_string(fit.headroom_bytes()) +
             ", fits " + (fit.fits() ? "true" : "false");
    }
  }
  for (int i = 2; i < r.advice_size(); ++i) {
    if (r.advice(i).saving_bytes() > r.advice(i - 1).saving_bytes()) {
      return "advice[" + std::to_string(i) + "] saves more than advice[" + std::to_string(i - 1) +
             "]";
    }
  }
  return "";
}

}  // namespace

std::string CheckEstimate(const v1::EstimateRequest& request, const Status& status,
                          const v1::EstimateResponse& response) {
  if (status.ok()) return CheckAnswer(request, response);
  if (status.message().empty()) {
    return std::string("a refusal without a message (") + StatusCodeName(status.code()) + ")";
  }
  if (status.code() == StatusCode::kInternal) return "INTERNAL: " + status.message();
  return "";
}

// The server's limits scaled down by ten: under ASan and UBSan an op step costs about ten times
// what it costs in a release build, and the fuzzer's timeout is 10 s. The same code refuses and
// cuts short; only the thresholds differ.
ServiceOptions FuzzServiceOptions() {
  ServiceOptions options;
  options.max_ops /= 10;
  options.max_op_steps /= 10;
  return options;
}

std::string CheckSweepAgrees(const v1::EstimateRequest& request, const ServiceOptions& options,
                             const Status& status, const v1::EstimateResponse& response) {
  v1::SweepRequest sweep;
  *sweep.mutable_model() = request.model();
  *sweep.add_configs() = request.config();
  *sweep.add_configs() = request.config();  // estimated with the first one's graph
  sweep.set_skip_advice(request.skip_advice());
  if (request.has_max_layer_rows()) sweep.set_max_layer_rows(request.max_layer_rows());
  Budget each;
  each.set_max_op_steps(options.max_op_steps);
  std::vector<v1::SweepResult> results;
  const Status swept = HandleSweep(sweep, options, each, [&results](const v1::SweepResult& r) {
    results.push_back(r);
    return true;
  });
  const grpc::Status want = ToGrpcStatus(status);
  if (!swept.ok()) {  // refused as a whole: only for what Estimate refuses the request for
    const grpc::Status got = ToGrpcStatus(swept);
    if (want.ok() || got.error_code() != want.error_code() ||
        got.error_message() != want.error_message()) {
      return "the sweep was refused (" + got.error_message() + ") where Estimate " +
             (want.ok() ? std::string("answered") : "said: " + want.error_message());
    }
    return "";
  }
  if (results.size() != 2) return "the sweep of two configurations gave " +
                                  std::to_string(results.size()) + " results";
  for (const v1::SweepResult& r : results) {
    const std::string which = "sweep result " + std::to_string(r.index());
    if (status.ok()) {
      if (!r.has_estimate()) return which + " is a refusal where Estimate answered";
      if (!google::protobuf::util::MessageDifferencer::Equals(r.estimate(), response)) {
        return which + " differs from Estimate's answer";
      }
    } else if (!r.has_error() || r.error().code() != static_cast<int>(want.error_code()) ||
               r.error().message() != want.error_message()) {
      return which + " is not Estimate's refusal: " + want.error_message();
    }
  }
  return "";
}

std::string FuzzEstimateOnce(const uint8_t* data, size_t size) {
  v1::EstimateRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return "";
  v1::EstimateResponse response;
  static const ServiceOptions options = FuzzServiceOptions();
  const Status status = HandleEstimate(request, options, &response);
  // What the server does with the answer besides sending it: log the model, map the code.
  const std::string model = DescribeModel(request.model());
  const grpc::Status mapped = ToGrpcStatus(status);
  if (mapped.ok() != status.ok()) return "the gRPC status disagrees with the engine's: " + model;
  if (std::string broken = CheckEstimate(request, status, response); !broken.empty()) {
    return broken;
  }
  return CheckSweepAgrees(request, options, status, response);
}

std::vector<std::string> EstimateDictionary() {
  std::vector<std::string> words = {"cross_entropy", "mse", "sum"};
  for (const OpRule* rule : AllOpRules()) words.emplace_back(rule->kind);
  for (const std::string& kind : LayerKinds()) words.push_back(kind);
  for (const PresetInfo& preset : ListPresets()) {
    words.push_back(preset.name);
    for (const PresetParam& param : preset.params) words.push_back(param.name);
  }
  for (const DeviceInfo& device : ListDevices()) words.push_back(device.name);
  for (int d = 0; d <= static_cast<int>(DType::kBool); ++d) {
    words.emplace_back(DTypeName(static_cast<DType>(d)));
  }
  std::sort(words.begin(), words.end());
  words.erase(std::unique(words.begin(), words.end()), words.end());
  return words;
}

}  // namespace memest::fuzz
