#include "server/estimator_service.h"

#include <malloc.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <mutex>
#include <string>
#include <thread>

#include "engine/estimator.h"
#include "engine/ir/budget.h"
#include "engine/ir/devices.h"
#include "engine/ir/text.h"
#include "engine/models/presets.h"
#include "server/convert.h"
#include "server/status_conversion.h"
#include "server/validate_convert.h"
#include "server/wire.h"

namespace memest {
namespace {

using Clock = std::chrono::steady_clock;

// Requests that took longer than this (large models, or large graphs refused once built) trim
// the heap when done.
constexpr auto kTrimAfter = std::chrono::milliseconds(20);

// The most bytes of an error a log line repeats, as the reply's message is bounded
// (server/status_conversion.h). Request text in the error is quoted already (engine/ir/text.h);
// BoundMessage escapes any control character left, so that one request logs one line.
constexpr size_t kMaxLoggedError = 1024;

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
                 StatusCodeName(status.code()), micros, context->peer(),
                 BoundMessage(status.message(), kMaxLoggedError));
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
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

Status HandleEstimate(const v1::EstimateRequest& request, const ServiceOptions& options,
                      v1::EstimateResponse* response, Budget* budget) {
  MEMEST_RETURN_IF_ERROR(CheckRequestSize(request, options.max_ops));
  MEMEST_ASSIGN_OR_RETURN(EstimateInput input, EstimateInputFromProto(request, options.max_ops));
  Budget own;
  own.set_max_op_steps(options.max_op_steps);
  input.options.budget = budget != nullptr ? budget : &own;
  MEMEST_RETURN_IF_ERROR(input.options.budget->Check());  // a deadline already passed, say
  MEMEST_ASSIGN_OR_RETURN(Report report,
                          memest::Estimate(input.model, input.config, input.options));
  ReportToProto(report, response);
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
    case v1::Model::SOURCE_NOT_SET:
      break;
  }
  return "unset";
}

grpc::ServerUnaryReactor* EstimatorService::Estimate(grpc::CallbackServerContext* context,
                                                     const grpc::ByteBuffer* request_bytes,
                                                     grpc::ByteBuffer* response_bytes) {
  const Clock::time_point start = Clock::now();
  v1::EstimateRequest request;
  v1::EstimateResponse response;
  Status status = ParseRequest(*request_bytes, &request);
  if (status.ok()) {
    // The caller's deadline and cancellation reach the engine, which checks them as it works.
    const auto left = context->deadline() - std::chrono::system_clock::now();
    Budget budget;
    budget.set_max_op_steps(options_.max_op_steps)
        .set_deadline(left > std::chrono::hours(24 * 365) ? Clock::time_point::max()
                                                          : start + left)
        .set_cancelled([context] { return context->IsCancelled(); });
    status = HandleEstimate(request, options_, &response, &budget);
  }
  if (status.ok()) status = SerializeReply(response, response_bytes);
  // A large request's graphs and schedules are freed by now, but glibc keeps the pages in its
  // arenas: give them back, so that the server returns to its idle size after a big model
  // (measured: 473 MiB kept after three 90,000-op requests, without this).
  if (Clock::now() - start > kTrimAfter) malloc_trim(0);
  return Finish(context, "Estimate", DescribeModel(request.model()), start, status);
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

namespace {

// One Validate call: a thread runs the validation and hands events to gRPC one write at a time
// (a write reactor allows one outstanding write); Finish follows the last write. The lock
// guards the queue only: StartWrite and Finish are called outside it, since gRPC may run a
// reaction on the calling thread.
class ValidateReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  ValidateReactor(grpc::CallbackServerContext* context, const grpc::ByteBuffer* request_bytes,
                  const ServiceOptions& options, ValidationRunner* runner)
      : context_(context),
        start_(Clock::now()),
        parsed_(ParseRequest(*request_bytes, &request_)),
        model_(DescribeModel(request_.model())) {
    thread_ = std::thread([this, &options, runner] { Run(request_, options, runner); });
  }

  void OnWriteDone(bool ok) override {
    const grpc::ByteBuffer* next = nullptr;
    bool finish = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      pending_.pop_front();
      if (!ok) broken_ = true;  // the client went away; the runner notices through Stopped()
      if (!pending_.empty() && !broken_) {
        next = &pending_.front();  // deque: stays put while later events are pushed
      } else {
        finish = TakeFinishLocked();
      }
    }
    if (next != nullptr) StartWrite(next);
    if (finish) Finish(status_);
  }
  void OnCancel() override { cancelled_ = true; }
  void OnDone() override {
    thread_.join();
    delete this;
  }

 private:
  void Run(const v1::ValidateRequest& request, const ServiceOptions& options,
           ValidationRunner* runner) {
    Status status = parsed_;
    if (status.ok()) status = CheckModelSize(request.model(), options.max_ops);
    if (status.ok()) status = runner->Available();
    if (status.ok()) {
      // Converted here only to refuse a malformed request before it waits in the queue; the
      // worker converts it again.
      StatusOr<ValidateInput> in = ValidateInputFromProto(request, options.max_ops);
      status = in.status();
    }
    if (status.ok()) {
      const auto deadline = context_->deadline();
      status = runner->Validate(
          request, [this](const v1::ValidateEvent& e) { return Send(e); },
          [this] { return Stopped(); }, deadline);
    }
    Complete(status);
  }

  bool Stopped() {
    std::lock_guard<std::mutex> lock(mu_);
    return cancelled_ || broken_;
  }

  bool Send(const v1::ValidateEvent& e) {
    const grpc::ByteBuffer* first = nullptr;
    grpc::ByteBuffer bytes;
    if (!SerializeReply(e, &bytes).ok()) return false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (cancelled_ || broken_) return false;
      pending_.push_back(std::move(bytes));
      if (pending_.size() == 1) first = &pending_.front();  // nothing in flight: start it
    }
    if (first != nullptr) StartWrite(first);
    return true;
  }

  void Complete(const Status& status) {
    const auto micros =
        std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start_).count();
    if (status.ok()) {
      spdlog::info("rpc=Validate model={} code=OK us={} peer={}", model_, micros, context_->peer());
    } else {
      spdlog::info("rpc=Validate model={} code={} us={} peer={} error=\"{}\"", model_,
                   StatusCodeName(status.code()), micros, context_->peer(),
                   BoundMessage(status.message(), kMaxLoggedError));
    }
    bool finish = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      status_ = ToGrpcStatus(status);
      finish_ = true;
      if (pending_.empty() || broken_) finish = TakeFinishLocked();
    }
    if (finish) Finish(status_);
  }

  // True once: when the validation is complete and the last write is done (or never will be).
  bool TakeFinishLocked() {
    if (!finish_ || finished_) return false;
    finished_ = true;
    return true;
  }

  grpc::CallbackServerContext* context_;
  const Clock::time_point start_;
  v1::ValidateRequest request_;
  const Status parsed_;  // whether the request's bytes parsed; Run refuses them if not
  const std::string model_;
  std::thread thread_;
  std::mutex mu_;
  std::deque<grpc::ByteBuffer> pending_;  // front: being written
  std::atomic<bool> cancelled_{false};
  bool broken_ = false, finish_ = false, finished_ = false;
  grpc::Status status_;
};

}  // namespace

grpc::ServerWriteReactor<grpc::ByteBuffer>* EstimatorService::Validate(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  return new ValidateReactor(context, request, options_, validations_.get());
}

}  // namespace memest
