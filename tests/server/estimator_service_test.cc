// End-to-end tests of memest.v1.MemoryEstimator: a real server on 127.0.0.1:0, started as
// memest-server starts it (server/serve.h), called through the generated stub.
#include <gmock/gmock.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "health_client.h"
#include "memest/v1/memest.grpc.pb.h"
#include "server/serve.h"
#include "tests/server/test_server.h"

namespace memest {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kGpt2SmallParameters = 124'439'808;

using Connection = testing::TestServer;

// One server for the whole suite: starting gRPC is the slow part.
class EstimatorServiceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { connection_ = new Connection(); }
  static void TearDownTestSuite() {
    delete connection_;
    connection_ = nullptr;
  }
  static Connection& connection() { return *connection_; }

 private:
  static Connection* connection_;
};
Connection* EstimatorServiceTest::connection_ = nullptr;

v1::EstimateRequest Gpt2SmallRequest() {
  v1::EstimateRequest request;
  v1::Preset* preset = request.mutable_model()->mutable_preset();
  preset->set_name("gpt2-small");
  (*preset->mutable_params())["seq"] = 128;
  request.mutable_config()->set_batch_size(2);
  return request;
}

v1::AttrValue Int(int64_t i) {
  v1::AttrValue value;
  value.set_i(i);
  return value;
}

v1::TensorDecl* AddTensor(v1::OpGraph* graph, const std::string& name, std::vector<int64_t> shape,
                          v1::TensorRole role) {
  v1::TensorDecl* tensor = graph->add_tensors();
  tensor->set_name(name);
  for (int64_t d : shape) tensor->add_shape(d);
  tensor->set_role(role);
  return tensor;
}

v1::OpDecl* AddOp(v1::OpGraph* graph, const std::string& kind, std::vector<std::string> inputs,
                  std::vector<std::string> outputs) {
  v1::OpDecl* op = graph->add_ops();
  op->set_kind(kind);
  for (const std::string& input : inputs) op->add_inputs(input);
  for (const std::string& output : outputs) op->add_outputs(output);
  return op;
}

// x [4, 8] -> linear(w [16, 8]) -> y [4, 16], run as inference (no loss needed).
v1::EstimateRequest LinearOpGraphRequest() {
  v1::EstimateRequest request;
  v1::OpGraph* graph = request.mutable_model()->mutable_ops();
  AddTensor(graph, "x", {4, 8}, v1::TENSOR_ROLE_INPUT);
  AddTensor(graph, "w", {16, 8}, v1::TENSOR_ROLE_PARAMETER);
  AddOp(graph, "linear", {"x", "w"}, {"y"});
  request.mutable_config()->set_batch_size(4);
  request.mutable_config()->set_mode(v1::MODE_INFERENCE);
  return request;
}

TEST_F(EstimatorServiceTest, Gpt2SmallHasASensibleBreakdown) {
  v1::EstimateResponse response;
  grpc::Status status = connection().Estimate(Gpt2SmallRequest(), &response);
  ASSERT_TRUE(status.ok()) << status.error_code() << ": " << status.error_message();

  // fp32 weights, plus the module buffers the engine counts as parameters (LeafCategory: a
  // buffer's category is kParameters): GPT-2's causal mask `h.<i>.attn.bias`, bool [1, 1, 1024,
  // 1024] in each of the 12 blocks, as Hugging Face's GPT2Attention registers it.
  const uint64_t weight_bytes = 4 * kGpt2SmallParameters;
  const uint64_t parameter_bytes = weight_bytes + 12 * 1024 * 1024;
  EXPECT_EQ(response.parameter_count(), kGpt2SmallParameters);
  EXPECT_EQ(response.trainable_parameter_count(), kGpt2SmallParameters);
  EXPECT_EQ(response.micro_batch(), 2u);
  EXPECT_GT(response.op_count(), 12u);
  EXPECT_EQ(response.breakdown().parameters(), parameter_bytes);
  // AdamW in steady state: exp_avg and exp_avg_sq, fp32, exist all step long.
  EXPECT_GE(response.breakdown().optimizer_state(), 2 * weight_bytes);
  EXPECT_GT(response.breakdown().cuda_context(), 0u);
  // At the peak the parameters are there, and all gradients exist at some point of the step.
  EXPECT_GE(response.peak().allocated_bytes(), parameter_bytes + weight_bytes);
  EXPECT_GE(response.peak().reserved_bytes(), response.peak().allocated_bytes());
  EXPECT_GE(response.peak_reserved_bytes(), response.peak().reserved_bytes());
  EXPECT_NE(response.peak().phase(), v1::PHASE_UNSPECIFIED);
  EXPECT_EQ(response.peak().by_category().parameters(), parameter_bytes);

  ASSERT_FALSE(response.phases().empty());
  uint64_t largest_phase = 0;
  for (const v1::Peak& phase : response.phases()) {
    EXPECT_NE(phase.phase(), v1::PHASE_UNSPECIFIED);
    largest_phase = std::max(largest_phase, phase.allocated_bytes());
  }
  EXPECT_EQ(largest_phase, response.peak().allocated_bytes());
  EXPECT_FALSE(response.layers().empty());
  EXPECT_FALSE(response.has_fit()) << "no device was given";
}

