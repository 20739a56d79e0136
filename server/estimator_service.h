// The memest.v1.MemoryEstimator service: a thin adapter over the engine.
//
// Each handler converts the request (server/convert.h), calls the engine, converts the result
// and finishes with the one status mapping (server/status_conversion.h). Handlers keep no
// state between calls and may run concurrently: the engine's Estimate() is pure.
//
// Estimate and Validate are registered raw (server/wire.h): they parse their request's bytes
// themselves, so a request that does not parse gets INVALID_ARGUMENT naming the field, not the
// UNIMPLEMENTED with an empty message of gRPC's generated handlers.
//
// Every request is logged as one line and counted in the metrics (server/call_log.h).
#ifndef MEMEST_SERVER_ESTIMATOR_SERVICE_H_
#define MEMEST_SERVER_ESTIMATOR_SERVICE_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/ir/budget.h"
#include "engine/ir/status.h"
#include "engine/report/report.h"
#include "memest/v1/memest.grpc.pb.h"
#include "memest/v1/memest.pb.h"
#include "server/auth.h"
#include "server/call_log.h"
#include "server/heap_trim.h"
#include "server/stream_reactor.h"
#include "server/validation_runner.h"
#include "server/work_pool.h"

namespace memest {

struct ServiceOptions {
  // The most ops (OpGraph.ops) or layers (LayerModel.layers) one request may declare, and the
  // most ops the engine may expand any model into. Larger requests get RESOURCE_EXHAUSTED.
  int64_t max_ops = 300'000;
  // The most op steps (one op simulated once: forward, backward or recomputed) one Estimate may
  // spend, its advice's re-estimates included: 1.3-2.8 us each on one core of the 2-vCPU VM,
  // so 3-6 s at most (docs/reliability.md). A request whose estimate alone needs more is
  // refused before it is scheduled; advice past it is cut short and the notes say so.
  int64_t max_op_steps = 2'000'000;
  // The same for one Plan: its search runs many estimates (docs/planning.md), bounded by the
  // caller's deadline too.
  int64_t max_plan_op_steps = 100'000'000;
  // The most run configurations one Sweep may carry; each is charged max_op_steps of its own,
  // and all of them together at most max_sweep_op_steps: once they are spent, the
  // configurations left are refused (RESOURCE_EXHAUSTED).
  int64_t max_sweep_configs = 65'536;
  int64_t max_sweep_op_steps = 100'000'000;
  // A streaming call (Plan, Sweep, Validate) whose reader takes none of its queued replies for
  // this long is cancelled (server/stream_reactor.h).
  std::chrono::milliseconds stream_stall = StreamReactor::kMaxStall;
  // Threads that run estimates and plans (0: one per core, DefaultWorkThreads()), and how many
  // may wait for one (-1: 8 per thread); a call beyond that is refused at once.
  int work_threads = 0;
  int max_queued = -1;
  // Validate: which device, which worker, how long the queue may grow.
  ValidationOptions validation;
  // The bearer token the calls must carry (server/auth.h); null: none.
  std::shared_ptr<TokenAuth> auth;
};

// Refuses a request larger than `max_ops` allows, with RESOURCE_EXHAUSTED naming the field,
// the count and the limit ("model.ops: 100001 ops exceed this server's limit of 100000").
Status CheckRequestSize(const v1::EstimateRequest& request, int64_t max_ops);
Status CheckModelSize(const v1::Model& model, int64_t max_ops);

// Keeps the `rows` layer rows of `response` that hold the most (parameter + saved bytes), in
// model order (EstimateRequest.max_layer_rows).
void KeepLargestLayers(int64_t rows, v1::EstimateResponse* response);

// max_layer_rows (EstimateRequest's, SweepRequest's): nullopt when not set (every layer), the
// rows when 0 or more, else INVALID_ARGUMENT.
StatusOr<std::optional<int64_t>> MaxLayerRows(bool has, int64_t rows);
// The reply to an estimate: the report, the conversion's notes, the layers cut to
// `max_layer_rows` when set.
void ResponseOf(const Report& report, const std::vector<std::string>& notes,
                std::optional<int64_t> max_layer_rows, v1::EstimateResponse* response);
// The whole of Estimate without the RPC: size check, conversion, engine, conversion back. The
// engine charges `budget` (its deadline and cancellation are the caller's); null: a budget of
// options.max_op_steps with no deadline.
Status HandleEstimate(const v1::EstimateRequest& request, const ServiceOptions& options,
                      v1::EstimateResponse* response, Budget* budget = nullptr);

// The whole of Plan without the RPC: size check, conversion, the search, each plan and then the
// summary handed to `send` as PlanEvents (false: the caller went away; the search stops). The
// search charges `budget`.
Status HandlePlan(const v1::PlanRequest& request, const ServiceOptions& options, Budget* budget,
                  const std::function<bool(const v1::PlanEvent&)>& send);

// The whole of Sweep without the RPC: the request checked (max_layer_rows, the count of configs,
// the model's size and conversion: a refusal of the whole), then each configuration estimated
// as HandleEstimate would answer it, with a copy of `each` as its budget, and handed to `send`
// as a SweepResult in order (false: the caller went away; the sweep stops). A configuration
// stopped by its budget's deadline or cancellation stops the sweep with that status; once the
// configurations have spent options.max_sweep_op_steps together, the rest are refused.
Status HandleSweep(const v1::SweepRequest& request, const ServiceOptions& options,
                   const Budget& each, const std::function<bool(const v1::SweepResult&)>& send);
// "preset:gpt2-small", "layers:12", "ops:345" or "unset": the model as a log line names it
// (a preset's name escaped and cut as engine/ir/text.h's Escape does).
std::string DescribeModel(const v1::Model& model);

// The generated callback service with Estimate and Validate taking their requests as bytes.
using MemoryEstimatorBase = v1::MemoryEstimator::WithRawCallbackMethod_Estimate<
    v1::MemoryEstimator::WithCallbackMethod_ListPresets<
        v1::MemoryEstimator::WithCallbackMethod_ListDevices<
            v1::MemoryEstimator::WithRawCallbackMethod_Validate<
                v1::MemoryEstimator::WithRawCallbackMethod_Plan<
                    v1::MemoryEstimator::WithRawCallbackMethod_Sweep<
                        v1::MemoryEstimator::Service>>>>>>;

class EstimatorService final : public MemoryEstimatorBase {
 public:
  explicit EstimatorService(ServiceOptions options = {});

