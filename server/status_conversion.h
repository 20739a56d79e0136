// The one mapping from engine errors to gRPC statuses.
//
// Every handler answers an engine Status through ToGrpcStatus, so a code means the same on
// every RPC, and the engine's message (which names the offending field) reaches the client
// unchanged, but for a bound: request text in messages is quoted and cut where it is put in
// (engine/ir/text.h), and this conversion bounds the whole message once more, whatever put it
// together, so that no request can make a reply too large for gRPC to deliver.
#ifndef MEMEST_SERVER_STATUS_CONVERSION_H_
#define MEMEST_SERVER_STATUS_CONVERSION_H_

#include <grpcpp/support/status.h>

#include <cstddef>
#include <functional>

#include "engine/ir/status.h"

namespace memest {

// The gRPC code for an engine code: kInvalidArgument -> INVALID_ARGUMENT, kNotFound ->
// NOT_FOUND, and so on one to one; an unknown value -> UNKNOWN.
grpc::StatusCode ToGrpcCode(StatusCode code);

// The most bytes of a status message sent. gRPC carries the message in the reply's trailers,
// percent-encoding every byte outside printable ASCII (up to three bytes each), and a client
// refuses trailers over 8 KiB by default (and then fails the call with a message of its own):
// 1 KiB stays below that even fully encoded, and is room for any field path with a few quoted
// names.
inline constexpr size_t kMaxStatusMessage = 1024;

// The gRPC status for an engine status, with its message (control characters and bytes that are
// not UTF-8 escaped, cut to kMaxStatusMessage bytes at a character boundary; engine/ir/text.h's
// BoundMessage); OK for OK.
grpc::Status ToGrpcStatus(const Status& status);

// Runs `work`; an exception that escapes it (std::bad_alloc, say) becomes INTERNAL naming it, so
// that one request cannot take down the server's worker thread and with it the process.
Status CatchAll(const std::function<Status()>& work);

}  // namespace memest

#endif  // MEMEST_SERVER_STATUS_CONVERSION_H_
