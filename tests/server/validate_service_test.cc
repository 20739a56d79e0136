// Validate end to end: a real server on port 0 whose worker runs a fake device (so the queue,
// the stream, deadlines, cancellation and a crashing worker are all exercised without a GPU),
// and a server without --device.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "memest/v1/memest.grpc.pb.h"
#include "server/serve.h"

namespace memest {
namespace {

using Clock = std::chrono::system_clock;

struct Server {
  explicit Server(std::vector<std::string> worker_args, int device = 0, int max_queued = 8,
                  std::chrono::seconds max_duration = std::chrono::seconds(600)) {
    ServerOptions o;
    o.address = "127.0.0.1:0";
    o.service.validation.device = device;
    o.service.validation.worker_path = MEMEST_WORKER_BINARY;
    o.service.validation.worker_args = std::move(worker_args);
    o.service.validation.max_queued = max_queued;
    o.service.validation.kill_grace = std::chrono::milliseconds(500);
    o.service.validation.max_duration = max_duration;
    auto s = EstimatorServer::Start(o);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    server = std::move(s).value();
    stub = v1::MemoryEstimator::NewStub(
        grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials()));
  }
  std::unique_ptr<EstimatorServer> server;
  std::unique_ptr<v1::MemoryEstimator::Stub> stub;
};

v1::ValidateRequest Request(const std::string& preset = "mlp", int64_t batch = 16) {
  v1::ValidateRequest r;
  r.mutable_model()->mutable_preset()->set_name(preset);
  r.mutable_config()->set_batch_size(batch);
  r.set_repeats(1);
  return r;
}

struct Call {
  grpc::Status status;
  std::vector<v1::ValidateEvent> events;
  bool has_result() const { return !events.empty() && events.back().has_result(); }
};

Call Validate(v1::MemoryEstimator::Stub& stub, const v1::ValidateRequest& request,
              std::chrono::milliseconds deadline = std::chrono::seconds(60),
              grpc::ClientContext* context_out = nullptr) {
  grpc::ClientContext local;
  grpc::ClientContext& context = context_out ? *context_out : local;
  context.set_deadline(Clock::now() + deadline);
  Call call;
  auto reader = stub.Validate(&context, request);
  v1::ValidateEvent e;
  while (reader->Read(&e)) call.events.push_back(e);
  call.status = reader->Finish();
  return call;
}

TEST(ValidateService, StreamsProgressThenTheResult) {
  Server s({"--fake-device-gib", "16"});
  Call c = Validate(*s.stub, Request("gpt2-small", 2));
  ASSERT_TRUE(c.status.ok()) << c.status.error_message();
  ASSERT_TRUE(c.has_result());
  const v1::ValidationResult& r = c.events.back().result();
  EXPECT_EQ(r.device().name(), "memest fake device");
  EXPECT_EQ(r.batch_size(), 2u);
  EXPECT_GT(r.peak_allocated().measured_bytes(), 0u);
  EXPECT_EQ(r.peak_allocated().measured_bytes(), r.peak_allocated().predicted_bytes());
  EXPECT_GT(r.ops_size(), 100);
  EXPECT_GT(r.step_milliseconds(), 0);
  bool replaying = false;
  for (const auto& e : c.events) {
    replaying |= e.has_progress() &&
                 e.progress().stage() == v1::ValidateProgress::STAGE_REPLAYING &&
                 e.progress().ops_total() > 0;
  }
  EXPECT_TRUE(replaying);
}

TEST(ValidateService, WithoutADeviceValidateIsUnavailableAndEstimateWorks) {
  Server s({}, /*device=*/-1);
  Call c = Validate(*s.stub, Request());
  EXPECT_EQ(c.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(c.status.error_message().find("without --device"), std::string::npos)
      << c.status.error_message();
  grpc::ClientContext ctx;
  v1::EstimateRequest er;
  er.mutable_model()->mutable_preset()->set_name("mlp");
  er.mutable_config()->set_batch_size(4);
  v1::EstimateResponse resp;
  EXPECT_TRUE(s.stub->Estimate(&ctx, er, &resp).ok());
}

TEST(ValidateService, ADeviceThatCannotOpenIsUnavailableWithTheReason) {
  // No GPU here and, without --fake-device-gib, the worker tries CUDA (or was built without it).
  Server s({}, /*device=*/7);
  Call c = Validate(*s.stub, Request());
  EXPECT_EQ(c.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(c.status.error_message().find("device 7 cannot validate"), std::string::npos)
      << c.status.error_message();
}

TEST(ValidateService, BadInputNamesTheFieldBeforeQueueing) {
  Server s({"--fake-device-gib", "16"});
  v1::ValidateRequest r = Request();
  r.mutable_config()->set_batch_size(-3);
  Call c = Validate(*s.stub, r);
  EXPECT_EQ(c.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(c.status.error_message().find("config.batch_size"), std::string::npos)
      << c.status.error_message();
  r = Request();
  r.set_repeats(1000);
  c = Validate(*s.stub, r);
  EXPECT_EQ(c.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(c.status.error_message().find("repeats"), std::string::npos);
}

TEST(ValidateService, RefusesWhatDoesNotFitSayingByHowMuch) {
  Server s({"--fake-device-gib", "2"});
  Call c = Validate(*s.stub, Request("gpt2-small", 8));
  EXPECT_EQ(c.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(c.status.error_message().find("short by"), std::string::npos)
      << c.status.error_message();
}

TEST(ValidateService, ACrashingWorkerFailsOneValidationNotTheServer) {
  Server s({"--fake-device-gib", "16", "--fake-abort-after-runs", "3"});
  Call c = Validate(*s.stub, Request());
  EXPECT_EQ(c.status.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_NE(c.status.error_message().find("SIGABRT"), std::string::npos)
      << c.status.error_message();
  // The server still answers.
  grpc::ClientContext ctx;
  v1::ListPresetsResponse presets;
  EXPECT_TRUE(s.stub->ListPresets(&ctx, {}, &presets).ok());
}

TEST(ValidateService, TheDeadlineStopsARunningValidation) {
  Server s({"--fake-device-gib", "16", "--fake-run-ms", "50"});
  const auto start = std::chrono::steady_clock::now();
  Call c = Validate(*s.stub, Request("gpt2-small", 2), std::chrono::milliseconds(1500));
  EXPECT_EQ(c.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  // The next one gets the device.
  Server fast({"--fake-device-gib", "16"});
  EXPECT_TRUE(Validate(*fast.stub, Request()).status.ok());
}

TEST(ValidateService, ACallWithoutADeadlineGetsTheServersLimit) {
  Server s({"--fake-device-gib", "16", "--fake-run-ms", "50"}, 0, 8, std::chrono::seconds(1));
  grpc::ClientContext context;  // no deadline of its own
  auto reader = s.stub->Validate(&context, Request("gpt2-small", 2));
  v1::ValidateEvent e;
  while (reader->Read(&e)) {
  }
  const grpc::Status status = reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_NE(status.error_message().find("longer than this server allows (1 s)"), std::string::npos)
      << status.error_message();
}

TEST(ValidateService, OneRunsAtATimeAndTheOthersHearTheirPlace) {
  Server s({"--fake-device-gib", "16", "--fake-run-ms", "5"}, 0, /*max_queued=*/1);
  Call first, second, third;
  std::thread a([&] { first = Validate(*s.stub, Request("gpt2-small", 2)); });  // seconds
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  std::thread b([&] { second = Validate(*s.stub, Request("mlp", 8)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  third = Validate(*s.stub, Request("mlp", 4));  // one running, one waiting: the queue is full
  a.join();
  b.join();
  EXPECT_TRUE(first.status.ok()) << first.status.error_message();
  EXPECT_TRUE(second.status.ok()) << second.status.error_message();
  ASSERT_FALSE(second.events.empty());
  EXPECT_EQ(second.events.front().progress().stage(), v1::ValidateProgress::STAGE_QUEUED);
  EXPECT_EQ(second.events.front().progress().queue_position(), 1);
  EXPECT_EQ(third.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(third.status.error_message().find("queue is full"), std::string::npos);
}

TEST(ValidateService, CancellingStopsTheValidation) {
  Server s({"--fake-device-gib", "16", "--fake-run-ms", "50"});
  grpc::ClientContext context;
  std::atomic<bool> done{false};
  Call c;
  std::thread t([&] {
    c = Validate(*s.stub, Request("gpt2-small", 2), std::chrono::seconds(60), &context);
    done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(800));
  context.TryCancel();
  t.join();
  EXPECT_EQ(c.status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_EQ(s.server->address().empty(), false);
}

}  // namespace
}  // namespace memest
