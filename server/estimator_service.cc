#include "server/estimator_service.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/estimator.h"
#include "engine/ir/budget.h"
#include "engine/ir/devices.h"
#include "engine/ir/text.h"
#include "engine/models/presets.h"
#include "server/call_log.h"
#include "server/convert.h"
#include "server/request_id.h"
#include "server/status_conversion.h"
#include "server/stream_reactor.h"
#include "server/validate_convert.h"
#include "server/wire.h"

namespace memest {
namespace {

using Clock = std::chrono::steady_clock;

// Requests that took longer than this (large models, or large graphs refused once built) trim
// the heap when done.
constexpr auto kTrimAfter = std::chrono::milliseconds(20);

int64_t Length(const grpc::ByteBuffer& bytes) { return static_cast<int64_t>(bytes.Length()); }

// A call's budget: `op_steps`, the caller's deadline (none when it is more than a year away) and
// its cancellation, which the engine checks as it works.
Budget CallBudget(const grpc::CallbackServerContext& context, int64_t op_steps,
                  std::function<bool()> cancelled) {
  const auto left = context.deadline() - std::chrono::system_clock::now();
  Budget budget;
  budget.set_max_op_steps(op_steps)
      .set_deadline(left > std::chrono::hours(24 * 365) ? Clock::time_point::max()
                                                        : Clock::now() + left)
      .set_cancelled(std::move(cancelled));
  return budget;
}

Status TooMany(const char* field, const char* what, int count, int64_t max_ops) {
  return ResourceExhausted(std::string(field) + ": " + std::to_string(count) + " " + what +
                           " exceed this server's limit of " + std::to_string(max_ops));
}

}  // namespace

Status CheckRequestSize(const v1::EstimateRequest& request, int64_t max_ops) {
  return CheckModelSize(request.model(), max_ops);
}

Status CheckModelSize(const v1::Model& model, int64_t max_ops) {
  if (model.has_ops() && model.ops().ops_size() > max_ops) {
    return TooMany("model.ops", "ops", model.ops().ops_size(), max_ops);
  }
  if (model.has_layers() && model.layers().layers_size() > max_ops) {
    return TooMany("model.layers", "layers", model.layers().layers_size(), max_ops);
  }
  return Status::Ok();
}

void KeepLargestLayers(int64_t rows, v1::EstimateResponse* response) {
  auto* layers = response->mutable_layers();
  if (rows >= layers->size()) return;
  const auto held = [](const v1::LayerRow& row) {
    return row.parameter_bytes() + row.saved_bytes();
  };
  std::vector<int> order(layers->size());
  for (int i = 0; i < layers->size(); ++i) order[i] = i;
  // The largest first, ties in model order; then the kept ones back in model order.
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return held(layers->Get(a)) > held(layers->Get(b)); });
  order.resize(static_cast<size_t>(rows));
  std::sort(order.begin(), order.end());
  google::protobuf::RepeatedPtrField<v1::LayerRow> kept;
  for (int i : order) *kept.Add() = std::move(*layers->Mutable(i));
  layers->Swap(&kept);
}

StatusOr<std::optional<int64_t>> MaxLayerRows(bool has, int64_t rows) {
  if (!has) return std::optional<int64_t>();
  if (rows < 0) {
    return InvalidArgument("max_layer_rows: must be 0 (no rows) or more, got " +
                           std::to_string(rows));
  }
  return std::optional<int64_t>(rows);
}

void ResponseOf(const Report& report, const std::vector<std::string>& notes,
                std::optional<int64_t> max_layer_rows, v1::EstimateResponse* response) {
  ReportToProto(report, response);
  for (const std::string& note : notes) response->add_notes(note);
  if (max_layer_rows) KeepLargestLayers(*max_layer_rows, response);
}

Status HandleEstimate(const v1::EstimateRequest& request, const ServiceOptions& options,
                      v1::EstimateResponse* response, Budget* budget) {
  MEMEST_ASSIGN_OR_RETURN(const std::optional<int64_t> rows,
                          MaxLayerRows(request.has_max_layer_rows(), request.max_layer_rows()));
  MEMEST_RETURN_IF_ERROR(CheckRequestSize(request, options.max_ops));
  MEMEST_ASSIGN_OR_RETURN(EstimateInput input, EstimateInputFromProto(request, options.max_ops));
  Budget own;
  own.set_max_op_steps(options.max_op_steps);
  input.options.budget = budget != nullptr ? budget : &own;
  MEMEST_RETURN_IF_ERROR(input.options.budget->Check());  // a deadline already passed, say
  MEMEST_ASSIGN_OR_RETURN(Report report,
                          memest::Estimate(input.model, input.config, input.options));
  ResponseOf(report, input.notes, rows, response);
  return Status::Ok();
}

