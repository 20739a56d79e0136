// Loopback throughput of memest-server: starts the server in this process on 127.0.0.1:0,
// then `--threads` client threads (each on its own channel) issue blocking Estimate calls for
// GPT-2 small (batch 8, seq 1024, AdamW, bf16 autocast, A100 80GB) for `--seconds`, and
// prints requests per second and latency percentiles.
//
// With --sweep N each call is instead a Sweep of N run configurations of GPT-2 small (the grid
// SweepGrid lists, what a scheduler asks: skip_advice, no layer rows), and throughput counts
// estimates; the process's peak RSS (server and clients) is printed too.
//
//   build/bin/grpc_bench --seconds 5 --threads 4
//   build/bin/grpc_bench --seconds 5 --threads 4 --skip-advice
//   build/bin/grpc_bench --seconds 5 --threads 2 --sweep 96
#include <CLI/CLI.hpp>
#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "memest/v1/memest.grpc.pb.h"
#include "server/serve.h"

namespace memest {
namespace {

using Clock = std::chrono::steady_clock;

v1::EstimateRequest Gpt2SmallRequest(bool skip_advice) {
  v1::EstimateRequest request;
  v1::Preset* preset = request.mutable_model()->mutable_preset();
  preset->set_name("gpt2-small");
  (*preset->mutable_params())["seq"] = 1024;
  v1::RunConfig* config = request.mutable_config();
  config->set_batch_size(8);
  config->set_precision(v1::PRECISION_BF16_AMP);
  config->mutable_optimizer()->set_kind(v1::OPTIMIZER_KIND_ADAMW);
  config->set_device_name("a100-80gb");
  request.set_skip_advice(skip_advice);
  return request;
}

// `n` configurations of GPT-2 small at seq 1024 under bf16 autocast, cycling through micro-batches
// 1, 2, 4 and 8 (outermost), the A100 80GB, the H100 80GB and the L4, AdamW, SGD with momentum and
// Adam, and no checkpointing or every block (innermost): 96 before it repeats, 12 graphs.
v1::SweepRequest SweepGrid(int n) {
  v1::SweepRequest request;
  *request.mutable_model() = Gpt2SmallRequest(true).model();
  request.set_skip_advice(true);
  request.set_max_layer_rows(0);
  const char* devices[] = {"a100-80gb", "h100-80gb", "l4"};
  const v1::OptimizerKind optimizers[] = {v1::OPTIMIZER_KIND_ADAMW, v1::OPTIMIZER_KIND_SGD_MOMENTUM,
                                          v1::OPTIMIZER_KIND_ADAM};
  for (int i = 0; i < n; ++i) {
    const int k = i % 96;
    v1::RunConfig* c = request.add_configs();
    c->set_batch_size(int64_t{1} << (k / 24));
    c->set_precision(v1::PRECISION_BF16_AMP);
    c->set_device_name(devices[k / 8 % 3]);
    c->mutable_optimizer()->set_kind(optimizers[k / 2 % 3]);
    c->mutable_checkpoint()->set_policy(k % 2 == 0 ? v1::CHECKPOINT_POLICY_NONE
                                                   : v1::CHECKPOINT_POLICY_EVERY_BLOCK);
  }
  return request;
}

struct ThreadResult {
  std::vector<double> latencies_us;
  int64_t estimates = 0;
  int64_t errors = 0;
  std::string first_error;
};

// A stub on a channel of its own: separate HTTP/2 connections, as independent clients would have.
std::unique_ptr<v1::MemoryEstimator::Stub> OwnStub(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return v1::MemoryEstimator::NewStub(
      grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
}

void RunSweeps(const std::string& address, const v1::SweepRequest& request, Clock::time_point end,
               ThreadResult* result) {
  auto stub = OwnStub(address);
  while (Clock::now() < end) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    const Clock::time_point start = Clock::now();
    auto reader = stub->Sweep(&context, request);
    v1::SweepResult r;
    int64_t n = 0;
    while (reader->Read(&r)) {
      ++n;
      if (r.has_error() && result->errors++ == 0) result->first_error = r.error().message();
    }
    const grpc::Status status = reader->Finish();
    if (!status.ok() && result->errors++ == 0) result->first_error = status.error_message();
    result->estimates += n;
    result->latencies_us.push_back(
        std::chrono::duration<double, std::micro>(Clock::now() - start).count());
  }
}

void RunClient(const std::string& address, const v1::EstimateRequest& request,
               Clock::time_point end, ThreadResult* result) {
  auto stub = OwnStub(address);  // one channel per thread
  while (Clock::now() < end) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::EstimateResponse response;
    const Clock::time_point start = Clock::now();
    const grpc::Status status = stub->Estimate(&context, request, &response);
    const double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
    if (status.ok()) {
      result->latencies_us.push_back(us);
      ++result->estimates;
    } else {
      if (result->errors++ == 0) result->first_error = status.error_message();
    }
  }
}

double Percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const double rank = p / 100.0 * static_cast<double>(sorted.size());
  const size_t index = std::min(sorted.size() - 1, static_cast<size_t>(rank));
  return sorted[index];
}

}  // namespace
}  // namespace memest

