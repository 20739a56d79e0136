#include "client/cli/backend.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <utility>

#include "engine/ir/devices.h"
#include "engine/models/presets.h"
#include "memest/v1/memest.grpc.pb.h"
#include "server/auth.h"
#include "server/convert.h"
#include "server/estimator_service.h"
#include "server/status_conversion.h"
#include "server/tls.h"

namespace memest::cli {
namespace {

// `address` is empty for the local backend.
CallResult FromGrpc(const grpc::Status& status, const std::string& address) {
  if (status.ok()) return {};
  CallResult result;
  result.exit_code = ExitCodeForStatus(status);
  const std::string code = GrpcCodeName(status.error_code());
  if (!address.empty() && (status.error_code() == grpc::StatusCode::UNAVAILABLE ||
                           status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED)) {
    result.message = code + ": cannot get an answer from memest-server at " + address + ": " +
                     status.error_message() + " (start it with build/bin/memest-server --address " +
                     address + ", or pass --local)";
  } else {
    result.message = code + ": " + status.error_message();
  }
  return result;
}

// A channel to `address`, in plaintext or over TLS as `tls` says.
StatusOr<std::shared_ptr<grpc::Channel>> Connect(const std::string& address, const ClientTls& tls) {
  if (!tls.on()) return grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  if (tls.cert_file.empty() != tls.key_file.empty()) {
    return InvalidArgument(std::string(tls.cert_file.empty() ? "--tls-cert" : "--tls-key") +
                           ": mutual TLS needs both --tls-cert and --tls-key");
  }
  grpc::SslCredentialsOptions ssl;  // an empty root bundle: the system's roots
  if (!tls.ca_file.empty()) {
    MEMEST_ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadPemFile("--tls-ca", tls.ca_file));
  }
  if (!tls.cert_file.empty()) {
    MEMEST_ASSIGN_OR_RETURN(ssl.pem_cert_chain, ReadPemFile("--tls-cert", tls.cert_file));
    MEMEST_ASSIGN_OR_RETURN(ssl.pem_private_key, ReadPemFile("--tls-key", tls.key_file));
  }
  grpc::ChannelArguments args;
  if (!tls.server_name.empty()) args.SetSslTargetNameOverride(tls.server_name);
  return grpc::CreateCustomChannel(address, grpc::SslCredentials(ssl), args);
}

class RemoteBackend : public Backend {
 public:
  // `token` and `channel` are what the flags gave, or why they could not: every call then
  // fails with that.
  RemoteBackend(std::string address, int64_t deadline_ms, StatusOr<std::string> token,
                StatusOr<std::shared_ptr<grpc::Channel>> channel)
      : address_(std::move(address)), deadline_ms_(deadline_ms) {
    if (!token.ok()) ready_ = token.status();
    if (ready_.ok() && !channel.ok()) ready_ = channel.status();
    if (!ready_.ok()) return;
    token_ = *std::move(token);
    channel_ = *std::move(channel);
    stub_ = v1::MemoryEstimator::NewStub(channel_);
  }

  CallResult Estimate(const v1::EstimateRequest& request, v1::EstimateResponse* response) override {
    grpc::ClientContext context;
    if (!Prepare(&context)) return FromStatus(ready_);
    return FromGrpc(stub_->Estimate(&context, request, response), address_);
  }

  CallResult ListPresets(v1::ListPresetsResponse* response) override {
    grpc::ClientContext context;
    if (!Prepare(&context)) return FromStatus(ready_);
    return FromGrpc(stub_->ListPresets(&context, v1::ListPresetsRequest(), response), address_);
  }

  CallResult ListDevices(v1::ListDevicesResponse* response) override {
    grpc::ClientContext context;
    if (!Prepare(&context)) return FromStatus(ready_);
    return FromGrpc(stub_->ListDevices(&context, v1::ListDevicesRequest(), response), address_);
  }

  CallResult Validate(const v1::ValidateRequest& request,
                      const std::function<void(const v1::ValidateProgress&)>& progress,
                      v1::ValidationResult* result) override {
    grpc::ClientContext context;
    if (!Prepare(&context)) return FromStatus(ready_);
    std::unique_ptr<grpc::ClientReader<v1::ValidateEvent>> reader =
        stub_->Validate(&context, request);
    v1::ValidateEvent event;
    while (reader->Read(&event)) {
      if (event.has_progress()) progress(event.progress());
      if (event.has_result()) *result = event.result();
    }
    const grpc::Status status = reader->Finish();
    // UNAVAILABLE from a server that answered (no GPU there) is its message, not a dead link.
    const bool answered = channel_->GetState(false) == GRPC_CHANNEL_READY;
    return FromGrpc(status, answered ? "" : address_);
  }

