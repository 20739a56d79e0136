// The Sweep RPC end to end: a real server (tests/server/test_server.h), one result per run
// configuration in order, each the answer Estimate gives it alone; refusals of the whole;
// the deadline and a caller that leaves end it. (tests/golden sweeps the golden corpus.)
#include <google/protobuf/util/message_differencer.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "memest/v1/memest.grpc.pb.h"
#include "tests/server/test_server.h"

namespace memest {
namespace {

using google::protobuf::util::MessageDifferencer;
using std::chrono::milliseconds;

v1::Model Gpt2(int64_t layers) {
  v1::Model model;
  v1::Preset* preset = model.mutable_preset();
  preset->set_name("gpt2-small");
  (*preset->mutable_params())["layers"] = layers;
  (*preset->mutable_params())["seq"] = 128;
  return model;
}

v1::RunConfig Config(int64_t batch, v1::Precision precision, const std::string& device) {
  v1::RunConfig c;
  c.set_batch_size(batch);
  c.set_precision(precision);
  if (!device.empty()) c.set_device_name(device);
  return c;
}

grpc::Status Sweep(testing::TestServer& server, const v1::SweepRequest& request,
                   std::vector<v1::SweepResult>* results,
                   milliseconds deadline = milliseconds(60'000)) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + deadline);
  auto reader = server.stub().Sweep(&context, request);
  v1::SweepResult r;
  while (reader->Read(&r)) results->push_back(r);
  return reader->Finish();
}

TEST(SweepServiceTest, OneResultPerConfigurationInOrderEachAsEstimateAnswersIt) {
  testing::TestServer server;
  v1::SweepRequest request;
  *request.mutable_model() = Gpt2(2);
  request.set_max_layer_rows(1);
  *request.add_configs() = Config(4, v1::PRECISION_BF16_AMP, "a100-80gb");
  *request.add_configs() = Config(4, v1::PRECISION_BF16_AMP, "l4");         // the same graph
  *request.add_configs() = Config(0, v1::PRECISION_BF16_AMP, "a100-80gb");  // refused alone
  *request.add_configs() = Config(8, v1::PRECISION_FP32, "tpu-v5");         // no such device
  v1::RunConfig sgd = Config(8, v1::PRECISION_FP32, "");
  sgd.mutable_optimizer()->set_kind(v1::OPTIMIZER_KIND_SGD);
  sgd.mutable_checkpoint()->set_policy(v1::CHECKPOINT_POLICY_EVERY_BLOCK);
  *request.add_configs() = sgd;
  std::vector<v1::SweepResult> results;
  const grpc::Status s = Sweep(server, request, &results);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(results.size(), 5u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(results[i].index(), i);
    v1::EstimateRequest alone;
    *alone.mutable_model() = request.model();
    *alone.mutable_config() = request.configs(i);
    alone.set_max_layer_rows(1);
    v1::EstimateResponse response;
    const grpc::Status want = server.Estimate(alone, &response);
    if (want.ok()) {
      ASSERT_TRUE(results[i].has_estimate()) << i << ": " << results[i].error().message();
      EXPECT_TRUE(MessageDifferencer::Equals(results[i].estimate(), response)) << i;
      EXPECT_EQ(results[i].estimate().layers_size(), 1) << i;
    } else {
      ASSERT_TRUE(results[i].has_error()) << i;
      EXPECT_EQ(results[i].error().code(), static_cast<int32_t>(want.error_code())) << i;
      EXPECT_EQ(results[i].error().message(), want.error_message()) << i;
    }
  }
  EXPECT_TRUE(results[0].estimate().fit().fits());
  EXPECT_NE(results[0].estimate().fit().capacity_bytes(),
            results[1].estimate().fit().capacity_bytes());
  EXPECT_EQ(results[2].error().code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(results[2].error().message().find("config.batch_size"), std::string::npos);
  EXPECT_EQ(results[3].error().code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_GT(results[4].estimate().recompute_fraction(), 0);
}

TEST(SweepServiceTest, RefusesTheWholeForItsModelRowsAndCount) {
  ServerOptions options;
  options.service.max_sweep_configs = 2;
  testing::TestServer server(options);
  std::vector<v1::SweepResult> results;
  v1::SweepRequest none;
  *none.mutable_model() = Gpt2(2);
  grpc::Status s = Sweep(server, none, &results);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("configs"), std::string::npos) << s.error_message();

  v1::SweepRequest three = none;
  for (int i = 0; i < 3; ++i) *three.add_configs() = Config(1, v1::PRECISION_FP32, "");
  s = Sweep(server, three, &results);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(s.error_message().find("configs: 3 run configurations exceed this server's limit of 2"),
            std::string::npos)
      << s.error_message();

  v1::SweepRequest unset;
  *unset.add_configs() = Config(1, v1::PRECISION_FP32, "");
  s = Sweep(server, unset, &results);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("model"), std::string::npos) << s.error_message();

  v1::SweepRequest rows = none;
  *rows.add_configs() = Config(1, v1::PRECISION_FP32, "");
  rows.set_max_layer_rows(-1);
  s = Sweep(server, rows, &results);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("max_layer_rows"), std::string::npos) << s.error_message();
  EXPECT_TRUE(results.empty());

  // A model that converts but does not build (an unknown preset) is each configuration's
  // refusal, as Estimate refuses it.
  v1::SweepRequest unknown = three;
  unknown.mutable_configs()->RemoveLast();
  unknown.mutable_model()->mutable_preset()->set_name("gpt5");
  s = Sweep(server, unknown, &results);
  EXPECT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(results.size(), 2u);
  for (const v1::SweepResult& r : results) {
    EXPECT_EQ(r.error().code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_NE(r.error().message().find("model.preset"), std::string::npos) << r.error().message();
  }
}

// The configurations share one bound on op steps beside each one's own: past it, the rest are
// refused, naming the first of them and the server's flag.
TEST(SweepServiceTest, ConfigurationsPastTheSweepsOpStepsAreRefused) {
  ServerOptions options;
  options.service.max_sweep_op_steps = 1000;  // a 2-layer GPT-2 step is a few hundred
  testing::TestServer server(options);
  v1::SweepRequest request;
  *request.mutable_model() = Gpt2(2);
  request.set_skip_advice(true);
  for (int i = 0; i < 8; ++i) *request.add_configs() = Config(1, v1::PRECISION_FP32, "");
  std::vector<v1::SweepResult> results;
  const grpc::Status s = Sweep(server, request, &results);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(results.size(), 8u);
  int answered = 0;
  while (answered < 8 && results[answered].has_estimate()) ++answered;
  ASSERT_GE(answered, 1);
  ASSERT_LT(answered, 8);
  for (int i = answered; i < 8; ++i) {
    EXPECT_EQ(results[i].error().code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_NE(results[i].error().message().find("configs[" + std::to_string(i) + "]"),
              std::string::npos)
        << results[i].error().message();
    EXPECT_NE(results[i].error().message().find("--max-sweep-op-steps"), std::string::npos);
  }
}

TEST(SweepServiceTest, TheDeadlineEndsTheSweepAfterTheResultsBeforeIt) {
  testing::TestServer server;
  v1::SweepRequest request;
  *request.mutable_model() = Gpt2(48);
  request.set_skip_advice(true);
  for (int i = 0; i < 2000; ++i) {
    *request.add_configs() = Config(1 + i % 16, v1::PRECISION_BF16_AMP, "a100-80gb");
  }
  std::vector<v1::SweepResult> results;
  const grpc::Status s = Sweep(server, request, &results, milliseconds(1500));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.error_message();
  EXPECT_LT(results.size(), 2000u);
  for (size_t i = 0; i < results.size(); ++i) EXPECT_EQ(results[i].index(), int64_t(i));
}

// A caller that stops reading and leaves: the sweep, held back by the replies it cannot write,
// stops, and its thread takes the next call.
TEST(SweepServiceTest, ACallerThatLeavesFreesTheThread) {
  ServerOptions options;
  options.service.work_threads = 1;
  testing::TestServer server(options);
  v1::SweepRequest request;
  *request.mutable_model() = Gpt2(64);  // every layer row: results of about 10 KiB each
  request.set_skip_advice(true);
  for (int i = 0; i < 20000; ++i)
    *request.add_configs() = Config(1 + i % 8, v1::PRECISION_FP32, "");
  {
    grpc::ClientContext context;
    auto reader = server.stub().Sweep(&context, request);
    v1::SweepResult r;
    ASSERT_TRUE(reader->Read(&r));
    // More than the server queues for a caller (StreamReactor::kMaxQueuedBytes) and gRPC's
    // windows hold: it waits for this caller to read.
    std::this_thread::sleep_for(milliseconds(3000));
    context.TryCancel();
    while (reader->Read(&r)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  v1::EstimateRequest next;
  *next.mutable_model() = Gpt2(2);
  *next.mutable_config() = Config(1, v1::PRECISION_FP32, "");
  v1::EstimateResponse response;
  const grpc::Status s = server.Estimate(next, &response, milliseconds(10'000));
  EXPECT_TRUE(s.ok()) << s.error_message();
}

// A caller that neither reads nor leaves (no deadline, no cancel): once the server's queue of
// replies is full and nothing is taken for the stall time, the call is cancelled and its thread
// takes the next call.
TEST(SweepServiceTest, AReaderThatStallsIsCancelled) {
  ServerOptions options;
  options.service.work_threads = 1;
  options.service.stream_stall = std::chrono::milliseconds(500);
  testing::TestServer server(options);
  v1::SweepRequest request;
  *request.mutable_model() = Gpt2(64);  // every layer row: results of about 10 KiB each
  request.set_skip_advice(true);
  for (int i = 0; i < 20000; ++i) *request.add_configs() = Config(1 + i % 8, v1::PRECISION_FP32, "");
  grpc::ClientContext stalled;  // no deadline
  auto reader = server.stub().Sweep(&stalled, request);
  v1::SweepResult r;
  ASSERT_TRUE(reader->Read(&r));
  // Another caller, on its own connection, gets the thread once the stalled call is dropped.
  auto other = v1::MemoryEstimator::NewStub(
      grpc::CreateCustomChannel(server.server().address(), grpc::InsecureChannelCredentials(),
                                grpc::ChannelArguments()));
  v1::EstimateRequest next;
  *next.mutable_model() = Gpt2(2);
  *next.mutable_config() = Config(1, v1::PRECISION_FP32, "");
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  v1::EstimateResponse response;
  const grpc::Status s = other->Estimate(&context, next, &response);
  EXPECT_TRUE(s.ok()) << s.error_message();
  while (reader->Read(&r)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
}

}  // namespace
}  // namespace memest
