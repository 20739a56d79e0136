// A request id for each call, echoed in the reply's initial metadata and in the server's log line
// for the call, so a platform team can follow one request from a client's logs to the server's.
//
// The caller's own id, metadata "x-request-id", is kept when it is 1 to 64 characters of
// [A-Za-z0-9._:-] (no other byte can reach a log line through it); otherwise, or without one,
// the server makes one: 16 hex digits, random per process and counted per call.
#ifndef MEMEST_SERVER_REQUEST_ID_H_
#define MEMEST_SERVER_REQUEST_ID_H_

#include <grpcpp/grpcpp.h>

#include <string>
#include <string_view>

namespace memest {

inline constexpr char kRequestIdKey[] = "x-request-id";

// Whether `id` is an id the server keeps as the caller gave it.
bool ValidRequestId(std::string_view id);

// A fresh id: 16 lowercase hex digits, different for every call of the process.
std::string NewRequestId();

// The call's id (the caller's, when valid, else a new one), added to the reply's initial
// metadata. Call it before the reply's first message or its status.
std::string TagRequest(grpc::CallbackServerContext* context);

}  // namespace memest

#endif  // MEMEST_SERVER_REQUEST_ID_H_
