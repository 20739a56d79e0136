// Requests in and replies out as bytes, for the methods the server registers raw.
//
// gRPC's generated handlers parse a request before the handler runs and answer a request that
// does not parse with UNIMPLEMENTED and an empty message, which tells the caller nothing. The
// methods that take a request (Estimate, Validate) are therefore registered as raw methods:
// they receive the bytes, and ParseRequest turns a parse failure into INVALID_ARGUMENT with a
// message that names the field where it can.
//
// Protobuf's parser only says that it failed. It fails a proto3 string that is not valid UTF-8
// after storing it, and logs a line naming the field ("String field 'memest.v1.Preset.name'
// contains invalid UTF-8 ..."). ParseRequest looks for that string in what was parsed, which
// gives its path in the request as the engine names fields ("model.layers[3].name"); where
// protobuf did not keep it (a map entry that fails is dropped whole), it names the field from
// the log line ("memest.v1.AttrValue.s"), which it captures on its own thread while it parses
// (the protobuf log handler InstallProtobufLogHandler sets up sends every other line to spdlog).
// Bytes that are not protobuf at all get a message saying so, with the type expected.
#ifndef MEMEST_SERVER_WIRE_H_
#define MEMEST_SERVER_WIRE_H_

#include <google/protobuf/message.h>
#include <grpcpp/support/byte_buffer.h>

#include "engine/ir/status.h"

namespace memest {

// Routes protobuf's log lines through spdlog (warnings and errors at their level, escaped and
// bounded), except those ParseRequest captures. Call once at startup, before any thread parses
// (protobuf's handler is not safe to replace while in use); later calls do nothing.
void InstallProtobufLogHandler();

// Parses `bytes` into `request` (cleared first). On failure, INVALID_ARGUMENT:
// "model.preset.name: is not valid UTF-8 (proto3 strings must be): 'gpt2\xFF'" when a string is
// at fault, otherwise "request: not a valid memest.v1.EstimateRequest (...)".
Status ParseRequest(const grpc::ByteBuffer& bytes, google::protobuf::Message* request);

// Serializes `reply` into `bytes`; INTERNAL if protobuf refuses (a reply over 2 GiB).
Status SerializeReply(const google::protobuf::Message& reply, grpc::ByteBuffer* bytes);

}  // namespace memest

#endif  // MEMEST_SERVER_WIRE_H_
