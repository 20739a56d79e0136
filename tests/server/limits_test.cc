// What one Estimate may cost the server, end to end over gRPC: the op-step budget, the caller's
// deadline and cancellation (which must stop the engine, not just the call), and models whose
// expansion would pass the op limit.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/server/test_server.h"

namespace memest {
namespace {

using ::testing::HasSubstr;
using testing::TestServer;

// The process's CPU time (every thread's), in seconds.
double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

v1::EstimateRequest Gpt2(int64_t layers, bool advice) {
  return testing::Gpt2Request(layers, advice);
}

ServerOptions Unbudgeted() {
  ServerOptions options;
  options.service.max_op_steps = int64_t{1} << 40;
  return options;
}

// gpt2-small with 1,500 layers (67,512 ops) and advice takes seconds. A caller that gives it
// 300 ms gets DEADLINE_EXCEEDED, and the server's engine stops too: it spends next to no CPU
// after the deadline.
TEST(EstimateLimitsTest, TheCallersDeadlineStopsTheEngine) {
  TestServer server(Unbudgeted());
  v1::EstimateResponse response;
  grpc::Status status =
      server.Estimate(Gpt2(1500, true), &response, std::chrono::milliseconds(300));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  const double after_deadline = CpuSeconds();
  std::this_thread::sleep_for(std::chrono::seconds(1));
  EXPECT_LT(CpuSeconds() - after_deadline, 0.25) << "the engine kept computing for nobody";
}

TEST(EstimateLimitsTest, ACancelledCallStopsTheEngine) {
  TestServer server(Unbudgeted());
  grpc::ClientContext context;
  std::thread canceller([&context] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    context.TryCancel();
  });
  v1::EstimateResponse response;
  grpc::Status status = server.stub().Estimate(&context, Gpt2(1500, true), &response);
  canceller.join();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED);
  const double after_cancel = CpuSeconds();
  std::this_thread::sleep_for(std::chrono::seconds(1));
  EXPECT_LT(CpuSeconds() - after_cancel, 0.25) << "the engine kept computing for nobody";
}

TEST(EstimateLimitsTest, TheOpStepBudgetCutsAdviceShortOrRefusesTheEstimate) {
  ServerOptions options;
  options.service.max_op_steps = 5'000;  // one gpt2-small step of 12 layers is about 900
  TestServer server(options);
  v1::EstimateResponse response;
  grpc::Status status = server.Estimate(Gpt2(12, true), &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_THAT(response.notes(), ::testing::Contains(HasSubstr("advice cut short")));

  // 150 layers with SDPA attention (the default on CUDA): 5,562 ops, over at once.
  status = server.Estimate(Gpt2(150, false), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(), HasSubstr("model: one step of its 5562 ops"));
}

// A small request that would expand into a huge graph is refused before it is built: at once,
// and without the server's memory growing.
TEST(EstimateLimitsTest, ADeepPresetIsRefusedBeforeItIsExpanded) {
  TestServer server;
  v1::EstimateRequest request;
  request.mutable_model()->mutable_preset()->set_name("mlp");
  (*request.mutable_model()->mutable_preset()->mutable_params())["layers"] = 16'777'216;
  request.mutable_config()->set_batch_size(1);
  v1::EstimateResponse response;
  const auto start = std::chrono::steady_clock::now();
  grpc::Status status = server.Estimate(request, &response);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(500));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(),
              HasSubstr("model.preset.params.layers: mlp with 16777216 layers expands to"));
}

// This process's resident memory, in bytes (the server runs in it).
int64_t ResidentBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}

// Three large requests at once take hundreds of MiB; once they are answered the server gives the
// memory back instead of keeping it in the heap's arenas.
TEST(EstimateLimitsTest, MemoryReturnsToItsIdleLevelAfterLargeRequests) {
  TestServer server;
  v1::EstimateResponse response;
  ASSERT_TRUE(server.Estimate(Gpt2(12, true), &response).ok());
  const int64_t idle = ResidentBytes();
  std::vector<std::thread> clients;
  for (int i = 0; i < 3; ++i) {
    clients.emplace_back([&server] {
      v1::EstimateResponse r;
      EXPECT_TRUE(server.Estimate(Gpt2(600, true), &r).ok());
    });
  }
  for (std::thread& t : clients) t.join();
  // The pool thread that answered last trims the heap just after its reply: give it a second.
  for (int i = 0; i < 100 && ResidentBytes() - idle >= int64_t{32} << 20; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_LT(ResidentBytes() - idle, int64_t{32} << 20)
      << "idle " << (idle >> 20) << " MiB, after " << (ResidentBytes() >> 20) << " MiB";
}

}  // namespace
}  // namespace memest
