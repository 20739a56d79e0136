// The record of one finished call: its log line (spdlog, info) and its metrics.
//
//   rpc=Estimate id=job-1234 model=preset:gpt2-small code=OK us=1830 peer=ipv4:10.0.0.7:51234
//
// Request text in the line is escaped and bounded (engine/ir/text.h); an error is cut to 1 KiB
// as the reply's message is (server/status_conversion.h), so one call logs one line.
#ifndef MEMEST_SERVER_CALL_LOG_H_
#define MEMEST_SERVER_CALL_LOG_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <string>

#include "engine/ir/status.h"
#include "server/metrics.h"

namespace memest {

struct CallRecord {
  const char* method = "";                      // "Estimate"
  std::string id;                               // server/request_id.h
  std::string model = "-";                      // DescribeModel's, or "-"
  std::chrono::steady_clock::time_point start;  // the call's arrival
  int64_t request_bytes = -1;                   // negative: not known
};

// Logs `call` with `status`, and counts it in `metrics` (null: none).
void RecordCall(const grpc::CallbackServerContext& context, const CallRecord& call,
                const Status& status, Metrics* metrics);

}  // namespace memest

#endif  // MEMEST_SERVER_CALL_LOG_H_
