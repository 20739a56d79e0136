// memest-server: serves memest.v1.MemoryEstimator over gRPC.
//
//   memest-server --address 127.0.0.1:0
//
// Once listening it prints "memest-server listening on HOST:PORT" on stdout (the chosen port
// when asked for port 0), so scripts and tests can read the port. SIGTERM and SIGINT drain it:
// health says NOT_SERVING at once while calls are still taken for --drain-delay-seconds (load
// balancers stop sending), then the listener closes and the calls in flight and queued get
// --grace-seconds to finish; the rest are cancelled, and the exit status is 0.
#include <pthread.h>
#include <signal.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <iostream>
#include <string>
#include <thread>

#include "server/json_log.h"
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

// Durations in seconds: finite, at most a year, and not between 0 and 1 ms (which would round
// to 0, "never" for some of them).
constexpr double kMaxSeconds = 365 * 24 * 3600;
const auto kSeconds = CLI::Validator(
    [](std::string& text) -> std::string {
      double value = 0;
      try {
        value = std::stod(text);
      } catch (const std::exception&) {
        return "not a number of seconds: " + text;
      }
      if (!std::isfinite(value) || value < 0 || value > kMaxSeconds) {
        return "seconds: expected 0 to " + std::to_string(static_cast<int64_t>(kMaxSeconds)) +
               ", got " + text;
      }
      if (value > 0 && value < 0.001) return "seconds: at least 0.001 when not 0, got " + text;
      return "";
    },
    "SECONDS");

std::chrono::milliseconds Millis(double seconds) {
  return std::chrono::milliseconds(std::llround(seconds * 1000));
}

}  // namespace