std::string DescribeModel(const v1::Model& model) {
  switch (model.source_case()) {
    case v1::Model::kPreset:
      return "preset:" + Escape(model.preset().name());
    case v1::Model::kLayers:
      return "layers:" + std::to_string(model.layers().layers_size());
    case v1::Model::kOps:
      return "ops:" + std::to_string(model.ops().ops_size());
    case v1::Model::kHfConfig: {
      const auto& fields = model.hf_config().config().fields();
      const auto type = fields.find("model_type");
      return "hf_config:" + (type != fields.end() && type->second.has_string_value()
                                 ? Escape(type->second.string_value())
                                 : std::string("?"));
    }
    case v1::Model::SOURCE_NOT_SET:
      break;
  }
  return "unset";
}

Status EstimatorService::Authorize(const grpc::CallbackServerContext& context) {
  return options_.auth != nullptr ? options_.auth->Check(context) : Status::Ok();
}

EstimatorService::EstimatorService(ServiceOptions options) : options_(std::move(options)) {
  validations_ = std::make_unique<ValidationRunner>(options_.validation);
  const int threads = options_.work_threads > 0 ? options_.work_threads : DefaultWorkThreads();
  work_ = std::make_unique<WorkPool>(threads,
                                     options_.max_queued >= 0 ? options_.max_queued : 8 * threads);
}

Status EstimatorService::Busy() const {
  const WorkPool::Load load = work_->load();
  return ResourceExhausted("the server is busy: estimates and plans running " +
                           std::to_string(load.running) + ", waiting " +
                           std::to_string(load.queued) + ", as many as it queues (" +
                           "--max-queued-estimates " + std::to_string(work_->max_queued()) +
                           "); retry later or elsewhere");
}

void EstimatorService::Reply(grpc::CallbackServerContext* context,
                             grpc::ServerUnaryReactor* reactor, const CallRecord& call,
                             const Status& status) {
  RecordCall(*context, call, status, metrics_);
  reactor->Finish(ToGrpcStatus(status));
}

grpc::ServerUnaryReactor* EstimatorService::Estimate(grpc::CallbackServerContext* context,
                                                     const grpc::ByteBuffer* request_bytes,
                                                     grpc::ByteBuffer* response_bytes) {
  CallRecord call{"Estimate", TagRequest(context), "-", Clock::now(),
                  static_cast<int64_t>(request_bytes->Length())};
  Status status = Authorize(*context);
  // Made here, once: the pool's thread finishes the call through it, maybe before this returns.
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (status.ok() && work_->TrySubmit([=] {
        RunEstimate(context, reactor, *request_bytes, response_bytes, call);
      })) {
    return reactor;
  }
  if (status.ok()) status = Busy();
  Reply(context, reactor, call, status);  // a refusal parses nothing: the log names no model
  return reactor;
}

void EstimatorService::RunEstimate(grpc::CallbackServerContext* context,
                                   grpc::ServerUnaryReactor* reactor,
                                   const grpc::ByteBuffer& request_bytes,
                                   grpc::ByteBuffer* response_bytes, CallRecord call) {
  HeapTrimmer::Request in_flight(trimmer_);  // made first: it ends after the request is freed
  const Clock::time_point begun = Clock::now();
  if (metrics_ != nullptr)
    metrics_->Waited(std::chrono::duration<double>(begun - call.start).count());
  v1::EstimateRequest request;
  v1::EstimateResponse response;
  // The caller's deadline and cancellation reach the engine, which checks them as it works; a
  // call whose caller left while it waited is not started.
  Budget budget =
      CallBudget(*context, options_.max_op_steps, [context] { return context->IsCancelled(); });
  Status status = budget.Check();
  if (status.ok()) status = ParseRequest(request_bytes, &request);
  if (status.ok()) {
    status = CatchAll([&] { return HandleEstimate(request, options_, &response, &budget); });
    if (metrics_ != nullptr) {
      metrics_->Engine(std::chrono::duration<double>(Clock::now() - begun).count());
    }
  }
  if (status.ok()) status = SerializeReply(response, response_bytes);
  // glibc keeps a large request's freed pages in its arenas: they are given back once no
  // request is in flight, so that the server returns to its idle size after a big model
  // (measured: 473 MiB kept after three 90,000-op requests, without this).
  if (Clock::now() - begun > kTrimAfter) in_flight.MarkLarge();
  call.model = DescribeModel(request.model());
  Reply(context, reactor, call, status);
}

grpc::ServerUnaryReactor* EstimatorService::ListPresets(grpc::CallbackServerContext* context,
                                                        const v1::ListPresetsRequest* request,
                                                        v1::ListPresetsResponse* response) {
  const CallRecord call{"ListPresets", TagRequest(context), "-", Clock::now()};
  HeapTrimmer::Request in_flight(trimmer_);
  const Status status = Authorize(*context);
  if (status.ok()) PresetsToProto(memest::ListPresets(), response);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  Reply(context, reactor, call, status);
  return reactor;
}

