#include "server/estimator_service.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <string>

#include "engine/devices.h"
#include "engine/estimator.h"
#include "engine/presets.h"
#include "server/convert.h"
#include "server/status_conversion.h"

namespace memest {
namespace {

using Clock = std::chrono::steady_clock;

Status TooMany(const char* field, const char* what, int count, int64_t max_ops) {
  return ResourceExhausted(std::string(field) + ": " + std::to_string(count) + " " + what +
                           " exceed this server's limit of " + std::to_string(max_ops));
}

// Logs the request as one line and finishes the RPC with `status` mapped to gRPC.
grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* context, const char* method,
                                 const std::string& model, Clock::time_point start,
                                 const Status& status) {
  const auto micros =
      std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start).count();
  if (status.ok()) {
    spdlog::info("rpc={} model={} code=OK us={} peer={}", method, model, micros, context->peer());
  } else {
    spdlog::info("rpc={} model={} code={} us={} peer={} error=\"{}\"", method, model,
                 StatusCodeName(status.code()), micros, context->peer(), status.message());
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

}  // namespace

Status CheckRequestSize(const v1::EstimateRequest& request, int64_t max_ops) {
  const v1::Model& model = request.model();
  if (model.has_ops() && model.ops().ops_size() > max_ops) {
    return TooMany("model.ops", "ops", model.ops().ops_size(), max_ops);
  }
  if (model.has_layers() && model.layers().layers_size() > max_ops) {
    return TooMany("model.layers", "layers", model.layers().layers_size(), max_ops);
  }
  return Status::Ok();
}

Status HandleEstimate(const v1::EstimateRequest& request, const ServiceOptions& options,
                      v1::EstimateResponse* response) {
  MEMEST_RETURN_IF_ERROR(CheckRequestSize(request, options.max_ops));
  MEMEST_ASSIGN_OR_RETURN(EstimateInput input, EstimateInputFromProto(request, options.max_ops));
  MEMEST_ASSIGN_OR_RETURN(Report report,
                          memest::Estimate(input.model, input.config, input.options));
  ReportToProto(report, response);
  return Status::Ok();
}

std::string DescribeModel(const v1::Model& model) {
  switch (model.source_case()) {
    case v1::Model::kPreset:
      return "preset:" + model.preset().name();
    case v1::Model::kLayers:
      return "layers:" + std::to_string(model.layers().layers_size());
    case v1::Model::kOps:
      return "ops:" + std::to_string(model.ops().ops_size());
    case v1::Model::SOURCE_NOT_SET:
      break;
  }
  return "unset";
}

grpc::ServerUnaryReactor* EstimatorService::Estimate(grpc::CallbackServerContext* context,
                                                     const v1::EstimateRequest* request,
                                                     v1::EstimateResponse* response) {
  const Clock::time_point start = Clock::now();
  Status status = HandleEstimate(*request, options_, response);
  return Finish(context, "Estimate", DescribeModel(request->model()), start, status);
}

grpc::ServerUnaryReactor* EstimatorService::ListPresets(grpc::CallbackServerContext* context,
                                                        const v1::ListPresetsRequest* request,
                                                        v1::ListPresetsResponse* response) {
  const Clock::time_point start = Clock::now();
  PresetsToProto(memest::ListPresets(), response);
  return Finish(context, "ListPresets", "-", start, Status::Ok());
}

grpc::ServerUnaryReactor* EstimatorService::ListDevices(grpc::CallbackServerContext* context,
                                                        const v1::ListDevicesRequest* request,
                                                        v1::ListDevicesResponse* response) {
  const Clock::time_point start = Clock::now();
  DevicesToProto(memest::ListDevices(), response);
  return Finish(context, "ListDevices", "-", start, Status::Ok());
}

}  // namespace memest
