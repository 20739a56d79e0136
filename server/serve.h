// A running memest gRPC server: the estimator service plus health checking and reflection,
// bound to one address. main.cc and the end-to-end tests start the server through here, so
// they run the same configuration.
#ifndef MEMEST_SERVER_SERVE_H_
#define MEMEST_SERVER_SERVE_H_

#include <grpcpp/server.h>

#include <chrono>
#include <memory>
#include <string>

#include "engine/ir/status.h"
#include "server/estimator_service.h"

namespace memest {

struct ServerOptions {
  // HOST:PORT to listen on, without TLS. Port 0 picks a free port (see EstimatorServer::port).
  std::string address = "127.0.0.1:50051";
  // The largest request accepted, in bytes; larger ones get RESOURCE_EXHAUSTED from gRPC.
  int max_message_bytes = 64 << 20;
  // A file holding the bearer token every estimator call must carry (server/auth.h); empty:
  // calls need none.
  std::string auth_token_file;
  ServiceOptions service;
};

class EstimatorServer {
 public:
  // Builds and starts the server: the estimator service, the standard health service
  // (grpc.health.v1.Health; SERVING for "" and "memest.v1.MemoryEstimator") and server
  // reflection. UNAVAILABLE if the address cannot be bound; INVALID_ARGUMENT for a bad option.
  static StatusOr<std::unique_ptr<EstimatorServer>> Start(const ServerOptions& options);

  ~EstimatorServer();  // shuts down immediately if Shutdown() was not called

  // The bound port (the chosen one when the address asked for port 0).
  int port() const { return port_; }
  // "<host>:<port>" with the bound port, e.g. "127.0.0.1:41027".
  std::string address() const;

  // Stops accepting calls, marks health NOT_SERVING, lets calls in flight finish until
  // `deadline`, then cancels the rest. Safe to call from any thread, more than once.
  void Shutdown(std::chrono::system_clock::time_point deadline);
  // Blocks until the server has shut down.
  void Wait();

 private:
  EstimatorServer(const ServerOptions& options);

  std::string host_;
  int port_ = 0;
  EstimatorService service_;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace memest

#endif  // MEMEST_SERVER_SERVE_H_