grpc::ServerUnaryReactor* EstimatorService::ListDevices(grpc::CallbackServerContext* context,
                                                        const v1::ListDevicesRequest* request,
                                                        v1::ListDevicesResponse* response) {
  const CallRecord call{"ListDevices", TagRequest(context), "-", Clock::now()};
  HeapTrimmer::Request in_flight(trimmer_);
  const Status status = Authorize(*context);
  if (status.ok()) DevicesToProto(memest::ListDevices(), response);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  Reply(context, reactor, call, status);
  return reactor;
}

Status HandlePlan(const v1::PlanRequest& request, const ServiceOptions& options, Budget* budget,
                  const std::function<bool(const v1::PlanEvent&)>& send) {
  MEMEST_RETURN_IF_ERROR(CheckModelSize(request.model(), options.max_ops));
  MEMEST_ASSIGN_OR_RETURN(PlanQuery query, PlanQueryFromProto(request, options.max_ops));
  PlanStats stats;
  bool gone = false;
  MEMEST_RETURN_IF_ERROR(PlanJob(
      query, budget,
      [&](const Plan& p) {
        v1::PlanEvent e;
        PlanToProto(p, e.mutable_plan());
        gone = !send(e);
        return !gone;
      },
      &stats));
  if (gone) return Cancelled("the caller went away");
  v1::PlanEvent summary;
  summary.mutable_summary()->set_plans(stats.plans);
  summary.mutable_summary()->set_estimates(stats.estimates);
  summary.mutable_summary()->set_skipped_gpu_counts(stats.skipped_counts);
  send(summary);
  return Status::Ok();
}

template <typename Request, typename Reply, typename Handle>
grpc::ServerWriteReactor<grpc::ByteBuffer>* EstimatorService::PooledStream(
    const char* method, grpc::CallbackServerContext* context,
    const grpc::ByteBuffer& request_bytes, int64_t op_steps, Handle handle) {
  auto request = std::make_shared<Request>();
  Status parsed = Authorize(*context);
  if (parsed.ok()) parsed = ParseRequest(request_bytes, request.get());
  if (!parsed.ok()) {
    return new StreamReactor(context, {method, "", "-", {}, Length(request_bytes)}, metrics_,
                             parsed);
  }
  HeapTrimmer& trimmer = trimmer_;
  return new StreamReactor(
      context, {method, "", DescribeModel(request->model()), {}, Length(request_bytes)},
      metrics_,
      [context, request, op_steps, &trimmer, handle](const StreamReactor::SendFn& send,
                                                     const StreamReactor::StoppedFn& stopped) {
        HeapTrimmer::Request in_flight(trimmer);
        in_flight.MarkLarge();  // many estimates and their graphs: give their pages back after
        Budget budget = CallBudget(*context, op_steps, stopped);
        MEMEST_RETURN_IF_ERROR(budget.Check());  // its caller left while it waited
        return handle(*request, budget, [&send](const Reply& r) { return send(r); });
      },
      work_.get(), [this] { return Busy(); }, options_.stream_stall);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* EstimatorService::Plan(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request_bytes) {
  const ServiceOptions& options = options_;
  return PooledStream<v1::PlanRequest, v1::PlanEvent>(
      "Plan", context, *request_bytes, options_.max_plan_op_steps,
      [&options](const v1::PlanRequest& request, Budget& budget,
                 const std::function<bool(const v1::PlanEvent&)>& send) {
        return HandlePlan(request, options, &budget, send);
      });
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* EstimatorService::Sweep(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request_bytes) {
  const ServiceOptions& options = options_;
  // The budget is every configuration's, as an Estimate's.
  return PooledStream<v1::SweepRequest, v1::SweepResult>(
      "Sweep", context, *request_bytes, options_.max_op_steps,
      [&options](const v1::SweepRequest& request, Budget& each,
                 const std::function<bool(const v1::SweepResult&)>& send) {
        return HandleSweep(request, options, each, send);
      });
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* EstimatorService::Validate(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request_bytes) {
  auto request = std::make_shared<v1::ValidateRequest>();
  Status parsed = Authorize(*context);
  if (parsed.ok()) parsed = ParseRequest(*request_bytes, request.get());
  if (!parsed.ok()) {
    return new StreamReactor(context, {"Validate", "", "-", {}, Length(*request_bytes)}, metrics_,
                             parsed);
  }
  const ServiceOptions& options = options_;
  ValidationRunner* runner = validations_.get();
  return new StreamReactor(
      context, {"Validate", "", DescribeModel(request->model()), {}, Length(*request_bytes)},
      metrics_,
      [context, request, &options, runner](const StreamReactor::SendFn& send,
                                           const StreamReactor::StoppedFn& stopped) {
        Status status = CheckModelSize(request->model(), options.max_ops);
        if (status.ok()) status = runner->Available();
        if (status.ok()) {
          // Converted here only to refuse a malformed request before it waits in the queue;
          // the worker converts it again.
          status = ValidateInputFromProto(*request, options.max_ops).status();
        }
        if (!status.ok()) return status;
        return runner->Validate(
            *request, [&send](const v1::ValidateEvent& e) { return send(e); }, stopped,
            context->deadline());
      },
      nullptr, nullptr, options_.stream_stall);
}

}  // namespace memest
