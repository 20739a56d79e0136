// The one mapping from engine errors to gRPC statuses.
//
// Every handler answers an engine Status through ToGrpcStatus, so a code means the same on
// every RPC, and the engine's message (which names the offending field) reaches the client
// unchanged.
#ifndef MEMEST_SERVER_STATUS_CONVERSION_H_
#define MEMEST_SERVER_STATUS_CONVERSION_H_

#include <grpcpp/support/status.h>

#include "engine/status.h"

namespace memest {

// The gRPC code for an engine code: kInvalidArgument -> INVALID_ARGUMENT, kNotFound ->
// NOT_FOUND, and so on one to one; an unknown value -> UNKNOWN.
grpc::StatusCode ToGrpcCode(StatusCode code);

// The gRPC status for an engine status, with its message; OK for OK.
grpc::Status ToGrpcStatus(const Status& status);

}  // namespace memest

#endif  // MEMEST_SERVER_STATUS_CONVERSION_H_