  CallResult Plan(const v1::PlanRequest& request,
                  const std::function<void(const v1::PlanEvent&)>& on_event) override {
    grpc::ClientContext context;
    if (!Prepare(&context)) return FromStatus(ready_);
    std::unique_ptr<grpc::ClientReader<v1::PlanEvent>> reader = stub_->Plan(&context, request);
    v1::PlanEvent event;
    while (reader->Read(&event)) on_event(event);
    return FromGrpc(reader->Finish(), address_);
  }

  CallResult Sweep(const v1::SweepRequest& request,
                   const std::function<void(const v1::SweepResult&)>& on_result) override {
    grpc::ClientContext context;
    if (!Prepare(&context)) return FromStatus(ready_);
    std::unique_ptr<grpc::ClientReader<v1::SweepResult>> reader = stub_->Sweep(&context, request);
    v1::SweepResult result;
    while (reader->Read(&result)) on_result(result);
    return FromGrpc(reader->Finish(), address_);
  }

 private:
  // The call's deadline and bearer token; false when a file the flags named could not be read.
  bool Prepare(grpc::ClientContext* context) const {
    if (!ready_.ok()) return false;
    context->set_deadline(std::chrono::system_clock::now() +
                          std::chrono::milliseconds(deadline_ms_));
    if (!token_.empty()) context->AddMetadata("authorization", "Bearer " + token_);
    return true;
  }

  static CallResult FromStatus(const Status& status) { return FromGrpc(ToGrpcStatus(status), ""); }

  std::string address_;
  int64_t deadline_ms_;
  Status ready_;       // not OK: every call fails with it
  std::string token_;  // "": none
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::MemoryEstimator::Stub> stub_;
};

class LocalBackend : public Backend {
 public:
  CallResult Estimate(const v1::EstimateRequest& request, v1::EstimateResponse* response) override {
    // The service's own handler, minus the RPC: the same size limits, conversion and status
    // mapping as a server applies.
    return FromGrpc(ToGrpcStatus(HandleEstimate(request, ServiceOptions{}, response)), "");
  }

  CallResult ListPresets(v1::ListPresetsResponse* response) override {
    PresetsToProto(memest::ListPresets(), response);
    return {};
  }

  CallResult ListDevices(v1::ListDevicesResponse* response) override {
    DevicesToProto(memest::ListDevices(), response);
    return {};
  }

  CallResult Validate(const v1::ValidateRequest&,
                      const std::function<void(const v1::ValidateProgress&)>&,
                      v1::ValidationResult*) override {
    return FromGrpc(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                 "--local cannot validate: validation runs on a memest-server "
                                 "started with --device on a machine with a GPU"),
                    "");
  }

  // The service's handler on this thread, with a server's op-step bound and no deadline.
  CallResult Plan(const v1::PlanRequest& request,
                  const std::function<void(const v1::PlanEvent&)>& on_event) override {
    const ServiceOptions options;
    Budget budget;
    budget.set_max_op_steps(options.max_plan_op_steps);
    const Status s = HandlePlan(request, options, &budget, [&](const v1::PlanEvent& e) {
      on_event(e);
      return true;
    });
    return FromGrpc(ToGrpcStatus(s), "");
  }

  CallResult Sweep(const v1::SweepRequest& request,
                   const std::function<void(const v1::SweepResult&)>& on_result) override {
    const ServiceOptions options;
    Budget each;
    each.set_max_op_steps(options.max_op_steps);
    const Status s = HandleSweep(request, options, each, [&](const v1::SweepResult& r) {
      on_result(r);
      return true;
    });
    return FromGrpc(ToGrpcStatus(s), "");
  }
};

}  // namespace

std::unique_ptr<Backend> MakeRemoteBackend(const std::string& address, int64_t deadline_ms,
                                           const std::string& token_file, const ClientTls& tls) {
  return std::make_unique<RemoteBackend>(
      address, deadline_ms,
      token_file.empty() ? StatusOr<std::string>(std::string()) : ReadTokenFile(token_file),
      Connect(address, tls));
}

std::unique_ptr<Backend> MakeLocalBackend() { return std::make_unique<LocalBackend>(); }

}  // namespace memest::cli
