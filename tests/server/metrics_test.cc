// Prometheus metrics (server/metrics.h) scraped over HTTP from a real server after real calls.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "tests/server/http_get.h"
#include "tests/server/test_server.h"

namespace memest {
namespace {

using ::testing::HasSubstr;
using testing::TestServer;

v1::EstimateRequest Gpt2(int64_t batch) {
  v1::EstimateRequest request;
  request.mutable_model()->mutable_preset()->set_name("gpt2-small");
  (*request.mutable_model()->mutable_preset()->mutable_params())["layers"] = 2;
  request.mutable_config()->set_batch_size(batch);
  request.set_skip_advice(true);
  return request;
}

TEST(MetricsTest, CountsCallsByMethodAndCodeWithLatenciesAndLoad) {
  ServerOptions options;
  options.metrics_address = "127.0.0.1:0";
  options.version = "memest-server test";
  options.service.work_threads = 1;
  options.service.max_queued = 3;
  TestServer server(options);
  ASSERT_NE(server.server().metrics_port(), 0);
  v1::EstimateResponse response;
  ASSERT_TRUE(server.Estimate(Gpt2(2), &response).ok());
  ASSERT_TRUE(server.Estimate(Gpt2(4), &response).ok());
  ASSERT_EQ(server.Estimate(Gpt2(-1), &response).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  grpc::ClientContext context;
  v1::ListDevicesResponse devices;
  ASSERT_TRUE(server.stub().ListDevices(&context, {}, &devices).ok());

  // A pool thread counts itself done just after it replied.
  for (int i = 0; i < 200 && server.server().load().running > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const std::string text = testing::HttpGet(server.server().metrics_port(), "/metrics");
  EXPECT_THAT(text, HasSubstr("200 OK"));
  EXPECT_THAT(text, HasSubstr("memest_requests_total{code=\"OK\",method=\"Estimate\"} 2\n"));
  EXPECT_THAT(
      text, HasSubstr("memest_requests_total{code=\"INVALID_ARGUMENT\",method=\"Estimate\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("memest_requests_total{code=\"OK\",method=\"ListDevices\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("memest_request_duration_seconds_count{method=\"Estimate\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("memest_request_bytes_count{method=\"Estimate\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("memest_queue_wait_seconds_count 3\n"));
  // Every estimate that got its turn, the one its conversion refused included.
  EXPECT_THAT(text, HasSubstr("memest_engine_seconds_count 3\n"));
  EXPECT_THAT(text, HasSubstr("memest_work_threads 1\n"));
  EXPECT_THAT(text, HasSubstr("memest_work_queue_limit 3\n"));
  EXPECT_THAT(text, HasSubstr("memest_work_running 0\n"));
  EXPECT_THAT(text, HasSubstr("memest_work_refused_total 0\n"));
  EXPECT_THAT(text, HasSubstr("memest_build_info{version=\"memest-server test\"} 1\n"));
}

TEST(MetricsTest, AnAddressThatCannotBeBoundRefusesTheStart) {
  ServerOptions first;
  first.metrics_address = "127.0.0.1:0";
  TestServer server(first);
  ServerOptions second;
  second.address = "127.0.0.1:0";
  second.metrics_address = "127.0.0.1:" + std::to_string(server.server().metrics_port());
  const auto refused = EstimatorServer::Start(second);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(refused.status().message(), HasSubstr("metrics_address: could not listen on"));
}

}  // namespace
}  // namespace memest
