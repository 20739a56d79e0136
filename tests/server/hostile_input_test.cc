// Requests built to hurt the service, over a real server on 127.0.0.1:0: bytes that are not a
// request, strings that are not UTF-8, names of kilobytes and megabytes, names that would forge
// log lines, sizes that overflow. Each must get a bounded refusal with a message that names the
// field, and must leave the channel fit for the next call.
#include <gmock/gmock.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "memest/v1/memest.grpc.pb.h"
#include "server/serve.h"

namespace memest {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// gRPC refuses to deliver a reply whose metadata (the status message is one of its entries)
// exceeds 8 KiB; a refusal must stay well below that whatever the request held.
constexpr size_t kMaxReplyMessage = 1024;

std::chrono::system_clock::time_point Deadline() {
  return std::chrono::system_clock::now() + std::chrono::seconds(60);
}

// A server on port 0, with a typed stub and a generic one (for bytes that are not a request).
class HostileInputTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ServerOptions options;
    options.address = "127.0.0.1:0";
    auto server = EstimatorServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(server).value().release();
    channel_ = new std::shared_ptr<grpc::Channel>(
        grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  }
  static void TearDownTestSuite() {
    delete channel_;
    delete server_;
  }

  static grpc::Status Estimate(const v1::EstimateRequest& request, v1::EstimateResponse* response) {
    auto stub = v1::MemoryEstimator::NewStub(*channel_);
    grpc::ClientContext context;
    context.set_deadline(Deadline());
    return stub->Estimate(&context, request, response);
  }

  // Sends `bytes` as the request of the unary `method` ("/memest.v1.MemoryEstimator/Estimate").
  static grpc::Status CallWithBytes(const std::string& method, const std::string& bytes) {
    grpc::GenericStub stub(*channel_);
    grpc::ClientContext context;
    context.set_deadline(Deadline());
    grpc::CompletionQueue cq;
    grpc::Slice slice(bytes);
    grpc::ByteBuffer request(&slice, 1);
    auto call = stub.PrepareUnaryCall(&context, method, request, &cq);
    call->StartCall();
    grpc::ByteBuffer response;
    grpc::Status status;
    call->Finish(&response, &status, reinterpret_cast<void*>(1));
    void* tag = nullptr;
    bool ok = false;
    EXPECT_TRUE(cq.Next(&tag, &ok));
    cq.Shutdown();
    while (cq.Next(&tag, &ok)) {
    }
    return status;
  }

  // Sends `bytes` as the request of the server-streaming Validate; returns its final status.
  static grpc::Status ValidateWithBytes(const std::string& bytes) {
    grpc::GenericStub stub(*channel_);
    grpc::ClientContext context;
    context.set_deadline(Deadline());
    grpc::CompletionQueue cq;
    auto next = [&cq](intptr_t expected) {
      void* tag = nullptr;
      bool ok = false;
      return cq.Next(&tag, &ok) && ok && reinterpret_cast<intptr_t>(tag) == expected;
    };
    auto call = stub.PrepareCall(&context, "/memest.v1.MemoryEstimator/Validate", &cq);
    call->StartCall(reinterpret_cast<void*>(1));
    next(1);
    grpc::Slice slice(bytes);
    grpc::ByteBuffer request(&slice, 1);
    call->Write(request, reinterpret_cast<void*>(2));
    next(2);
    call->WritesDone(reinterpret_cast<void*>(3));
    next(3);
    grpc::ByteBuffer event;
    call->Read(&event, reinterpret_cast<void*>(4));
    next(4);  // fails: the server sends no event before its status
    grpc::Status status;
    call->Finish(&status, reinterpret_cast<void*>(5));
    next(5);
    cq.Shutdown();
    void* tag;
    bool ok;
    while (cq.Next(&tag, &ok)) {
    }
    return status;
  }

  // A call that must succeed: the channel is still usable after whatever came before.
  static void ExpectChannelWorks() {
    v1::EstimateRequest request;
    v1::Preset* preset = request.mutable_model()->mutable_preset();
    preset->set_name("mlp");
    request.mutable_config()->set_batch_size(2);
    request.set_skip_advice(true);
    v1::EstimateResponse response;
    grpc::Status status = Estimate(request, &response);
    EXPECT_TRUE(status.ok()) << status.error_code() << ": " << status.error_message();
  }

 private:
  static EstimatorServer* server_;
  static std::shared_ptr<grpc::Channel>* channel_;
};
EstimatorServer* HostileInputTest::server_ = nullptr;
std::shared_ptr<grpc::Channel>* HostileInputTest::channel_ = nullptr;

// The protobuf encoding of a length-delimited field.
std::string Field(int number, const std::string& payload) {
  std::string out(1, static_cast<char>(number << 3 | 2));
  uint64_t n = payload.size();
  do {
    out.push_back(static_cast<char>((n & 0x7F) | (n > 0x7F ? 0x80 : 0)));
    n >>= 7;
  } while (n != 0);
  return out + payload;
}

