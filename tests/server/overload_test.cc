// Overload (issue 13, section 4): estimates run on a bounded pool of threads (server/work_pool.h)
// so that health checks are answered whatever the load, a call beyond the queue is refused at
// once, a call whose caller left while it waited is never computed, and connections age out.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <future>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "server/status_conversion.h"
#include "server/work_pool.h"
#include "tests/server/health_client.h"
#include "tests/server/http_get.h"
#include "tests/server/test_server.h"

namespace memest {
namespace {

using ::testing::HasSubstr;
using testing::TestServer;
using Clock = std::chrono::steady_clock;
using Serving = grpc::health::v1::HealthCheckResponse;

// Polls `condition` every 5 ms for up to 10 s.
template <typename F>
bool WaitFor(F condition) {
  const Clock::time_point end = Clock::now() + std::chrono::seconds(10);
  while (!condition()) {
    if (Clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

TEST(WorkPoolTest, RunsJobsInOrderAndRefusesBeyondItsQueue) {
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::vector<int> order;
  std::mutex mu;
  {
    WorkPool pool(1, 2);
    EXPECT_TRUE(pool.TrySubmit([released] { released.wait(); }));
    ASSERT_TRUE(WaitFor([&] { return pool.load().running == 1; }));
    for (int i = 0; i < 2; ++i) {
      EXPECT_TRUE(pool.TrySubmit([&, i] {
        std::lock_guard<std::mutex> lock(mu);
        order.push_back(i);
      }));
    }
    EXPECT_FALSE(pool.TrySubmit([] { ADD_FAILURE() << "a refused job ran"; }));
    const WorkPool::Load load = pool.load();
    EXPECT_EQ(load.running, 1);
    EXPECT_EQ(load.queued, 2);
    EXPECT_EQ(load.refused, 1);
    release.set_value();
  }  // the destructor runs what is queued, then joins
  EXPECT_EQ(order, (std::vector<int>{0, 1}));
}

TEST(WorkPoolTest, AnIdleThreadTakesAJobEvenWithNoQueue) {
  WorkPool pool(2, 0);
  std::atomic<int> ran{0};
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  EXPECT_TRUE(pool.TrySubmit([&, released] {
    released.wait();
    ++ran;
  }));
  ASSERT_TRUE(WaitFor([&] { return pool.load().running == 1; }));
  EXPECT_TRUE(pool.TrySubmit([&, released] {
    released.wait();
    ++ran;
  }));
  ASSERT_TRUE(WaitFor([&] { return pool.load().running == 2; }));
  EXPECT_FALSE(pool.TrySubmit([&] { ++ran; }));
  release.set_value();
  ASSERT_TRUE(WaitFor([&] { return pool.load().running == 0; }));
  EXPECT_EQ(ran, 2);
}

TEST(WorkPoolTest, ReadsACgroupCpuLimit) {
  const std::string path = ::testing::TempDir() + "/cpu.max";
  const auto limit_of = [&](const char* text) {
    std::ofstream(path) << text;
    return CgroupCpuLimit(path);
  };
  EXPECT_EQ(limit_of("200000 100000\n"), 2);
  EXPECT_EQ(limit_of("150000 100000\n"), 2);  // 1.5 CPUs: rounded up
  EXPECT_EQ(limit_of("50000 100000\n"), 1);
  EXPECT_EQ(limit_of("max 100000\n"), 0);  // no limit
  EXPECT_EQ(limit_of("nonsense\n"), 0);
  EXPECT_EQ(limit_of("-5 100000\n"), 0);
  std::remove(path.c_str());
  EXPECT_EQ(CgroupCpuLimit(path), 0);
  EXPECT_GE(DefaultWorkThreads(), 1);
}

// Several seconds of one core without a budget, and a millisecond.
v1::EstimateRequest Slow() { return testing::Gpt2Request(4000); }
v1::EstimateRequest Quick() { return testing::Gpt2Request(2, /*advice=*/false); }

ServerOptions OneThread(int max_queued) {
  ServerOptions options;
  options.service.max_op_steps = int64_t{1} << 40;
  options.service.work_threads = 1;
  options.service.max_queued = max_queued;
  return options;
}

// One thread busy and one call queued: the next is refused at once, naming the flag, and health
// is answered promptly meanwhile.
TEST(OverloadTest, BeyondTheQueueACallIsRefusedAtOnceAndHealthStaysPrompt) {
  TestServer server(OneThread(1));
  std::vector<std::future<grpc::Status>> slow;
  for (int i = 0; i < 2; ++i) {
    slow.push_back(std::async(std::launch::async, [&] {
      v1::EstimateResponse response;
      return server.Estimate(Slow(), &response, std::chrono::seconds(3));
    }));
    ASSERT_TRUE(WaitFor([&] {
      const WorkPool::Load load = server.server().load();
      return load.running + load.queued == i + 1;
    }));
  }
  const Clock::time_point start = Clock::now();
  v1::EstimateResponse response;
  const grpc::Status refused = server.Estimate(Quick(), &response);
  EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(500));
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(), HasSubstr("--max-queued-estimates 1"));
  EXPECT_EQ(server.server().load().refused, 1);

  for (int i = 0; i < 5; ++i) {
    const Clock::time_point asked = Clock::now();
    EXPECT_EQ(testing::CheckHealth(server.channel(), ""), Serving::SERVING);
    EXPECT_LT(Clock::now() - asked, std::chrono::milliseconds(500)) << "health waited";
  }
  for (auto& call : slow) {
    EXPECT_NE(call.get().error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << "not taken";
  }
}

// Calls whose callers left while they waited (one past its deadline, one cancelled) are answered
// when their turn comes without being computed: the engine ran for the running call alone.
TEST(OverloadTest, CallsWhoseCallerLeftWhileTheyWaitedAreNotComputed) {
  ServerOptions options = OneThread(4);
  options.metrics_address = "127.0.0.1:0";
  TestServer server(options);
  auto first = std::async(std::launch::async, [&] {
    v1::EstimateResponse response;
    return server.Estimate(Slow(), &response, std::chrono::milliseconds(1500));
  });
  ASSERT_TRUE(WaitFor([&] { return server.server().load().running == 1; }));
  auto expired = std::async(std::launch::async, [&] {
    v1::EstimateResponse response;
    return server.Estimate(Slow(), &response, std::chrono::milliseconds(300));
  });
  grpc::ClientContext cancelled_context;
  auto cancelled = std::async(std::launch::async, [&] {
    v1::EstimateResponse response;
    return server.stub().Estimate(&cancelled_context, Slow(), &response);
  });
  ASSERT_TRUE(WaitFor([&] { return server.server().load().queued == 2; }));
  cancelled_context.TryCancel();
  EXPECT_EQ(expired.get().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(cancelled.get().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_EQ(first.get().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  ASSERT_TRUE(WaitFor([&] {
    const WorkPool::Load load = server.server().load();
    return load.running == 0 && load.queued == 0;
  }));
  const std::string metrics = testing::HttpGet(server.server().metrics_port(), "/metrics");
  EXPECT_THAT(metrics, HasSubstr("memest_queue_wait_seconds_count 3\n"));
  EXPECT_THAT(metrics, HasSubstr("memest_engine_seconds_count 1\n"))
      << "a call nobody waited for ran";
}

// An exception from the work is INTERNAL for its call, not the end of the process.
TEST(OverloadTest, AnExceptionIsInternalForItsCall) {
  const Status status = CatchAll([]() -> Status { throw std::bad_alloc(); });
  EXPECT_EQ(status.code(), StatusCode::kInternal);
  EXPECT_THAT(status.message(), HasSubstr("std::bad_alloc"));
  EXPECT_EQ(CatchAll([] { return Status::Ok(); }).code(), StatusCode::kOk);
}

// A Plan waits in the same queue and is refused the same way.
TEST(OverloadTest, APlanIsRefusedWhenTheQueueIsFull) {
  TestServer server(OneThread(0));
  auto slow = std::async(std::launch::async, [&] {
    v1::EstimateResponse response;
    return server.Estimate(Slow(), &response, std::chrono::seconds(2));
  });
  ASSERT_TRUE(WaitFor([&] { return server.server().load().running == 1; }));
  grpc::ClientContext context;
  v1::PlanRequest request;
  *request.mutable_model() = Quick().model();
  request.mutable_config()->set_batch_size(8);
  request.mutable_config()->set_device_name("a100-80gb");
  auto reader = server.stub().Plan(&context, request);
  v1::PlanEvent event;
  while (reader->Read(&event)) {
  }
  const grpc::Status status = reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(), HasSubstr("the server is busy"));
  EXPECT_EQ(slow.get().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
}

// A connection older than max_connection_age is closed (the channel goes idle, not failed); the
// next call reconnects.
TEST(OverloadTest, ConnectionsAgeOut) {
  ServerOptions options;
  options.max_connection_age = std::chrono::milliseconds(300);
  options.max_connection_age_grace = std::chrono::milliseconds(100);
  TestServer server(options);
  v1::EstimateResponse response;
  ASSERT_TRUE(server.Estimate(Quick(), &response).ok());
  EXPECT_EQ(server.channel()->GetState(false), GRPC_CHANNEL_READY);
  EXPECT_TRUE(WaitFor([&] { return server.channel()->GetState(false) != GRPC_CHANNEL_READY; }))
      << "the connection was not closed";
  EXPECT_TRUE(server.Estimate(Quick(), &response).ok());
}

TEST(OverloadTest, NegativeConnectionSettingsAreRefused) {
  ServerOptions options;
  options.address = "127.0.0.1:0";
  options.keepalive_time = std::chrono::milliseconds(-1);
  const auto server = EstimatorServer::Start(options);
  ASSERT_FALSE(server.ok());
  EXPECT_THAT(server.status().message(), HasSubstr("keepalive_time: must not be negative"));
}

}  // namespace
}  // namespace memest
