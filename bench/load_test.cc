// memest-load: a load test of the memest-server binary that stops by itself (issue 13, section 4;
// figures in docs/reliability.md).
//
// It starts memest-server (with the --server-arg flags given), then `--callers` clients, each on
// its own connection, send Estimate calls back to back for `--seconds` while a prober checks
// health every `--probe-ms` and the server's resident memory is read every second. It prints
// the calls by status code, their latencies, the health checks' latencies and the RSS over the
// run, and again after `--idle-seconds` without load.
//
// With `--sigterm-after S` the server gets SIGTERM S seconds in: the prober then sees
// NOT_SERVING, and the callers, like a load balancer that reads health, stop sending new calls
// once it does. Every call sent before must still succeed; the tool reports how many were in
// flight, how they ended, and when the server exited.
//
//   build/bin/memest-load --seconds 60 --callers 16 --mix mixed
//   build/bin/memest-load --seconds 20 --callers 16 --sigterm-after 10
//       --server-arg=--drain-delay-seconds=1 --server-arg=--grace-seconds=30   (one line)
//
// The exit status is 0 when every call succeeded (or was refused as busy with --allow-busy),
// every health check answered SERVING in time before SIGTERM, and the server exited 0.
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "bench/load_requests.h"
#include "client/cli/exit_codes.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "memest/v1/memest.grpc.pb.h"
#include "tests/cli/subprocess.h"

namespace memest {
namespace {

using Clock = std::chrono::steady_clock;
using HealthResponse = grpc::health::v1::HealthCheckResponse;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
double Millis(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// The resident set of `pid` in MiB, from /proc (0 once it is gone).
double RssMib(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string key;
  while (status >> key) {
    if (key == "VmRSS:") {
      double kib = 0;
      status >> kib;
      return kib / 1024;
    }
    status.ignore(1 << 10, '\n');
  }
  return 0;
}

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t i = std::min(values.size() - 1, static_cast<size_t>(p / 100 * values.size()));
  return values[i];
}

std::shared_ptr<grpc::Channel> NewConnection(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // its own connection
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

struct Results {
  std::mutex mu;
  std::map<std::string, int64_t> codes;                   // status code name -> calls
  std::vector<double> ok_ms;                              // latencies of the calls that succeeded
  std::map<std::string, std::string> first_error;         // code -> its first message
  std::map<std::string, std::pair<double, double>> when;  // code -> first and last, s into the run
  std::map<std::string, std::set<int>> callers;           // code -> the callers that got it
  int64_t sent_before_sigterm_in_flight = 0;              // calls in flight when SIGTERM was sent
  int64_t failed_after_sigterm = 0;                       // of those, how many did not succeed
};

struct Run {
  std::string address;
  Clock::time_point start, end;
  std::atomic<bool> draining{false};  // the prober saw NOT_SERVING: send nothing new
  std::atomic<bool> sigterm_sent{false};
  int deadline_ms = 60'000;
  std::string mix;
  Results results;
};

void Caller(Run& run, int index) {
  auto stub = v1::MemoryEstimator::NewStub(NewConnection(run.address));
  const std::vector<v1::EstimateRequest> requests = LoadRequests(run.mix);
  for (size_t n = index; Clock::now() < run.end && !run.draining; ++n) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::milliseconds(run.deadline_ms));
    v1::EstimateResponse response;
    const Clock::time_point start = Clock::now();
    const bool before_sigterm = !run.sigterm_sent;
    const grpc::Status status = stub->Estimate(&context, requests[n % requests.size()], &response);
    const double ms = Millis(Clock::now() - start);
    std::lock_guard<std::mutex> lock(run.results.mu);
    const std::string code = cli::GrpcCodeName(status.error_code());
    ++run.results.codes[code];
    if (status.ok()) run.results.ok_ms.push_back(ms);
    if (!status.ok() && run.results.first_error.count(code) == 0) {
      run.results.first_error[code] = status.error_message();
      run.results.when[code].first = Seconds(start - run.start);
    }
    if (!status.ok()) {
      run.results.when[code].second = Seconds(start - run.start);
      run.results.callers[code].insert(index);
    }
    if (before_sigterm && run.sigterm_sent) {  // in flight when the server was told to stop
      ++run.results.sent_before_sigterm_in_flight;
      if (!status.ok()) ++run.results.failed_after_sigterm;
    }
  }
}

struct Probe {
  std::vector<double> ms;  // health checks answered SERVING before SIGTERM
  int64_t failed = 0;      // before SIGTERM: not SERVING, an error, or later than the timeout
  double not_serving_after_sigterm_ms = -1;  // when NOT_SERVING was first seen
};

void Prober(Run& run, int every_ms, int timeout_ms, Probe* probe) {
  auto stub = grpc::health::v1::Health::NewStub(NewConnection(run.address));
  Clock::time_point sigterm_seen{};
  while (Clock::now() < run.end || (run.sigterm_sent && !run.draining)) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
    grpc::health::v1::HealthCheckRequest request;
    HealthResponse response;
    const bool after_sigterm = run.sigterm_sent;
    if (after_sigterm && sigterm_seen == Clock::time_point{}) sigterm_seen = Clock::now();
    const Clock::time_point start = Clock::now();
    const grpc::Status status = stub->Check(&context, request, &response);
    const bool serving = status.ok() && response.status() == HealthResponse::SERVING;
    if (after_sigterm && !serving) {
      probe->not_serving_after_sigterm_ms = Millis(Clock::now() - sigterm_seen);
      run.draining = true;
      return;
    }
    if (!after_sigterm) {
      if (serving) probe->ms.push_back(Millis(Clock::now() - start));
      if (!serving) ++probe->failed;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(every_ms));
  }
}

}  // namespace
}  // namespace memest