int main(int argc, char** argv) {
  double seconds = 5;
  int threads = 4;
  bool skip_advice = false;
  CLI::App app{"memest gRPC loopback throughput: Estimate(gpt2-small) from concurrent clients"};
  app.add_option("--seconds", seconds, "how long to send requests")->capture_default_str();
  app.add_option("--threads", threads, "client threads, one blocking call in flight each")
      ->capture_default_str();
  app.add_flag("--skip-advice", skip_advice, "set skip_advice in every request");
  int sweep = 0;
  app.add_option("--sweep", sweep,
                 "send Sweeps of this many configurations instead of Estimates (0: Estimates)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  spdlog::set_level(spdlog::level::warn);  // the service logs every request at info

  // The server as memest-server runs it (health, reflection, limits), on a free port.
  memest::ServerOptions options;
  options.address = "127.0.0.1:0";
  auto server = memest::EstimatorServer::Start(options);
  if (!server.ok()) {
    std::fprintf(stderr, "grpc_bench: cannot start the server: %s\n",
                 server.status().ToString().c_str());
    return 1;
  }
  const std::string address = (*server)->address();
  const memest::v1::EstimateRequest request = memest::Gpt2SmallRequest(skip_advice);

  // One call first, so that a broken engine fails loudly instead of being timed.
  {
    auto stub = memest::v1::MemoryEstimator::NewStub(
        grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    memest::v1::EstimateResponse response;
    const grpc::Status status = stub->Estimate(&context, request, &response);
    if (!status.ok()) {
      std::fprintf(stderr, "grpc_bench: Estimate failed: %s\n", status.error_message().c_str());
      return 1;
    }
  }

  std::vector<memest::ThreadResult> results(threads);
  std::vector<std::thread> clients;
  const auto start = memest::Clock::now();
  const auto end = start + std::chrono::duration_cast<memest::Clock::duration>(
                               std::chrono::duration<double>(seconds));
  const memest::v1::SweepRequest grid = memest::SweepGrid(sweep);
  for (int i = 0; i < threads; ++i) {
    if (sweep > 0) {
      clients.emplace_back(memest::RunSweeps, address, std::cref(grid), end, &results[i]);
    } else {
      clients.emplace_back(memest::RunClient, address, std::cref(request), end, &results[i]);
    }
  }
  for (std::thread& t : clients) t.join();
  const double elapsed = std::chrono::duration<double>(memest::Clock::now() - start).count();
  (*server)->Shutdown(std::chrono::system_clock::now());
  (*server)->Wait();

  std::vector<double> latencies;
  int64_t errors = 0, estimates = 0;
  std::string first_error;
  for (const memest::ThreadResult& r : results) {
    latencies.insert(latencies.end(), r.latencies_us.begin(), r.latencies_us.end());
    if (r.errors > 0 && first_error.empty()) first_error = r.first_error;
    errors += r.errors;
    estimates += r.estimates;
  }
  std::sort(latencies.begin(), latencies.end());
  if (sweep > 0) {
    struct rusage usage;
    getrusage(RUSAGE_SELF, &usage);
    std::printf(
        "grpc_bench: Sweep(gpt2-small s1024, %d configurations: micro-batch x device x optimizer x "
        "checkpoint, skip_advice, no layer rows) over loopback\n"
        "  threads %d, %.1f s: %zu sweeps, %lld estimates, %lld errors\n"
        "  throughput %.1f estimates/s\n"
        "  sweep latency p50 %.1f ms, max %.1f ms; peak RSS of the process %.1f MiB\n",
        sweep, threads, elapsed, latencies.size(), static_cast<long long>(estimates),
        static_cast<long long>(errors), static_cast<double>(estimates) / elapsed,
        memest::Percentile(latencies, 50) / 1000, (latencies.empty() ? 0 : latencies.back()) / 1000,
        usage.ru_maxrss / 1024.0);
    if (errors > 0) std::fprintf(stderr, "grpc_bench: first error: %s\n", first_error.c_str());
    return errors > 0 ? 1 : 0;
  }
  std::printf(
      "grpc_bench: Estimate(gpt2-small b8 s1024 adamw bf16 a100-80gb, advice %s) over "
      "loopback\n"
      "  threads %d, %.1f s: %zu ok, %lld errors\n"
      "  throughput %.1f requests/s\n"
      "  latency p50 %.2f ms, p90 %.2f ms, p99 %.2f ms, max %.2f ms\n",
      skip_advice ? "off" : "on", threads, elapsed, latencies.size(),
      static_cast<long long>(errors), static_cast<double>(latencies.size()) / elapsed,
      memest::Percentile(latencies, 50) / 1000, memest::Percentile(latencies, 90) / 1000,
      memest::Percentile(latencies, 99) / 1000, (latencies.empty() ? 0 : latencies.back()) / 1000);
  if (errors > 0) {
    std::fprintf(stderr, "grpc_bench: first error: %s\n", first_error.c_str());
    return 1;
  }
  return 0;
}
