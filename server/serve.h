// A running memest gRPC server: the estimator service plus health checking and reflection,
// bound to one address. main.cc and the end-to-end tests start the server through here, so
// they run the same configuration.
#ifndef MEMEST_SERVER_SERVE_H_
#define MEMEST_SERVER_SERVE_H_

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/server.h>

#include <chrono>
#include <memory>
#include <string>

#include "engine/ir/status.h"
#include "server/estimator_service.h"
#include "server/metrics.h"
#include "server/reflection.h"
#include "server/tls.h"

namespace memest {

struct ServerOptions {
  // HOST:PORT to listen on. Port 0 picks a free port (see EstimatorServer::port).
  std::string address = "127.0.0.1:50051";
  // TLS or mutual TLS on `address` (server/tls.h); none: plaintext.
  TlsOptions tls;
  // A second HOST:PORT, plaintext, that serves only grpc.health.v1 (the same statuses): for
  // probes that cannot speak TLS (Kubernetes' gRPC probe) or hold no client certificate. Empty:
  // none.
  std::string health_address;
  // HOST:PORT of an HTTP port serving Prometheus metrics at /metrics (server/metrics.h). Empty:
  // none.
  std::string metrics_address;
  // The build, as --version prints it: memest_build_info's label.
  std::string version;
  // The largest request accepted, in bytes; larger ones get RESOURCE_EXHAUSTED from gRPC.
  int max_message_bytes = 64 << 20;
  // A file holding the bearer token every estimator call must carry (server/auth.h); empty:
  // calls need none.
  std::string auth_token_file;
  // Connections. A connection is closed after `max_connection_age` (gRPC adds up to 10% of
  // jitter; zero: never), its calls given `max_connection_age_grace` to finish, so that clients
  // reconnect and Kubernetes spreads them over the replicas. The server pings a connection idle
  // for `keepalive_time` and drops it without an answer within `keepalive_timeout`; a client may
  // ping as often as every `min_client_ping_interval`, with or without calls (more often and the
  // connection is closed, "too_many_pings").
  std::chrono::milliseconds max_connection_age = std::chrono::minutes(5);
  std::chrono::milliseconds max_connection_age_grace = std::chrono::minutes(1);
  std::chrono::milliseconds keepalive_time = std::chrono::minutes(1);
  std::chrono::milliseconds keepalive_timeout = std::chrono::seconds(20);
  std::chrono::milliseconds min_client_ping_interval = std::chrono::seconds(10);
  ServiceOptions service;
};

class EstimatorServer {
 public:
  // Builds and starts the server: the estimator service, the standard health service
  // (grpc.health.v1.Health; SERVING for "" and "memest.v1.MemoryEstimator") and server
  // reflection. UNAVAILABLE if the address cannot be bound; INVALID_ARGUMENT for a bad option.
  static StatusOr<std::unique_ptr<EstimatorServer>> Start(const ServerOptions& options);

  ~EstimatorServer();  // shuts down immediately if Shutdown() was not called

  // The bound port (the chosen one when the address asked for port 0), and the health port's.
  int port() const { return port_; }
  int health_port() const { return health_port_; }
  int metrics_port() const { return metrics_ != nullptr ? metrics_->port() : 0; }
  // "<host>:<port>" with the bound port, e.g. "127.0.0.1:41027".
  std::string address() const;

  // Marks health NOT_SERVING for good, while calls are still taken: the first step of a drain,
  // so that load balancers that read health stop sending before the listener closes.
  void StopServing();
  // Stops serving (as StopServing), stops accepting calls, lets the calls in flight and those
  // queued for the work pool finish until `deadline`, then cancels the rest (the engine sees the
  // cancellation and stops). Safe to call from any thread, more than once.
  void Shutdown(std::chrono::system_clock::time_point deadline);
  // The estimates running and waiting now; the pool's threads and queue bound.
  WorkPool::Load load() const { return service_.work().load(); }
  int threads() const { return service_.work().threads(); }
  int max_queued() const { return service_.work().max_queued(); }
  // Blocks until the server has shut down.
  void Wait();

 private:
  EstimatorServer(const ServerOptions& options);

  std::string host_;
  int port_ = 0;
  int health_port_ = 0;
  EstimatorService service_;
  ReflectionV1 reflection_;  // grpc.reflection.v1; v1alpha is gRPC's plugin
  // After service_: its gauges read the service's pool and validation queue, so it stops serving
  // scrapes before they go. The servers below stop first, and with them the calls it counts.
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<grpc::Server> server_;
  grpc::CallbackGenericService unimplemented_;   // the health port's other methods
  std::unique_ptr<grpc::Server> health_server_;  // on health_address; null without one
};

}  // namespace memest

#endif  // MEMEST_SERVER_SERVE_H_
