#include "server/serve.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

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

// Drops the builder's plugins: the reflection plugin registers itself for every server built
// in the process, and the health port must serve health alone.
class WithoutPlugins final : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    plugins->clear();
  }
};

int Millis(std::chrono::milliseconds duration) {
  return static_cast<int>(std::min<int64_t>(duration.count(), std::numeric_limits<int>::max()));
}

void AddConnectionArguments(const ServerOptions& options, grpc::ServerBuilder& builder) {
  if (options.max_connection_age.count() > 0) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS, Millis(options.max_connection_age));
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS,
                               Millis(options.max_connection_age_grace));
  }
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, Millis(options.keepalive_time));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, Millis(options.keepalive_timeout));
  // Clients' pings: accepted without calls too, as often as the interval allows.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             Millis(options.min_client_ping_interval));
}

}  // namespace

EstimatorServer::EstimatorServer(const ServerOptions& options)
    : host_(HostOf(options.address)),
      service_(options.service),
      reflection_({kServiceName, "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection",
                   "grpc.reflection.v1alpha.ServerReflection"}) {}

EstimatorServer::~EstimatorServer() {
  for (grpc::Server* server : {server_.get(), health_server_.get()}) {
    if (server == nullptr) continue;
    server->Shutdown(std::chrono::system_clock::now());
    server->Wait();
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
  for (const auto& [name, value] :
       {std::pair{"max_connection_age", options.max_connection_age},
        {"max_connection_age_grace", options.max_connection_age_grace},
        {"keepalive_time", options.keepalive_time},
        {"keepalive_timeout", options.keepalive_timeout},
        {"min_client_ping_interval", options.min_client_ping_interval}}) {
    if (value.count() < 0) {
      return InvalidArgument(std::string(name) + ": must not be negative, got " +
                             std::to_string(value.count()) + " ms");
    }
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
  if (!options.metrics_address.empty()) {
    const EstimatorService& service = server->service_;
    Metrics::Sources sources;
    sources.work = [&service] { return service.work().load(); };
    sources.threads = service.work().threads();
    sources.max_queued = service.work().max_queued();
    ValidationRunner* validations = &server->service_.validations();
    sources.validations_in_queue = [validations] { return validations->in_queue(); };
    sources.version = options.version;
    MEMEST_ASSIGN_OR_RETURN(server->metrics_, Metrics::Start(options.metrics_address, sources));
    server->service_.set_metrics(server->metrics_.get());
  }

  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials();
  if (options.tls.enabled()) {
    MEMEST_ASSIGN_OR_RETURN(credentials, WatchedTlsCredentials(options.tls));
  }
  if (!options.health_address.empty() && HostOf(options.health_address).empty()) {
    return InvalidArgument("health_address: expected HOST:PORT, got " +
                           Quote(options.health_address));
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.address, credentials, &server->port_);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  // A second server on a port in use must fail, not silently share it (SO_REUSEPORT).
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  AddConnectionArguments(options, builder);
  builder.RegisterService(&server->service_);
  builder.RegisterService(&server->reflection_);
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    server->server_.reset();
    return Unavailable("could not listen on " + options.address);
  }
  if (grpc::HealthCheckServiceInterface* health = server->server_->GetHealthCheckService()) {
    health->SetServingStatus(kServiceName, true);
  }
  if (!options.health_address.empty()) {
    // Its own server: a port of the main one would serve every service, in plaintext.
    grpc::ServerBuilder health_builder;
    health_builder.AddListeningPort(options.health_address, grpc::InsecureServerCredentials(),
                                    &server->health_port_);
    health_builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
    health_builder.SetOption(std::make_unique<WithoutPlugins>());
    // Every other method is UNIMPLEMENTED; a server needs one service of its own to start (the
    // default health service is added after that check).
    health_builder.RegisterCallbackGenericService(&server->unimplemented_);
    server->health_server_ = health_builder.BuildAndStart();
    if (server->health_server_ == nullptr || server->health_port_ == 0) {
      server->health_server_.reset();
      return Unavailable("could not listen on " + options.health_address + " (health_address)");
    }
    if (grpc::HealthCheckServiceInterface* health =
            server->health_server_->GetHealthCheckService()) {
      health->SetServingStatus(kServiceName, true);
    }
  }
  // Whether Validate can run here is asked once, now: the answer (or why not) is logged, and
  // Validate answers UNAVAILABLE with it. Estimate is unaffected either way.
  if (options.service.validation.device >= 0) {
    const Status probe = server->service_.validations().Probe();
    if (probe.ok()) {
      spdlog::info("validation on device {}: {}", options.service.validation.device,
                   probe.message());
    } else {
      spdlog::warn("validation unavailable: {}", probe.message());
    }
  }
  return server;
}

std::string EstimatorServer::address() const { return host_ + ":" + std::to_string(port_); }

void EstimatorServer::StopServing() {
  for (grpc::Server* server : {server_.get(), health_server_.get()}) {
    if (server == nullptr) continue;
    if (grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService()) {
      health->Shutdown();  // every service NOT_SERVING, and no later change
    }
  }
}

void EstimatorServer::Shutdown(std::chrono::system_clock::time_point deadline) {
  StopServing();
  server_->Shutdown(deadline);
  if (health_server_ != nullptr) health_server_->Shutdown(deadline);
}

void EstimatorServer::Wait() {
  server_->Wait();
  if (health_server_ != nullptr) health_server_->Wait();
}

}  // namespace memest
