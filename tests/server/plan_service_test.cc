// The Plan RPC end to end: a real server (tests/server/test_server.h), plans streamed fewest
// GPUs first and then the summary; refusals name the field; the caller's deadline ends it.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "memest/v1/memest.grpc.pb.h"
#include "tests/server/test_server.h"

namespace memest {
namespace {

v1::PlanRequest Llama7b() {
  v1::PlanRequest request;
  v1::Preset* preset = request.mutable_model()->mutable_preset();
  preset->set_name("llama-7b");
  (*preset->mutable_params())["seq"] = 1024;
  request.mutable_config()->set_batch_size(16);
  request.mutable_config()->set_precision(v1::PRECISION_BF16_PURE);
  request.add_devices("a100-40gb");
  request.set_max_gpus(16);
  request.set_max_plans(4);
  return request;
}

grpc::Status Plan(testing::TestServer& server, const v1::PlanRequest& request,
                  std::vector<v1::PlanEvent>* events, int deadline_ms = 60'000) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(deadline_ms));
  auto reader = server.stub().Plan(&context, request);
  v1::PlanEvent e;
  while (reader->Read(&e)) events->push_back(e);
  return reader->Finish();
}

TEST(PlanServiceTest, StreamsPlansThenTheSummary) {
  testing::TestServer server;
  std::vector<v1::PlanEvent> events;
  const grpc::Status s = Plan(server, Llama7b(), &events);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(events.size(), 5u);  // four plans and the summary
  int64_t gpus = 0;
  for (size_t k = 0; k < 4; ++k) {
    ASSERT_TRUE(events[k].has_plan());
    const v1::ParallelPlan& p = events[k].plan();
    EXPECT_GE(p.gpus(), gpus);
    gpus = p.gpus();
    EXPECT_EQ(p.device(), "a100-40gb");
    EXPECT_GE(p.headroom_bytes(), 0);
    EXPECT_EQ(p.required_bytes() + p.headroom_bytes(), p.capacity_bytes());
  }
  EXPECT_GT(events[0].plan().gpus(), 1);  // the bf16 model states alone exceed one 40 GB GPU
  ASSERT_TRUE(events[4].has_summary());
  EXPECT_EQ(events[4].summary().plans(), 4);
  EXPECT_GT(events[4].summary().estimates(), 4);
}

// With host memory for offload, one 40 GB A100 takes Llama-7B: the plan carries its offload
// flags, the host memory it takes and the bytes it moves.
TEST(PlanServiceTest, OffloadPlansCarryTheirHostMemory) {
  testing::TestServer server;
  v1::PlanRequest request = Llama7b();
  request.set_max_gpus(1);
  request.set_host_memory_per_gpu_bytes(int64_t{256} << 30);
  std::vector<v1::PlanEvent> events;
  const grpc::Status s = Plan(server, request, &events);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_GE(events.size(), 2u);
  const v1::ParallelPlan& p = events[0].plan();
  EXPECT_EQ(p.gpus(), 1);
  EXPECT_TRUE(p.parallelism().offload_optimizer());
  EXPECT_GT(p.host_bytes(), 0u);
  EXPECT_LE(p.host_bytes(), uint64_t{256} << 30);
  EXPECT_GT(p.host_transfer_bytes_per_step(), 0u);
}

TEST(PlanServiceTest, RefusalsNameTheFieldAndTheDeadlineEndsTheSearch) {
  testing::TestServer server;
  std::vector<v1::PlanEvent> events;
  v1::PlanRequest accum = Llama7b();
  accum.mutable_config()->set_grad_accum_steps(4);
  grpc::Status s = Plan(server, accum, &events);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("config.grad_accum_steps"), std::string::npos);
  v1::PlanRequest unknown = Llama7b();
  unknown.add_devices("tpu-v5");
  s = Plan(server, unknown, &events);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("devices"), std::string::npos);
  v1::PlanRequest big = Llama7b();
  big.mutable_model()->mutable_preset()->set_name("llama-70b");
  (*big.mutable_model()->mutable_preset()->mutable_params())["seq"] = 4096;
  big.mutable_config()->set_batch_size(1024);
  big.set_max_gpus(1024);
  big.clear_devices();
  big.add_devices("h100-80gb");
  s = Plan(server, big, &events, 300);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
}

}  // namespace
}  // namespace memest
