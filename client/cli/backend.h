// Where `memest` sends its requests: a memest-server over gRPC, or the engine in this process.
//
// Both backends speak the proto messages, so everything after them (rendering, --json, exit
// codes) is the same for --local and for a server. The local backend runs the service's
// handler without the RPC (HandleEstimate in server/estimator_service.h: size limits,
// conversion, engine, conversion back) and maps its status with the server's one status
// conversion, so a request fails with the same code and message locally and remotely.
#ifndef MEMEST_CLIENT_CLI_BACKEND_H_
#define MEMEST_CLIENT_CLI_BACKEND_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "client/cli/exit_codes.h"
#include "memest/v1/memest.pb.h"

namespace memest::cli {

// The outcome of one call: OK, or the exit code it maps to and a message for stderr that
// names the status code and, for input errors, the offending field.
struct CallResult {
  ExitCode exit_code = kExitFits;
  std::string message;
  bool ok() const { return message.empty() && exit_code == kExitFits; }
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual CallResult Estimate(const v1::EstimateRequest& request,
                              v1::EstimateResponse* response) = 0;
  virtual CallResult ListPresets(v1::ListPresetsResponse* response) = 0;
  virtual CallResult ListDevices(v1::ListDevicesResponse* response) = 0;
  // Streams Validate: each progress event goes to `progress`, the result into `result`.
  virtual CallResult Validate(const v1::ValidateRequest& request,
                              const std::function<void(const v1::ValidateProgress&)>& progress,
                              v1::ValidationResult* result) = 0;
  // Streams Plan: each event (a plan, then the summary) goes to `on_event` as it arrives.
  virtual CallResult Plan(const v1::PlanRequest& request,
                          const std::function<void(const v1::PlanEvent&)>& on_event) = 0;
  // Streams Sweep: each configuration's result goes to `on_result` as it arrives.
  virtual CallResult Sweep(const v1::SweepRequest& request,
                           const std::function<void(const v1::SweepResult&)>& on_result) = 0;
};

// How the CLI reaches a server that speaks TLS (memest-server --tls-cert): `enabled` (--tls) or
// any file given turns it on. The server's CA (--tls-ca; default: the system's roots), the
// client's certificate and key for mutual TLS (--tls-cert, --tls-key), and the name the
// server's certificate must carry when it is not the address's host (--tls-server-name).
struct ClientTls {
  bool enabled = false;
  std::string ca_file, cert_file, key_file, server_name;
  bool on() const {
    return enabled || !ca_file.empty() || !cert_file.empty() || !key_file.empty() ||
           !server_name.empty();
  }
};

// Calls memest.v1.MemoryEstimator at `address` (HOST:PORT), each call with a deadline of
// `deadline_ms`, in plaintext or over `tls`. With `token_file`, each call carries its bearer
// token (memest-server --auth-token-file). A file that cannot be read (the token, a certificate)
// fails every call as bad input naming its flag.
std::unique_ptr<Backend> MakeRemoteBackend(const std::string& address, int64_t deadline_ms,
                                           const std::string& token_file = "",
                                           const ClientTls& tls = {});

// Runs the engine in this process. It cannot validate: that needs a server with a GPU.
std::unique_ptr<Backend> MakeLocalBackend();

}  // namespace memest::cli

#endif  // MEMEST_CLIENT_CLI_BACKEND_H_