// EstimateRequest{model: Model{preset: Preset{name: name}}}, encoded by hand so that the name
// can be any bytes.
std::string PresetRequestBytes(const std::string& name) {
  return Field(1, Field(1, Field(1, name)));
}

v1::EstimateRequest PresetRequest(const std::string& name) {
  v1::EstimateRequest request;
  request.mutable_model()->mutable_preset()->set_name(name);
  request.mutable_config()->set_batch_size(2);
  request.set_skip_advice(true);
  return request;
}

v1::AttrValue Int(int64_t i) {
  v1::AttrValue value;
  value.set_i(i);
  return value;
}

// input [8] -> linear(out_features) named `name`.
v1::EstimateRequest LinearLayerRequest(int64_t out_features, const std::string& name = "") {
  v1::EstimateRequest request;
  v1::LayerModel* model = request.mutable_model()->mutable_layers();
  model->add_input_shape(8);
  v1::Layer* linear = model->add_layers();
  linear->set_kind("linear");
  linear->set_name(name);
  (*linear->mutable_attrs())["out_features"] = Int(out_features);
  request.mutable_config()->set_batch_size(2);
  request.set_skip_advice(true);
  return request;
}

TEST_F(HostileInputTest, BytesThatAreNotARequestAreInvalidArgument) {
  // Field 1, length-delimited, claiming 127 bytes of which 3 follow.
  const std::string garbage("\x0a\x7f\x01\x02\x03", 5);
  grpc::Status status = CallWithBytes("/memest.v1.MemoryEstimator/Estimate", garbage);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("memest.v1.EstimateRequest"));
  ExpectChannelWorks();

  status = CallWithBytes("/memest.v1.MemoryEstimator/Estimate", std::string("\xff\xff\xff\xff", 4));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_FALSE(status.error_message().empty());

  // No bytes at all are a request with every field unset: refused for what it lacks.
  status = CallWithBytes("/memest.v1.MemoryEstimator/Estimate", "");
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("model: no model source set"));
}

TEST_F(HostileInputTest, ANameThatIsNotUtf8IsInvalidArgumentNamingTheField) {
  grpc::Status status =
      CallWithBytes("/memest.v1.MemoryEstimator/Estimate", PresetRequestBytes("gpt2\xff-small"));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("model.preset.name"));
  EXPECT_THAT(status.error_message(), HasSubstr("UTF-8"));
  ExpectChannelWorks();
}

// `request` serialized, with its one occurrence of `placeholder` replaced by `bytes` (as long).
std::string WithBytes(const v1::EstimateRequest& request, const std::string& placeholder,
                      const std::string& bytes) {
  std::string wire = request.SerializeAsString();
  const size_t at = wire.find(placeholder);
  EXPECT_NE(at, std::string::npos);
  EXPECT_EQ(bytes.size(), placeholder.size());
  return wire.replace(at, placeholder.size(), bytes);
}

TEST_F(HostileInputTest, StringsThatAreNotUtf8AreFoundWhereverTheyAre) {
  const std::string placeholder = "PLACEHOLDER", bad = "BAD\xff\xfePLACES";
  v1::EstimateRequest layers = LinearLayerRequest(16);
  *layers.mutable_model()->mutable_layers()->add_layers() = layers.model().layers().layers(0);
  layers.mutable_model()->mutable_layers()->mutable_layers(1)->set_name(placeholder);
  v1::EstimateRequest attr_key = LinearLayerRequest(16);
  (*attr_key.mutable_model()->mutable_layers()->mutable_layers(0)->mutable_attrs())[placeholder] =
      Int(1);
  v1::EstimateRequest attr_value;
  v1::OpDecl* op = attr_value.mutable_model()->mutable_ops()->add_ops();
  op->set_kind("einsum");
  (*op->mutable_attrs())["equation"].set_s(placeholder);

  struct Case {
    std::string bytes;
    std::string field;
  };
  // Where protobuf kept the string, its path; in a map entry (which protobuf drops when it
  // fails), the field as protobuf names it.
  const std::vector<Case> cases = {
      {WithBytes(layers, placeholder, bad), "model.layers[1].name: is not valid UTF-8"},
      {WithBytes(attr_key, placeholder, bad), "memest.v1.Layer.AttrsEntry.key"},
      {WithBytes(attr_value, placeholder, bad), "memest.v1.AttrValue.s"},
  };
  for (const Case& c : cases) {
    grpc::Status status = CallWithBytes("/memest.v1.MemoryEstimator/Estimate", c.bytes);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr(c.field));
    EXPECT_THAT(status.error_message(), HasSubstr("UTF-8"));
  }
  ExpectChannelWorks();
}