  // `request` holds an EstimateRequest's bytes; `response` gets the EstimateResponse's.
  grpc::ServerUnaryReactor* Estimate(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ListPresets(grpc::CallbackServerContext* context,
                                        const v1::ListPresetsRequest* request,
                                        v1::ListPresetsResponse* response) override;
  grpc::ServerUnaryReactor* ListDevices(grpc::CallbackServerContext* context,
                                        const v1::ListDevicesRequest* request,
                                        v1::ListDevicesResponse* response) override;
  // Streams progress and the result (ValidateEvents, as bytes) for a ValidateRequest's bytes;
  // each call runs on a thread of its own (the validation waits for its turn and for the
  // worker), never on gRPC's callback threads.
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Validate(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request) override;

  // Streams the plans of a PlanRequest's bytes (PlanEvents, as bytes), searched on the work pool
  // (refused as busy when its queue is full).
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Plan(grpc::CallbackServerContext* context,
                                                   const grpc::ByteBuffer* request) override;
  // Streams the results of a SweepRequest's bytes (SweepResults, as bytes), estimated on the
  // work pool (refused as busy when its queue is full).
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Sweep(grpc::CallbackServerContext* context,
                                                    const grpc::ByteBuffer* request) override;

  ValidationRunner& validations() { return *validations_; }
  // Where finished calls are counted (null: nowhere); set before the server starts.
  void set_metrics(Metrics* metrics) { metrics_ = metrics; }
  const WorkPool& work() const { return *work_; }

 private:
  // OK, or UNAUTHENTICATED when the server has a token the call does not carry.
  Status Authorize(const grpc::CallbackServerContext& context);
  // RESOURCE_EXHAUSTED: the pool's queue is full.
  Status Busy() const;
  // A streaming call of a `Request` (Plan, Sweep) run on the pool: parsed first (a refusal takes
  // no thread), then `handle(request, budget, send)` with a budget of `op_steps`, the caller's
  // deadline and its going, each `Reply` streamed; the heap is trimmed after it.
  template <typename Request, typename Reply, typename Handle>
  grpc::ServerWriteReactor<grpc::ByteBuffer>* PooledStream(const char* method,
                                                           grpc::CallbackServerContext* context,
                                                           const grpc::ByteBuffer& request_bytes,
                                                           int64_t op_steps, Handle handle);
  // One Estimate, on a thread of the pool: parse, estimate, reply, then finish `reactor`.
  void RunEstimate(grpc::CallbackServerContext* context, grpc::ServerUnaryReactor* reactor,
                   const grpc::ByteBuffer& request_bytes, grpc::ByteBuffer* response_bytes,
                   CallRecord call);
  // Logs and counts the call (server/call_log.h), then finishes it with `status`.
  void Reply(grpc::CallbackServerContext* context, grpc::ServerUnaryReactor* reactor,
             const CallRecord& call, const Status& status);

  const ServiceOptions options_;
  std::unique_ptr<ValidationRunner> validations_;
  // Validate is left out: it waits for minutes, its memory is the worker process's.
  HeapTrimmer trimmer_;
  Metrics* metrics_ = nullptr;
  // Last: destroyed first, running what is still queued while the rest is alive.
  std::unique_ptr<WorkPool> work_;
};

}  // namespace memest

#endif  // MEMEST_SERVER_ESTIMATOR_SERVICE_H_
