// HandleSweep (server/estimator_service.h): one model, many run configurations, each answered
// as HandleEstimate would answer it alone.
#include "engine/sweep.h"

#include <string>
#include <vector>

#include "server/convert.h"
#include "server/estimator_service.h"
#include "server/status_conversion.h"

namespace memest {
namespace {

// What stops the whole sweep rather than one configuration: the caller's deadline or its going.
bool StopsTheSweep(const Status& status) {
  return status.code() == StatusCode::kDeadlineExceeded || status.code() == StatusCode::kCancelled;
}

}  // namespace

Status HandleSweep(const v1::SweepRequest& request, const ServiceOptions& options,
                   const Budget& each, const std::function<bool(const v1::SweepResult&)>& send) {
  MEMEST_ASSIGN_OR_RETURN(const std::optional<int64_t> rows,
                          MaxLayerRows(request.has_max_layer_rows(), request.max_layer_rows()));
  if (request.configs_size() == 0) {
    return InvalidArgument("configs: a sweep needs at least one run configuration");
  }
  if (request.configs_size() > options.max_sweep_configs) {
    return ResourceExhausted("configs: " + std::to_string(request.configs_size()) +
                             " run configurations exceed this server's limit of " +
                             std::to_string(options.max_sweep_configs));
  }
  MEMEST_RETURN_IF_ERROR(CheckModelSize(request.model(), options.max_ops));
  MEMEST_ASSIGN_OR_RETURN(const ModelSpec model, ModelFromProto(request.model()));
  EstimateOptions estimate;
  estimate.max_ops = options.max_ops;
  estimate.advice = !request.skip_advice();
  SweepEstimator sweep(model, estimate);
  int64_t spent = 0;  // op steps, by the configurations so far
  for (int i = 0; i < request.configs_size(); ++i) {
    Budget budget = each;
    std::vector<std::string> notes;
    Report report;
    // As HandleEstimate's: conversion, the budget's deadline, the estimate; an exception is this
    // configuration's INTERNAL, as it would be its call's.
    const Status status = CatchAll([&]() -> Status {
      if (spent >= options.max_sweep_op_steps) {
        return ResourceExhausted("configs[" + std::to_string(i) + "]: the sweep's " +
                                 std::to_string(options.max_sweep_op_steps) +
                                 " op steps were spent by the configurations before it "
                                 "(memest-server --max-sweep-op-steps); sweep the rest apart");
      }
      MEMEST_ASSIGN_OR_RETURN(RunConfig config,
                              RunConfigForModel(model, request.configs(i), &notes));
      MEMEST_RETURN_IF_ERROR(budget.Check());
      MEMEST_ASSIGN_OR_RETURN(report, sweep.Estimate(config, &budget));
      return Status::Ok();
    });
    spent += budget.spent();
    if (StopsTheSweep(status)) return status;
    v1::SweepResult result;
    result.set_index(i);
    if (status.ok()) {
      ResponseOf(report, notes, rows, result.mutable_estimate());
    } else {
      const grpc::Status refusal = ToGrpcStatus(status);
      result.mutable_error()->set_code(static_cast<int32_t>(refusal.error_code()));
      result.mutable_error()->set_message(refusal.error_message());
    }
    if (!send(result)) return Cancelled("the caller went away");
  }
  return Status::Ok();
}

}  // namespace memest
