// memest-server: serves memest.v1.MemoryEstimator over gRPC.
//
//   memest-server --address 127.0.0.1:0
//
// Once listening it prints "memest-server listening on HOST:PORT" on stdout (the chosen port
// when asked for port 0), so scripts and tests can read the port. SIGTERM and SIGINT shut it
// down gracefully: calls in flight get --grace-seconds to finish; the exit status is then 0.
#include <pthread.h>
#include <signal.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <thread>

#include "server/serve.h"
#include "version/version.h"

namespace {

// SIGTERM and SIGINT, blocked in every thread so that only WaitForStopSignal sees them.
sigset_t StopSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  return signals;
}

// Returns the stop signal that arrived. Signals are taken synchronously (sigwait) on this
// thread, so no code runs in signal context at all.
int WaitForStopSignal(const sigset_t& signals) {
  int signal = 0;
  while (sigwait(&signals, &signal) != 0) {
  }
  return signal;
}

}  // namespace

int main(int argc, char** argv) {
  memest::ServerOptions options;
  std::string log_level = "info";
  double grace_seconds = 5.0;

  CLI::App app{"memest-server: predicts the GPU memory of PyTorch steps, over gRPC"};
  app.set_version_flag("--version", memest::VersionString("memest-server"),
                       "print the build's version and exit");
  app.add_option("--address", options.address, "HOST:PORT to listen on (port 0: any free port)")
      ->capture_default_str();
  app.add_option("--max-ops", options.service.max_ops,
                 "most ops or layers one request may declare or expand into")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-op-steps", options.service.max_op_steps,
                 "most op steps (ops simulated once each, forward, backward or recomputed) one "
                 "Estimate may spend, its advice included; 1.3-2.8 us each")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-message-bytes", options.max_message_bytes,
                 "largest request accepted, in bytes")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--auth-token-file", options.auth_token_file,
                 "a file holding the bearer token every estimator call must carry ('authorization: "
                 "Bearer <token>'); reread when it changes; health checks stay open");
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error, critical or off")
      ->capture_default_str()
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "critical", "off"}));
  app.add_option("--grace-seconds", grace_seconds,
                 "on SIGTERM/SIGINT, how long calls in flight may take to finish")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--device", options.service.validation.device,
                 "CUDA device to validate on (enables Validate); without it Validate is UNAVAILABLE")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--validate-worker", options.service.validation.worker_path,
                 "the memest-validate-worker binary (default: next to this one)");
  app.add_option("--max-queued-validations", options.service.validation.max_queued,
                 "validations that may wait while one runs; more are refused")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  int64_t max_validation_seconds = options.service.validation.max_duration.count();
  app.add_option("--max-validation-seconds", max_validation_seconds,
                 "the longest one validation may take, waiting included")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--validate-worker-arg", options.service.validation.worker_args,
                 "an extra argument for the worker (tests: --fake-device-gib=16)")
      ->group("");  // for tests; not in --help
  CLI11_PARSE(app, argc, argv);
  options.service.validation.max_duration = std::chrono::seconds(max_validation_seconds);

  // Logs go to stderr; stdout carries only the "listening on" line.
  spdlog::set_default_logger(spdlog::stderr_color_mt("memest-server"));
  spdlog::set_level(spdlog::level::from_str(log_level));

  // Block the stop signals before gRPC starts its threads, which inherit the mask.
  const sigset_t stop_signals = StopSignals();
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  auto server = memest::EstimatorServer::Start(options);
  if (!server.ok()) {
    spdlog::critical("cannot start: {}", server.status().ToString());
    return 1;
  }
  std::printf("memest-server listening on %s\n", (*server)->address().c_str());
  std::fflush(stdout);
  spdlog::info("{} listening on {} (max_ops={}, max_op_steps={}, max_message_bytes={})",
               memest::VersionString("memest-server"), (*server)->address(),
               options.service.max_ops, options.service.max_op_steps, options.max_message_bytes);

  std::thread stopper([&server, &stop_signals, grace_seconds] {
    const int signal = WaitForStopSignal(stop_signals);
    spdlog::info("received {}, shutting down (grace {}s)", signal == SIGTERM ? "SIGTERM" : "SIGINT",
                 grace_seconds);
    const auto grace = std::chrono::duration_cast<std::chrono::system_clock::duration>(
        std::chrono::duration<double>(grace_seconds));
    (*server)->Shutdown(std::chrono::system_clock::now() + grace);
  });
  (*server)->Wait();
  stopper.join();
  spdlog::info("stopped");
  return 0;
}
