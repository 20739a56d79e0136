#include "bench/load_requests.h"

namespace memest {
namespace {

v1::EstimateRequest Preset(const std::string& name, int64_t layers) {
  v1::EstimateRequest request;
  v1::Preset* preset = request.mutable_model()->mutable_preset();
  preset->set_name(name);
  (*preset->mutable_params())["seq"] = 128;
  if (layers > 0) (*preset->mutable_params())["layers"] = layers;
  request.mutable_config()->set_batch_size(2);
  request.mutable_config()->set_precision(v1::PRECISION_BF16_AMP);
  request.mutable_config()->set_device_name("a100-80gb");
  return request;
}

}  // namespace

std::vector<v1::EstimateRequest> LoadRequests(const std::string& mix) {
  const v1::EstimateRequest cheap = Preset("gpt2-small", 0);
  const v1::EstimateRequest expensive = Preset("gpt2-small", 300);
  if (mix == "cheap") return {cheap};
  if (mix == "expensive") return {expensive};
  if (mix == "mixed") {
    std::vector<v1::EstimateRequest> requests(7, cheap);
    requests.push_back(Preset("llama-7b", 0));
    requests.push_back(Preset("llama-7b", 0));
    requests.push_back(expensive);
    return requests;
  }
  return {};
}

std::string LoadMixes() { return "cheap, expensive or mixed"; }

}  // namespace memest
