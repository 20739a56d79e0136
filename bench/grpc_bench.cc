// Loopback throughput of memest-server: starts the server in this process on 127.0.0.1:0,
// then `--threads` client threads (each on its own channel) issue blocking Estimate calls for
// GPT-2 small (batch 8, seq 1024, AdamW, bf16 autocast, A100 80GB) for `--seconds`, and
// prints requests per second and latency percentiles.
//
//   build/bin/grpc_bench --seconds 5 --threads 4
//   build/bin/grpc_bench --seconds 5 --threads 4 --skip-advice
#include <CLI/CLI.hpp>
#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

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

struct ThreadResult {
  std::vector<double> latencies_us;
  int64_t errors = 0;
  std::string first_error;
};

void RunClient(const std::string& address, const v1::EstimateRequest& request,
               Clock::time_point end, ThreadResult* result) {
  // One channel per thread: separate HTTP/2 connections, as independent clients would have.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  auto stub = v1::MemoryEstimator::NewStub(
      grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
  while (Clock::now() < end) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::EstimateResponse response;
    const Clock::time_point start = Clock::now();
    const grpc::Status status = stub->Estimate(&context, request, &response);
    const double us =
        std::chrono::duration<double, std::micro>(Clock::now() - start).count();
    if (status.ok()) {
      result->latencies_us.push_back(us);
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
  for (int i = 0; i < threads; ++i) {
    clients.emplace_back(memest::RunClient, address, std::cref(request), end, &results[i]);
  }
  for (std::thread& t : clients) t.join();
  const double elapsed = std::chrono::duration<double>(memest::Clock::now() - start).count();
  (*server)->Shutdown(std::chrono::system_clock::now());
  (*server)->Wait();

  std::vector<double> latencies;
  int64_t errors = 0;
  std::string first_error;
  for (const memest::ThreadResult& r : results) {
    latencies.insert(latencies.end(), r.latencies_us.begin(), r.latencies_us.end());
    if (r.errors > 0 && first_error.empty()) first_error = r.first_error;
    errors += r.errors;
  }
  std::sort(latencies.begin(), latencies.end());
  std::printf(
      "grpc_bench: Estimate(gpt2-small b8 s1024 adamw bf16 a100-80gb, advice %s) over "
      "loopback\n"
      "  threads %d, %.1f s: %zu ok, %lld errors\n"
      "  throughput %.1f requests/s\n"
      "  latency p50 %.2f ms, p90 %.2f ms, p99 %.2f ms, max %.2f ms\n",
      skip_advice ? "off" : "on", threads, elapsed, latencies.size(),
      static_cast<long long>(errors), static_cast<double>(latencies.size()) / elapsed,
      memest::Percentile(latencies, 50) / 1000, memest::Percentile(latencies, 90) / 1000,
      memest::Percentile(latencies, 99) / 1000,
      (latencies.empty() ? 0 : latencies.back()) / 1000);
  if (errors > 0) {
    std::fprintf(stderr, "grpc_bench: first error: %s\n", first_error.c_str());
    return 1;
  }
  return 0;
}