int main(int argc, char** argv) {
  using namespace memest;
  std::string server_binary = MEMEST_SERVER_BINARY;
  std::vector<std::string> server_args;
  double seconds = 60, sigterm_after = -1, idle_seconds = 5;
  int callers = 16, probe_ms = 250, probe_timeout_ms = 2000;
  bool allow_busy = false;
  Run run;
  run.mix = "mixed";
  CLI::App app{"memest-load: saturate a memest-server, probe its health, watch its memory"};
  app.add_option("--server", server_binary, "the memest-server binary")->capture_default_str();
  app.add_option("--server-arg", server_args, "a flag for the server (repeatable)");
  app.add_option("--seconds", seconds, "how long to send calls")->capture_default_str();
  app.add_option("--callers", callers, "concurrent callers, one call in flight each")
      ->capture_default_str();
  app.add_option("--mix", run.mix, "requests: " + LoadMixes())->capture_default_str();
  app.add_option("--deadline-ms", run.deadline_ms, "each call's deadline")->capture_default_str();
  app.add_option("--probe-ms", probe_ms, "health check period")->capture_default_str();
  app.add_option("--probe-timeout-ms", probe_timeout_ms, "a health check's deadline")
      ->capture_default_str();
  app.add_option("--sigterm-after", sigterm_after, "send SIGTERM this many seconds in");
  app.add_option("--idle-seconds", idle_seconds, "seconds without load before the last RSS")
      ->capture_default_str();
  app.add_flag("--allow-busy", allow_busy, "RESOURCE_EXHAUSTED (server busy) is no failure");
  CLI11_PARSE(app, argc, argv);
  if (LoadRequests(run.mix).empty()) {
    std::fprintf(stderr, "memest-load: --mix: expected %s\n", LoadMixes().c_str());
    return 2;
  }

  std::vector<std::string> command = {server_binary, "--address", "127.0.0.1:0", "--log-level",
                                      "warn"};
  command.insert(command.end(), server_args.begin(), server_args.end());
  testing::Child server(command);
  run.address = server.WaitForLine("memest-server listening on ", std::chrono::seconds(30));
  if (run.address.empty()) {
    std::fprintf(stderr, "memest-load: the server did not start:\n%s\n", server.Output().c_str());
    return 1;
  }
  const double rss_start = RssMib(server.pid());
  const Clock::time_point start = Clock::now();
  run.start = start;
  run.end =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));

  Probe probe;
  std::vector<std::thread> threads;
  threads.emplace_back(Prober, std::ref(run), probe_ms, probe_timeout_ms, &probe);
  for (int i = 0; i < callers; ++i) threads.emplace_back(Caller, std::ref(run), i);

  std::vector<double> rss;
  int exit_status = -1;
  double exit_after_s = -1;
  std::thread stopper;
  while (Clock::now() < run.end && !run.draining) {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    rss.push_back(RssMib(server.pid()));
    if (sigterm_after >= 0 && !run.sigterm_sent && Seconds(Clock::now() - start) >= sigterm_after) {
      run.sigterm_sent = true;
      stopper = std::thread([&] {
        const Clock::time_point sent = Clock::now();
        exit_status = server.Stop(SIGTERM);
        exit_after_s = Seconds(Clock::now() - sent);
      });
    }
  }
  for (std::thread& t : threads) t.join();
  const double elapsed = Seconds(Clock::now() - start);
  double rss_idle = 0;
  if (stopper.joinable()) {
    stopper.join();
  } else {
    std::this_thread::sleep_for(std::chrono::duration<double>(idle_seconds));
    rss_idle = RssMib(server.pid());
    exit_status = server.Stop(SIGTERM);
  }

  Results& r = run.results;
  int64_t calls = 0, failed = 0;
  std::printf("memest-load: %d callers, mix %s, %.1f s\n", callers, run.mix.c_str(), elapsed);
  for (const auto& [code, n] : r.codes) {
    calls += n;
    if (code != "OK" && !(allow_busy && code == "RESOURCE_EXHAUSTED")) failed += n;
    std::printf("  %-20s %lld", code.c_str(), static_cast<long long>(n));
    if (r.first_error.count(code)) {
      std::printf("  to %zu callers, sent %.1f s to %.1f s in; first: %s", r.callers[code].size(),
                  r.when[code].first, r.when[code].second,
                  r.first_error[code].substr(0, 160).c_str());
    }
    std::printf("\n");
  }
  std::printf("  calls %lld (%.1f/s), failed %lld\n", static_cast<long long>(calls),
              calls / elapsed, static_cast<long long>(failed));
  std::printf("  latency of OK calls ms: p50 %.1f  p90 %.1f  p99 %.1f  max %.1f\n",
              Percentile(r.ok_ms, 50), Percentile(r.ok_ms, 90), Percentile(r.ok_ms, 99),
              Percentile(r.ok_ms, 100));
  std::printf(
      "  health checks: %zu SERVING, %lld failed or late (> %d ms); ms p50 %.1f  p99 %.1f"
      "  max %.1f\n",
      probe.ms.size(), static_cast<long long>(probe.failed), probe_timeout_ms,
      Percentile(probe.ms, 50), Percentile(probe.ms, 99), Percentile(probe.ms, 100));
  // Flat means the last third of the run peaks no higher than the first third did.
  const auto peak = [&rss](size_t from, size_t to) {
    return from < to ? *std::max_element(rss.begin() + from, rss.begin() + to) : 0.0;
  };
  const size_t third = rss.size() / 3;
  std::printf(
      "  server RSS MiB: start %.1f, peak in the first third %.1f, in the last third "
      "%.1f, last %.1f",
      rss_start, peak(0, third), peak(rss.size() - third, rss.size()),
      rss.empty() ? 0 : rss.back());
  if (rss_idle > 0) std::printf(", idle %.0f s later %.1f", idle_seconds, rss_idle);
  std::printf("\n");
  if (run.sigterm_sent) {
    std::printf(
        "  SIGTERM at %.1f s: NOT_SERVING seen after %.0f ms; calls in flight %lld, "
        "failed %lld; server exited %d after %.2f s\n",
        sigterm_after, probe.not_serving_after_sigterm_ms,
        static_cast<long long>(r.sent_before_sigterm_in_flight),
        static_cast<long long>(r.failed_after_sigterm), exit_status, exit_after_s);
  }
  const bool good = failed == 0 && probe.failed == 0 && exit_status == 0 && calls > 0;
  if (!good)
    std::printf("memest-load: FAILED\n%s", exit_status != 0 ? server.Output().c_str() : "");
  return good ? 0 : 1;
}