TEST_F(HostileInputTest, ValidateRefusesBytesThatAreNotARequest) {
  // This server has no validation device, but a request that does not parse is refused as such.
  grpc::Status status = ValidateWithBytes(std::string("\x0a\x7f\x01", 3));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("memest.v1.ValidateRequest"));

  status = ValidateWithBytes(PresetRequestBytes("mlp\xc3("));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("model.preset.name"));
  ExpectChannelWorks();
}

TEST_F(HostileInputTest, LongPresetNamesGetABoundedReply) {
  for (size_t size : {size_t{8} << 10, size_t{4} << 20}) {
    SCOPED_TRACE(size);
    v1::EstimateResponse response;
    grpc::Status status = Estimate(PresetRequest(std::string(size, 'g')), &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND) << status.error_message().size();
    EXPECT_THAT(status.error_message(), HasSubstr("model.preset.name"));
    EXPECT_THAT(status.error_message(), HasSubstr("more bytes"));
    EXPECT_LE(status.error_message().size(), kMaxReplyMessage);
    ExpectChannelWorks();
  }
}

TEST_F(HostileInputTest, A4MiBLayerNameIsRefusedNamingTheFieldAndTheBound) {
  v1::EstimateResponse response;
  grpc::Status status = Estimate(LinearLayerRequest(16, std::string(4 << 20, 'n')), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << status.error_message().size();
  EXPECT_THAT(status.error_message(), HasSubstr("model.layers[0].name"));
  EXPECT_THAT(status.error_message(), HasSubstr("1024"));
  EXPECT_LE(status.error_message().size(), kMaxReplyMessage);
  ExpectChannelWorks();
}

TEST_F(HostileInputTest, A4MiBTensorNameIsRefusedNamingTheFieldAndTheBound) {
  v1::EstimateRequest request;
  v1::OpGraph* graph = request.mutable_model()->mutable_ops();
  v1::TensorDecl* x = graph->add_tensors();
  x->set_name(std::string(4 << 20, 't'));
  x->add_shape(4);
  x->add_shape(8);
  v1::OpDecl* op = graph->add_ops();
  op->set_kind("relu");
  op->add_inputs(x->name());
  request.mutable_config()->set_batch_size(4);
  request.mutable_config()->set_mode(v1::MODE_INFERENCE);
  v1::EstimateResponse response;
  grpc::Status status = Estimate(request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << status.error_message().size();
  EXPECT_THAT(status.error_message(), HasSubstr("model.tensors[0].name"));
  EXPECT_THAT(status.error_message(), HasSubstr("1024"));
  EXPECT_LE(status.error_message().size(), kMaxReplyMessage);
  ExpectChannelWorks();
}

// Everything the default logger writes while it lives, for checking log lines.
class LogCapture {
 public:
  LogCapture() : previous_(spdlog::default_logger()) {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(lines_);
    sink->set_pattern("%v");
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("capture", sink));
  }
  ~LogCapture() { spdlog::set_default_logger(previous_); }
  std::vector<std::string> Lines() const {
    std::vector<std::string> out;
    std::istringstream in(lines_.str());
    for (std::string line; std::getline(in, line);) out.push_back(line);
    return out;
  }

 private:
  std::shared_ptr<spdlog::logger> previous_;
  std::ostringstream lines_;
};

TEST_F(HostileInputTest, ANewlineInAPresetNameCannotForgeALogLine) {
  const std::string forged = "rpc=Estimate model=preset:gpt2-small code=OK us=1 peer=forged";
  std::vector<std::string> lines;
  {
    LogCapture capture;
    v1::EstimateResponse response;
    grpc::Status status = Estimate(PresetRequest("nope\n" + forged), &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_THAT(status.error_message(), Not(HasSubstr("\n")));
    lines = capture.Lines();
  }
  ASSERT_EQ(lines.size(), 1u) << "one request, one log line";
  EXPECT_THAT(lines[0], HasSubstr("code=NOT_FOUND"));
  EXPECT_THAT(lines[0], HasSubstr("nope\\nrpc=Estimate"));
}

TEST_F(HostileInputTest, AHugeBatchSizeIsReportedAsTheBatchSize) {
  v1::EstimateRequest request = PresetRequest("gpt2-small");
  request.mutable_config()->set_batch_size(int64_t{1} << 62);
  v1::EstimateResponse response;
  grpc::Status status = Estimate(request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_THAT(status.error_message(), ::testing::StartsWith("config.batch_size: "));
  EXPECT_THAT(status.error_message(), HasSubstr("4611686018427387904"));
}

TEST_F(HostileInputTest, AHugeOutFeaturesIsReportedAsTheAttribute) {
  v1::EstimateResponse response;
  grpc::Status status = Estimate(LinearLayerRequest(int64_t{1} << 60), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_THAT(status.error_message(),
              ::testing::StartsWith("model.layers[0].attrs.out_features: "));
  EXPECT_THAT(status.error_message(), HasSubstr("1152921504606846976"));
}

}  // namespace
}  // namespace memest
