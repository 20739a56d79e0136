// grpc.reflection.v1 (server/reflection.h) over a real server, as grpcurl asks it: the services,
// the file that defines a symbol with its imports, files by name, extensions, and errors for
// names that do not exist, all on one stream.
#include "server/reflection.h"

#include <gmock/gmock.h>
#include <google/protobuf/descriptor.pb.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/server/test_server.h"

namespace memest {
namespace {

using grpc::reflection::v1::ServerReflectionRequest;
using grpc::reflection::v1::ServerReflectionResponse;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::UnorderedElementsAre;

// The names of the files in a file_descriptor_response, in order.
std::vector<std::string> FileNames(const ServerReflectionResponse& response) {
  std::vector<std::string> names;
  for (const std::string& bytes : response.file_descriptor_response().file_descriptor_proto()) {
    google::protobuf::FileDescriptorProto file;
    EXPECT_TRUE(file.ParseFromString(bytes));
    names.push_back(file.name());
  }
  return names;
}

class ReflectionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    stub_ = grpc::reflection::v1::ServerReflection::NewStub(server_.channel());
    context_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    stream_ = stub_->ServerReflectionInfo(&context_);
  }

  ServerReflectionResponse Ask(const ServerReflectionRequest& request) {
    ServerReflectionResponse response;
    EXPECT_TRUE(stream_->Write(request));
    EXPECT_TRUE(stream_->Read(&response));
    EXPECT_EQ(response.original_request().SerializeAsString(), request.SerializeAsString());
    return response;
  }

  testing::TestServer server_;
  std::unique_ptr<grpc::reflection::v1::ServerReflection::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<ServerReflectionRequest, ServerReflectionResponse>>
      stream_;
};

TEST_F(ReflectionTest, AnswersWhatGrpcurlAsks) {
  ServerReflectionRequest list;
  list.set_list_services("");
  const ServerReflectionResponse listed = Ask(list);
  std::vector<std::string> services;
  for (const auto& s : listed.list_services_response().service()) services.push_back(s.name());
  EXPECT_THAT(services, UnorderedElementsAre("memest.v1.MemoryEstimator", "grpc.health.v1.Health",
                                             "grpc.reflection.v1.ServerReflection",
                                             "grpc.reflection.v1alpha.ServerReflection"));

  // The service's file first, then its imports; a method's name finds the same file.
  ServerReflectionRequest symbol;
  symbol.set_file_containing_symbol("memest.v1.MemoryEstimator");
  const std::vector<std::string> files = FileNames(Ask(symbol));
  ASSERT_FALSE(files.empty());
  EXPECT_EQ(files[0], "memest/v1/memest.proto");
  EXPECT_THAT(files, Contains("google/protobuf/struct.proto"));
  // Asked again on the same stream: the file again, its imports (already sent) not.
  symbol.set_file_containing_symbol("memest.v1.MemoryEstimator.Estimate");
  EXPECT_THAT(FileNames(Ask(symbol)), ElementsAre("memest/v1/memest.proto"));
  ServerReflectionRequest import;
  import.set_file_by_filename("google/protobuf/struct.proto");
  EXPECT_THAT(FileNames(Ask(import)), ElementsAre("google/protobuf/struct.proto"));

  ServerReflectionRequest health;
  health.set_file_containing_symbol("grpc.health.v1.Health");
  EXPECT_THAT(FileNames(Ask(health)), Contains("grpc/health/v1/health.proto"));

  ServerReflectionRequest by_name;
  by_name.set_file_by_filename("grpc/reflection/v1/reflection.proto");
  EXPECT_THAT(FileNames(Ask(by_name)), Contains("grpc/reflection/v1/reflection.proto"));

  ServerReflectionRequest extensions;
  extensions.set_all_extension_numbers_of_type("memest.v1.EstimateRequest");
  const ServerReflectionResponse numbers = Ask(extensions);
  EXPECT_EQ(numbers.all_extension_numbers_response().base_type_name(), "memest.v1.EstimateRequest");
  EXPECT_EQ(numbers.all_extension_numbers_response().extension_number_size(), 0);

  std::vector<ServerReflectionRequest> unknown(4);
  unknown[0].set_file_containing_symbol("memest.v1.NoSuchThing");
  unknown[1].set_file_by_filename("no/such.proto");
  unknown[2].set_all_extension_numbers_of_type("no.Such");
  unknown[3].mutable_file_containing_extension()->set_containing_type("no.Such");
  for (const ServerReflectionRequest& request : unknown) {
    EXPECT_EQ(Ask(request).error_response().error_code(),
              static_cast<int>(grpc::StatusCode::NOT_FOUND))
        << request.ShortDebugString();
  }
  EXPECT_TRUE(stream_->WritesDone());
  EXPECT_TRUE(stream_->Finish().ok());
}

}  // namespace
}  // namespace memest
