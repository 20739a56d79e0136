#include "server/status_conversion.h"

#include <exception>
#include <string>

#include "engine/ir/text.h"

namespace memest {

grpc::StatusCode ToGrpcCode(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return grpc::StatusCode::OK;
    case StatusCode::kInvalidArgument:
      return grpc::StatusCode::INVALID_ARGUMENT;
    case StatusCode::kNotFound:
      return grpc::StatusCode::NOT_FOUND;
    case StatusCode::kResourceExhausted:
      return grpc::StatusCode::RESOURCE_EXHAUSTED;
    case StatusCode::kFailedPrecondition:
      return grpc::StatusCode::FAILED_PRECONDITION;
    case StatusCode::kUnavailable:
      return grpc::StatusCode::UNAVAILABLE;
    case StatusCode::kInternal:
      return grpc::StatusCode::INTERNAL;
    case StatusCode::kCancelled:
      return grpc::StatusCode::CANCELLED;
    case StatusCode::kDeadlineExceeded:
      return grpc::StatusCode::DEADLINE_EXCEEDED;
    case StatusCode::kUnauthenticated:
      return grpc::StatusCode::UNAUTHENTICATED;
  }
  return grpc::StatusCode::UNKNOWN;
}

grpc::Status ToGrpcStatus(const Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(ToGrpcCode(status.code()), BoundMessage(status.message(), kMaxStatusMessage));
}

Status CatchAll(const std::function<Status()>& work) {
  try {
    return work();
  } catch (const std::exception& error) {
    return Internal(std::string("the server failed on this request: ") + error.what());
  } catch (...) {
    return Internal("the server failed on this request");
  }
}

}  // namespace memest
