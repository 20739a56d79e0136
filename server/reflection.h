// grpc.reflection.v1.ServerReflection: what services the server has and the files that define
// them, for clients that ask v1 (grpcurl, Postman, grpcui) rather than the v1alpha that gRPC
// 1.51's own plugin serves (both are served; reflection, like health, needs no token).
//
// Files come from the process's generated descriptor pool: the file asked for is always sent,
// with the files it imports that the stream has not had yet, as clients expect. (A later gRPC
// whose reflection plugin serves v1 itself would register grpc.reflection.v1 twice: drop this one
// then.) Unknown names get an error_response
// (NOT_FOUND), not a failed stream.
#ifndef MEMEST_SERVER_REFLECTION_H_
#define MEMEST_SERVER_REFLECTION_H_

#include <string>
#include <vector>

#include "grpc/reflection/v1/reflection.grpc.pb.h"

namespace memest {

class ReflectionV1 final : public grpc::reflection::v1::ServerReflection::CallbackService {
 public:
  // `services`: the fully qualified names list_services answers.
  explicit ReflectionV1(std::vector<std::string> services) : services_(std::move(services)) {}

  grpc::ServerBidiReactor<grpc::reflection::v1::ServerReflectionRequest,
                          grpc::reflection::v1::ServerReflectionResponse>*
  ServerReflectionInfo(grpc::CallbackServerContext* context) override;

  const std::vector<std::string>& services() const { return services_; }

 private:
  const std::vector<std::string> services_;
};

}  // namespace memest

#endif  // MEMEST_SERVER_REFLECTION_H_
