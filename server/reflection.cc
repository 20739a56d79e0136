#include "server/reflection.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>

#include <set>
#include <utility>

namespace memest {
namespace {

using google::protobuf::DescriptorPool;
using google::protobuf::FileDescriptor;
using grpc::reflection::v1::ServerReflectionRequest;
using grpc::reflection::v1::ServerReflectionResponse;

// The file asked for, always, and the files it imports, directly or not, that the stream has not
// had yet (`sent`): clients (grpcurl) expect the file they asked for in every answer.
void AddFile(const FileDescriptor* file, std::set<std::string>* sent,
             grpc::reflection::v1::FileDescriptorResponse* out, bool asked = true) {
  if (file == nullptr || (!sent->insert(file->name()).second && !asked)) return;
  google::protobuf::FileDescriptorProto proto;
  file->CopyTo(&proto);
  out->add_file_descriptor_proto(proto.SerializeAsString());
  for (int i = 0; i < file->dependency_count(); ++i) {
    AddFile(file->dependency(i), sent, out, /*asked=*/false);
  }
}

void NotFound(const std::string& what, ServerReflectionResponse* response) {
  response->mutable_error_response()->set_error_code(
      static_cast<int32_t>(grpc::StatusCode::NOT_FOUND));
  response->mutable_error_response()->set_error_message(what);
}

void Answer(const ServerReflectionRequest& request, const std::vector<std::string>& services,
            std::set<std::string>* sent, ServerReflectionResponse* response) {
  const DescriptorPool* pool = DescriptorPool::generated_pool();
  response->set_valid_host(request.host());
  *response->mutable_original_request() = request;
  switch (request.message_request_case()) {
    case ServerReflectionRequest::kListServices:
      for (const std::string& name : services) {
        response->mutable_list_services_response()->add_service()->set_name(name);
      }
      return;
    case ServerReflectionRequest::kFileByFilename: {
      const FileDescriptor* file = pool->FindFileByName(request.file_by_filename());
      if (file == nullptr) return NotFound("no file named " + request.file_by_filename(), response);
      return AddFile(file, sent, response->mutable_file_descriptor_response());
    }
    case ServerReflectionRequest::kFileContainingSymbol: {
      const FileDescriptor* file = pool->FindFileContainingSymbol(request.file_containing_symbol());
      if (file == nullptr) {
        return NotFound("no symbol named " + request.file_containing_symbol(), response);
      }
      return AddFile(file, sent, response->mutable_file_descriptor_response());
    }
    case ServerReflectionRequest::kFileContainingExtension: {
      const auto& wanted = request.file_containing_extension();
      const auto* type = pool->FindMessageTypeByName(wanted.containing_type());
      const auto* extension =
          type == nullptr ? nullptr : pool->FindExtensionByNumber(type, wanted.extension_number());
      if (extension == nullptr) {
        return NotFound("no extension " + std::to_string(wanted.extension_number()) + " of " +
                            wanted.containing_type(),
                        response);
      }
      return AddFile(extension->file(), sent, response->mutable_file_descriptor_response());
    }
    case ServerReflectionRequest::kAllExtensionNumbersOfType: {
      const auto* type = pool->FindMessageTypeByName(request.all_extension_numbers_of_type());
      if (type == nullptr) {
        return NotFound("no message type named " + request.all_extension_numbers_of_type(),
                        response);
      }
      auto* numbers = response->mutable_all_extension_numbers_response();
      numbers->set_base_type_name(type->full_name());
      std::vector<const google::protobuf::FieldDescriptor*> extensions;
      pool->FindAllExtensions(type, &extensions);
      for (const auto* extension : extensions) numbers->add_extension_number(extension->number());
      return;
    }
    case ServerReflectionRequest::MESSAGE_REQUEST_NOT_SET:
      break;
  }
  response->mutable_error_response()->set_error_code(
      static_cast<int32_t>(grpc::StatusCode::INVALID_ARGUMENT));
  response->mutable_error_response()->set_error_message("the request asks for nothing");
}

// One stream: a response for each request, in order.
class Stream final
    : public grpc::ServerBidiReactor<ServerReflectionRequest, ServerReflectionResponse> {
 public:
  explicit Stream(const std::vector<std::string>& services) : services_(services) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) return Finish(grpc::Status::OK);  // the client is done
    response_.Clear();
    Answer(request_, services_, &sent_, &response_);
    StartWrite(&response_);
  }
  void OnWriteDone(bool ok) override {
    if (!ok) return Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the stream broke"));
    StartRead(&request_);
  }
  void OnDone() override { delete this; }

 private:
  const std::vector<std::string>& services_;
  ServerReflectionRequest request_;
  ServerReflectionResponse response_;
  std::set<std::string> sent_;
};

}  // namespace

grpc::ServerBidiReactor<ServerReflectionRequest, ServerReflectionResponse>*
ReflectionV1::ServerReflectionInfo(grpc::CallbackServerContext* context) {
  return new Stream(services_);
}

}  // namespace memest
