// A real memest server on 127.0.0.1:0, started as memest-server starts it (server/serve.h), and
// a stub connected to it: what the end-to-end service tests talk to.
#ifndef MEMEST_TESTS_SERVER_TEST_SERVER_H_
#define MEMEST_TESTS_SERVER_TEST_SERVER_H_

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <utility>

#include "memest/v1/memest.grpc.pb.h"
#include "server/serve.h"

namespace memest {
namespace testing {

// gpt2-small with `layers` layers, seq 128, batch 2, on an A100 80GB, with or without advice: a
// request whose cost the tests choose (1,500 layers with advice: about 1.3 s of one core without
// a budget; 4,000, 180,012 ops: several seconds).
inline v1::EstimateRequest Gpt2Request(int64_t layers, bool advice = true) {
  v1::EstimateRequest request;
  v1::Preset* preset = request.mutable_model()->mutable_preset();
  preset->set_name("gpt2-small");
  (*preset->mutable_params())["seq"] = 128;
  (*preset->mutable_params())["layers"] = layers;
  request.mutable_config()->set_batch_size(2);
  request.mutable_config()->set_device_name("a100-80gb");
  request.set_skip_advice(!advice);
  return request;
}

class TestServer {
 public:
  explicit TestServer(ServerOptions options = {}) {
    options.address = "127.0.0.1:0";
    auto server = EstimatorServer::Start(options);
    EXPECT_TRUE(server.ok()) << server.status().ToString();
    if (!server.ok()) return;
    server_ = std::move(server).value();
    channel_ = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
    stub_ = v1::MemoryEstimator::NewStub(channel_);
  }

  v1::MemoryEstimator::Stub& stub() { return *stub_; }
  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }
  EstimatorServer& server() { return *server_; }

  // Estimate with a deadline of `deadline` from now.
  grpc::Status Estimate(const v1::EstimateRequest& request, v1::EstimateResponse* response,
                        std::chrono::milliseconds deadline = std::chrono::seconds(60)) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + deadline);
    return stub_->Estimate(&context, request, response);
  }

 private:
  std::unique_ptr<EstimatorServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::MemoryEstimator::Stub> stub_;
};

}  // namespace testing
}  // namespace memest

#endif  // MEMEST_TESTS_SERVER_TEST_SERVER_H_