// max_layer_rows: unset, every layer; 0, none; N, the N that hold the most, in model order.
TEST(LayerRowsTest, TheTableCanBeCutToTheLayersThatHoldTheMost) {
  v1::EstimateRequest request;
  request.mutable_model()->mutable_preset()->set_name("gpt2-small");
  request.mutable_config()->set_batch_size(2);
  request.set_skip_advice(true);
  v1::EstimateResponse all;
  ASSERT_TRUE(HandleEstimate(request, ServiceOptions{}, &all).ok());
  ASSERT_GT(all.layers_size(), 4);
  const auto held = [](const v1::LayerRow& r) { return r.parameter_bytes() + r.saved_bytes(); };
  std::vector<uint64_t> sizes;
  for (const v1::LayerRow& row : all.layers()) sizes.push_back(held(row));
  std::sort(sizes.rbegin(), sizes.rend());

  request.set_max_layer_rows(3);
  v1::EstimateResponse three;
  ASSERT_TRUE(HandleEstimate(request, ServiceOptions{}, &three).ok());
  ASSERT_EQ(three.layers_size(), 3);
  int last = -1;
  for (const v1::LayerRow& row : three.layers()) {
    EXPECT_GE(held(row), sizes[2]) << row.scope();
    int index = 0;  // model order: the rows keep the order of the full table
    while (all.layers(index).scope() != row.scope()) ++index;
    EXPECT_GT(index, last);
    last = index;
  }
  EXPECT_EQ(three.peak().allocated_bytes(), all.peak().allocated_bytes());  // nothing else moves

  request.set_max_layer_rows(0);
  v1::EstimateResponse none;
  ASSERT_TRUE(HandleEstimate(request, ServiceOptions{}, &none).ok());
  EXPECT_EQ(none.layers_size(), 0);
  EXPECT_LT(none.ByteSizeLong(), all.ByteSizeLong());
  request.set_max_layer_rows(1000);
  v1::EstimateResponse more;
  ASSERT_TRUE(HandleEstimate(request, ServiceOptions{}, &more).ok());
  EXPECT_EQ(more.layers_size(), all.layers_size());
}

