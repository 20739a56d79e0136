#include "server/serve.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <spdlog/spdlog.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>

#include "engine/ir/text.h"
#include "server/wire.h"

namespace memest {
namespace {

constexpr char kServiceName[] = "memest.v1.MemoryEstimator";

// "127.0.0.1" from "127.0.0.1:50051", "[::1]" from "[::1]:0"; empty if there is no port.
std::string HostOf(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) return "";
  return address.substr(0, colon);
}

}  // namespace

EstimatorServer::EstimatorServer(const ServerOptions& options)
    : host_(HostOf(options.address)), service_(options.service) {}

EstimatorServer::~EstimatorServer() {
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now());
    server_->Wait();
  }
}

StatusOr<std::unique_ptr<EstimatorServer>> EstimatorServer::Start(const ServerOptions& options) {
  if (HostOf(options.address).empty()) {
    return InvalidArgument("address: expected HOST:PORT, got " + Quote(options.address));
  }
  if (options.max_message_bytes <= 0) {
    return InvalidArgument("max_message_bytes: must be positive, got " +
                           std::to_string(options.max_message_bytes));
  }
  if (options.service.max_ops <= 0) {
    return InvalidArgument("max_ops: must be positive, got " +
                           std::to_string(options.service.max_ops));
  }
  ServerOptions checked = options;
  if (!options.auth_token_file.empty()) {
    MEMEST_ASSIGN_OR_RETURN(std::unique_ptr<TokenAuth> auth,
                            TokenAuth::Open(options.auth_token_file));
    checked.service.auth = std::move(auth);
  }
  // Before any call is parsed: protobuf's log handler is not safe to replace while in use.
  InstallProtobufLogHandler();
  std::unique_ptr<EstimatorServer> server(new EstimatorServer(checked));

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.address, grpc::InsecureServerCredentials(), &server->port_);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  // A second server on a port in use must fail, not silently share it (SO_REUSEPORT).
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.RegisterService(&server->service_);
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    server->server_.reset();
    return Unavailable("could not listen on " + options.address);
  }
  if (grpc::HealthCheckServiceInterface* health = server->server_->GetHealthCheckService()) {
    health->SetServingStatus(kServiceName, true);
  }
  // Whether Validate can run here is asked once, now: the answer (or why not) is logged, and
  // Validate answers UNAVAILABLE with it. Estimate is unaffected either way.
  if (options.service.validation.device >= 0) {
    const Status probe = server->service_.validations().Probe();
    if (probe.ok()) {
      spdlog::info("validation on device {}: {}", options.service.validation.device, probe.message());
    } else {
      spdlog::warn("validation unavailable: {}", probe.message());
    }
  }
  return server;
}

std::string EstimatorServer::address() const { return host_ + ":" + std::to_string(port_); }

void EstimatorServer::Shutdown(std::chrono::system_clock::time_point deadline) {
  if (grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService()) {
    health->Shutdown();
  }
  server_->Shutdown(deadline);
}

void EstimatorServer::Wait() { server_->Wait(); }

}  // namespace memest