int main(int argc, char** argv) {
  memest::ServerOptions options;
  std::string log_level = "info";
  double grace_seconds = 30.0;
  double drain_delay_seconds = 0;
  double max_connection_age_seconds = 300, max_connection_age_grace_seconds = 60;
  double keepalive_seconds = 60, min_client_ping_seconds = 10;

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
  app.add_option("--max-sweep-configs", options.service.max_sweep_configs,
                 "most run configurations one Sweep may ask for (each an Estimate of its own)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-sweep-op-steps", options.service.max_sweep_op_steps,
                 "most op steps one Sweep's configurations may spend together; the ones past it "
                 "are refused")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-message-bytes", options.max_message_bytes,
                 "largest request accepted, in bytes")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--auth-token-file", options.auth_token_file,
                 "a file holding the bearer token every estimator call must carry ('authorization: "
                 "Bearer <token>'); reread when it changes; health checks stay open");
  app.add_option("--tls-cert", options.tls.cert_file,
                 "the server's certificate chain (PEM): serve TLS only; reread when it changes")
      ->group("TLS");
  app.add_option("--tls-key", options.tls.key_file, "the certificate's private key (PEM)")
      ->group("TLS");
  app.add_option("--tls-client-ca", options.tls.client_ca_file,
                 "mutual TLS: every client must present a certificate that chains to this CA "
                 "(PEM)")
      ->group("TLS");
  int64_t tls_reload_seconds = options.tls.reload_interval.count();
  app.add_option("--tls-reload-seconds", tls_reload_seconds,
                 "how often the certificate files are checked for changes")
      ->capture_default_str()
      ->check(CLI::Range(1, 31536000))
      ->group("TLS");
  app.add_option("--health-address", options.health_address,
                 "HOST:PORT of a plaintext port serving only grpc.health.v1, for probes that "
                 "cannot speak TLS (Kubernetes' gRPC probe)");
  app.add_option("--metrics-address", options.metrics_address,
                 "HOST:PORT of an HTTP port serving Prometheus metrics at /metrics");
  std::string log_format = "text";
  app.add_option("--log-format", log_format,
                 "text, or json: one JSON object a line, a call's fields (rpc, id, model, code, "
                 "us, peer, error) as keys")
      ->capture_default_str()
      ->check(CLI::IsMember({"text", "json"}));
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error, critical or off")
      ->capture_default_str()
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "critical", "off"}));
  app.add_option("--work-threads", options.service.work_threads,
                 "threads that run estimates and plans (0: one per core the process may use)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1024));
  app.add_option("--max-queued-estimates", options.service.max_queued,
                 "estimates and plans that may wait for a thread; more are refused at once "
                 "(RESOURCE_EXHAUSTED); -1: 8 per thread")
      ->capture_default_str()
      ->check(CLI::Range(-1, 1 << 20));
  app.add_option("--drain-delay-seconds", drain_delay_seconds,
                 "on SIGTERM/SIGINT, how long health says NOT_SERVING while calls are still "
                 "taken, before the listener closes")
      ->capture_default_str()
      ->check(kSeconds);
  app.add_option("--grace-seconds", grace_seconds,
                 "then how long calls in flight and queued may take to finish")
      ->capture_default_str()
      ->check(kSeconds);
  app.add_option("--max-connection-age-seconds", max_connection_age_seconds,
                 "close a connection this old (clients reconnect and spread over replicas); 0: "
                 "never")
      ->capture_default_str()
      ->check(kSeconds);
  app.add_option("--max-connection-age-grace-seconds", max_connection_age_grace_seconds,
                 "how long an aged connection's calls may take to finish")
      ->capture_default_str()
      ->check(kSeconds);
  app.add_option("--keepalive-seconds", keepalive_seconds,
                 "ping a connection idle this long; drop it if the ping is not answered in 20 s")
      ->capture_default_str()
      ->check(kSeconds & CLI::PositiveNumber);
  app.add_option("--min-client-ping-seconds", min_client_ping_seconds,
                 "the shortest interval between a client's keepalive pings; faster pingers are "
                 "disconnected (too_many_pings)")
      ->capture_default_str()
      ->check(kSeconds);
  app.add_option(
         "--device", options.service.validation.device,
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
  options.tls.reload_interval = std::chrono::seconds(tls_reload_seconds);
  options.version = memest::VersionString("memest-server");
  options.max_connection_age = Millis(max_connection_age_seconds);
  options.max_connection_age_grace = Millis(max_connection_age_grace_seconds);
  options.keepalive_time = Millis(keepalive_seconds);
  options.min_client_ping_interval = Millis(min_client_ping_seconds);

  // Logs go to stderr; stdout carries only the "listening on" line.
  if (log_format == "json") {
    spdlog::set_default_logger(spdlog::stderr_logger_mt("memest-server"));
    memest::UseJsonLogs(*spdlog::default_logger());
  } else {
    spdlog::set_default_logger(spdlog::stderr_color_mt("memest-server"));
  }
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
  spdlog::info(
      "{} listening on {} (work_threads={}, max_queued={}, max_ops={}, max_op_steps={}, "
      "max_message_bytes={})",
      memest::VersionString("memest-server"), (*server)->address(), (*server)->threads(),
      (*server)->max_queued(), options.service.max_ops, options.service.max_op_steps,
      options.max_message_bytes);
  if ((*server)->metrics_port() != 0) {
    spdlog::info("metrics on http port {} at /metrics", (*server)->metrics_port());
  }
  if ((*server)->health_port() != 0) {
    spdlog::info("health checks, plaintext, on port {}", (*server)->health_port());
  }
  if (options.tls.enabled()) {
    spdlog::info("TLS{} with {} (reread every {}s)",
                 options.tls.client_ca_file.empty()
                     ? ""
                     : ", clients verified against " + options.tls.client_ca_file,
                 options.tls.cert_file, tls_reload_seconds);
  }

  std::thread stopper([&server, &stop_signals, grace_seconds, drain_delay_seconds] {
    const int signal = WaitForStopSignal(stop_signals);
    const auto load = (*server)->load();
    spdlog::info(
        "received {}: NOT_SERVING; {} estimates running, {} queued; closing in {}s, "
        "then a grace of {}s",
        signal == SIGTERM ? "SIGTERM" : "SIGINT", load.running, load.queued, drain_delay_seconds,
        grace_seconds);
    (*server)->StopServing();
    std::this_thread::sleep_for(Millis(drain_delay_seconds));
    (*server)->Shutdown(std::chrono::system_clock::now() + Millis(grace_seconds));
  });
  (*server)->Wait();
  stopper.join();
  spdlog::info("stopped");
  return 0;
}