TEST_F(EstimatorServiceTest, DeviceFitIsPresentWhenADeviceIsNamed) {
  grpc::ClientContext context;
  v1::ListDevicesResponse devices;
  ASSERT_TRUE(connection().stub().ListDevices(&context, {}, &devices).ok());
  ASSERT_FALSE(devices.devices().empty());
  const v1::DeviceInfo& device = devices.devices(0);

  v1::EstimateRequest request = Gpt2SmallRequest();
  request.mutable_config()->set_device_name(device.name());
  request.set_skip_advice(true);
  v1::EstimateResponse response;
  grpc::Status status = connection().Estimate(request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_TRUE(response.has_fit());
  EXPECT_EQ(response.fit().capacity_bytes(), device.capacity_bytes());
  EXPECT_EQ(response.fit().fits(), response.fit().headroom_bytes() >= 0);
  EXPECT_EQ(static_cast<int64_t>(response.fit().capacity_bytes()) -
                static_cast<int64_t>(response.fit().required_bytes()),
            response.fit().headroom_bytes());
  EXPECT_TRUE(response.advice().empty()) << "skip_advice was set";
}

TEST_F(EstimatorServiceTest, BareCapacityGivesAFit) {
  v1::EstimateRequest request = Gpt2SmallRequest();
  request.mutable_config()->set_device_capacity_bytes(uint64_t{1} << 30);  // 1 GiB: too small
  request.set_skip_advice(true);
  v1::EstimateResponse response;
  grpc::Status status = connection().Estimate(request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_TRUE(response.has_fit());
  EXPECT_EQ(response.fit().capacity_bytes(), uint64_t{1} << 30);
  EXPECT_FALSE(response.fit().fits());
  EXPECT_LT(response.fit().headroom_bytes(), 0);
}

TEST_F(EstimatorServiceTest, OpGraphModelIsEstimated) {
  v1::EstimateResponse response;
  grpc::Status status = connection().Estimate(LinearOpGraphRequest(), &response);
  ASSERT_TRUE(status.ok()) << status.error_code() << ": " << status.error_message();
  EXPECT_EQ(response.parameter_count(), 16u * 8u);
  EXPECT_EQ(response.breakdown().parameters(), 16u * 8u * 4u);
  EXPECT_EQ(response.op_count(), 1u);
}

TEST_F(EstimatorServiceTest, LayerModelIsEstimated) {
  v1::EstimateRequest request;
  v1::LayerModel* model = request.mutable_model()->mutable_layers();
  model->add_input_shape(32);
  v1::Layer* linear = model->add_layers();
  linear->set_kind("linear");
  (*linear->mutable_attrs())["out_features"] = Int(64);
  model->add_layers()->set_kind("relu");
  request.mutable_config()->set_batch_size(8);
  v1::EstimateResponse response;
  grpc::Status status = connection().Estimate(request, &response);
  ASSERT_TRUE(status.ok()) << status.error_code() << ": " << status.error_message();
  EXPECT_EQ(response.parameter_count(), 32u * 64u + 64u);
  EXPECT_EQ(response.micro_batch(), 8u);
}

TEST_F(EstimatorServiceTest, ListPresetsIncludesGpt2Small) {
  grpc::ClientContext context;
  v1::ListPresetsResponse response;
  grpc::Status status = connection().stub().ListPresets(&context, {}, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_FALSE(response.presets().empty());
  bool found = false;
  for (const v1::PresetInfo& preset : response.presets()) {
    EXPECT_FALSE(preset.name().empty());
    found |= preset.name() == "gpt2-small";
  }
  EXPECT_TRUE(found);
}

TEST_F(EstimatorServiceTest, ListDevicesHasCapacities) {
  grpc::ClientContext context;
  v1::ListDevicesResponse response;
  grpc::Status status = connection().stub().ListDevices(&context, {}, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_FALSE(response.devices().empty());
  for (const v1::DeviceInfo& device : response.devices()) {
    EXPECT_FALSE(device.name().empty());
    EXPECT_GT(device.capacity_bytes(), device.cuda_context_bytes()) << device.name();
  }
}

TEST_F(EstimatorServiceTest, HealthIsServing) {
  using grpc::health::v1::HealthCheckResponse;
  EXPECT_EQ(testing::CheckHealth(connection().channel(), ""), HealthCheckResponse::SERVING);
  EXPECT_EQ(testing::CheckHealth(connection().channel(), "memest.v1.MemoryEstimator"),
            HealthCheckResponse::SERVING);
}

// Asks the server's reflection service (grpc.reflection.v1alpha) to list its services and
// returns the raw response. Debian ships no client stubs for reflection and defining our own
// messages would clash with the server's in the descriptor pool, so the request is hand-encoded:
// ServerReflectionRequest{list_services: ""} is field 7, an empty string.
std::string ListServicesByReflection(const std::shared_ptr<grpc::Channel>& channel) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::CompletionQueue cq;
  auto next = [&cq](intptr_t expected) {
    void* tag = nullptr;
    bool ok = false;
    return cq.Next(&tag, &ok) && ok && reinterpret_cast<intptr_t>(tag) == expected;
  };
  auto call = stub.PrepareCall(
      &context, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  call->StartCall(reinterpret_cast<void*>(1));
  if (!next(1)) return "";
  grpc::Slice request_slice(std::string("\x3a\x00", 2));
  grpc::ByteBuffer request(&request_slice, 1);
  call->Write(request, reinterpret_cast<void*>(2));
  if (!next(2)) return "";
  grpc::ByteBuffer response;
  call->Read(&response, reinterpret_cast<void*>(3));
  if (!next(3)) return "";
  call->WritesDone(reinterpret_cast<void*>(4));
  next(4);
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  next(5);
  cq.Shutdown();
  void* tag;
  bool ok;
  while (cq.Next(&tag, &ok)) {
  }
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return "";
  std::string bytes;
  for (const grpc::Slice& slice : slices) {
    bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  return bytes;
}

TEST_F(EstimatorServiceTest, ReflectionListsTheService) {
  const std::string services = ListServicesByReflection(connection().channel());
  EXPECT_THAT(services, HasSubstr("memest.v1.MemoryEstimator"));
  EXPECT_THAT(services, HasSubstr("grpc.health.v1.Health"));
}

// A bad request, the code it must get, and a piece of the message (the field it names).
struct BadRequest {
  std::string name;
  v1::EstimateRequest request;
  grpc::StatusCode code;
  std::vector<std::string> message_contains;
};

std::vector<BadRequest> BadRequests() {
  std::vector<BadRequest> cases;
  {
    v1::EstimateRequest r;
    r.mutable_config()->set_batch_size(2);
    cases.push_back({"unset model", r, grpc::StatusCode::INVALID_ARGUMENT, {"model"}});
  }
  {
    v1::EstimateRequest r = Gpt2SmallRequest();
    r.mutable_config()->set_batch_size(0);
    cases.push_back(
        {"zero batch", r, grpc::StatusCode::INVALID_ARGUMENT, {"config.batch_size", "0"}});
  }
  {
    v1::EstimateRequest r = Gpt2SmallRequest();
    r.mutable_config()->mutable_optimizer()->set_weight_decay(
        std::numeric_limits<double>::quiet_NaN());
    cases.push_back({"NaN weight_decay",
                     r,
                     grpc::StatusCode::INVALID_ARGUMENT,
                     {"config.optimizer.weight_decay"}});
  }
  {
    v1::EstimateRequest r = Gpt2SmallRequest();
    r.mutable_config()->set_precision(static_cast<v1::Precision>(42));
    cases.push_back(
        {"unknown precision", r, grpc::StatusCode::INVALID_ARGUMENT, {"config.precision", "42"}});
  }
  {
    v1::EstimateRequest r;
    v1::LayerModel* model = r.mutable_model()->mutable_layers();
    model->add_input_shape(-4);
    model->add_input_shape(8);
    v1::Layer* linear = model->add_layers();
    linear->set_kind("linear");
    (*linear->mutable_attrs())["out_features"] = Int(16);
    r.mutable_config()->set_batch_size(2);
    cases.push_back({"negative dim in input_shape",
                     r,
                     grpc::StatusCode::INVALID_ARGUMENT,
                     {"input_shape", "-4"}});
  }
  {
    v1::EstimateRequest r;
    v1::LayerModel* model = r.mutable_model()->mutable_layers();
    model->add_input_shape(8);
    v1::Layer* linear = model->add_layers();
    linear->set_kind("linear");
    (*linear->mutable_attrs())["out_features"] = Int(-4);
    r.mutable_config()->set_batch_size(2);
    cases.push_back({"negative out_features",
                     r,
                     grpc::StatusCode::INVALID_ARGUMENT,
                     {"model.layers[0].attrs.out_features"}});
  }
  {
    v1::EstimateRequest r;
    v1::LayerModel* model = r.mutable_model()->mutable_layers();
    model->add_input_shape(8);
    v1::Layer* linear = model->add_layers();
    linear->set_kind("linear");
    (*linear->mutable_attrs())["out_features"];  // an AttrValue with nothing set
    r.mutable_config()->set_batch_size(2);
    cases.push_back({"attr without a value",
                     r,
                     grpc::StatusCode::INVALID_ARGUMENT,
                     {"model.layers[0].attrs.out_features"}});
  }
  {
    v1::EstimateRequest r = LinearOpGraphRequest();
    v1::TensorDecl* x = r.mutable_model()->mutable_ops()->mutable_tensors(0);
    x->clear_shape();
    for (int64_t d : {int64_t{1} << 31, int64_t{1} << 31, int64_t{16}}) x->add_shape(d);
    x->set_batch_dim(-1);
    cases.push_back({"shape whose bytes overflow",
                     r,
                     grpc::StatusCode::INVALID_ARGUMENT,
                     {"model.tensors[0]"}});
  }
  {
    v1::EstimateRequest r = LinearOpGraphRequest();
    r.mutable_model()->mutable_ops()->mutable_tensors(0)->set_dtype("float13");
    cases.push_back({"unknown dtype",
                     r,
                     grpc::StatusCode::INVALID_ARGUMENT,
                     {"model.tensors[0].dtype", "float13"}});
  }
  {
    v1::EstimateRequest r = LinearOpGraphRequest();
    r.mutable_model()->mutable_ops()->mutable_ops(0)->set_kind("frobnicate");
    cases.push_back(
        {"unknown op kind", r, grpc::StatusCode::INVALID_ARGUMENT, {"model.ops[0]", "frobnicate"}});
  }
  {
    v1::EstimateRequest r = LinearOpGraphRequest();
    r.mutable_model()->mutable_ops()->mutable_ops(0)->set_inputs(1, "nope");
    cases.push_back({"dangling tensor reference",
                     r,
                     grpc::StatusCode::INVALID_ARGUMENT,
                     {"model.ops[0].inputs[1]"}});
  }
  return cases;
}

TEST_F(EstimatorServiceTest, BadRequestsNameTheField) {
  for (const BadRequest& bad : BadRequests()) {
    SCOPED_TRACE(bad.name);
    v1::EstimateResponse response;
    grpc::Status status = connection().Estimate(bad.request, &response);
    EXPECT_EQ(status.error_code(), bad.code) << status.error_message();
    for (const std::string& piece : bad.message_contains) {
      EXPECT_THAT(status.error_message(), HasSubstr(piece));
    }
  }
}

TEST_F(EstimatorServiceTest, UnknownPresetIsNotFound) {
  v1::EstimateRequest request = Gpt2SmallRequest();
  request.mutable_model()->mutable_preset()->set_name("gpt5-enormous");
  v1::EstimateResponse response;
  grpc::Status status = connection().Estimate(request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("gpt2-small")) << "lists the known presets";
}

TEST(EstimatorServiceLimitsTest, TooManyOpsNamesTheCountAndTheLimit) {
  ServerOptions options;
  options.service.max_ops = 10;
  Connection connection(options);

  v1::EstimateRequest request = LinearOpGraphRequest();
  v1::OpGraph* graph = request.mutable_model()->mutable_ops();
  for (int i = 0; i < 10; ++i) AddOp(graph, "linear", {"x", "w"}, {});
  ASSERT_EQ(graph->ops_size(), 11);
  v1::EstimateResponse response;
  grpc::Status status = connection.Estimate(request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("model.ops"));
  EXPECT_THAT(status.error_message(), HasSubstr("11"));
  EXPECT_THAT(status.error_message(), HasSubstr("10"));
}

TEST(EstimatorServiceLimitsTest, PresetExpandingBeyondTheLimitIsRefused) {
  ServerOptions options;
  options.service.max_ops = 10;
  Connection connection(options);
  v1::EstimateResponse response;
  grpc::Status status = connection.Estimate(Gpt2SmallRequest(), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
}

TEST(EstimatorServiceLimitsTest, OversizedMessageIsRefused) {
  ServerOptions options;
  options.max_message_bytes = 4096;
  Connection connection(options);
  v1::EstimateRequest request = LinearOpGraphRequest();
  request.mutable_model()->mutable_ops()->mutable_ops(0)->set_scope(std::string(8192, 'a'));
  v1::EstimateResponse response;
  grpc::Status status = connection.Estimate(request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
}

TEST(EstimatorServerTest, ShutdownStopsServingAndWaitReturns) {
  Connection connection;
  using grpc::health::v1::HealthCheckResponse;
  ASSERT_EQ(testing::CheckHealth(connection.channel(), ""), HealthCheckResponse::SERVING);
  connection.server().Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  connection.server().Wait();
  grpc::Status status;
  EXPECT_NE(testing::CheckHealth(connection.channel(), "", &status), HealthCheckResponse::SERVING);
}

TEST(EstimatorServerTest, BadAddressIsRefused) {
  ServerOptions options;
  options.address = "no-port-here";
  auto server = EstimatorServer::Start(options);
  ASSERT_FALSE(server.ok());
  EXPECT_THAT(server.status().message(), HasSubstr("address"));
}

}  // namespace
}  // namespace memest
