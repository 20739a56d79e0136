#include "server/call_log.h"

#include <spdlog/spdlog.h>

#include "engine/ir/text.h"
#include "server/json_log.h"
#include "server/status_conversion.h"

namespace memest {
namespace {

// The most bytes of an error a log line repeats, as the reply's message is bounded.
constexpr size_t kMaxLoggedError = 1024;

}  // namespace

void RecordCall(const grpc::CallbackServerContext& context, const CallRecord& call,
                const Status& status, Metrics* metrics) {
  const auto elapsed = std::chrono::steady_clock::now() - call.start;
  const auto micros = std::chrono::duration_cast<std::chrono::microseconds>(elapsed).count();
  if (JsonLogs()) {
    std::string fields = "\"rpc\":" + JsonString(call.method) + ",\"id\":" + JsonString(call.id) +
                         ",\"model\":" + JsonString(call.model) +
                         ",\"code\":" + JsonString(StatusCodeName(status.code())) +
                         ",\"us\":" + std::to_string(micros) +
                         ",\"peer\":" + JsonString(context.peer());
    if (!status.ok()) {
      fields += ",\"error\":" + JsonString(BoundMessage(status.message(), kMaxLoggedError));
    }
    spdlog::info("{}", JsonFields(fields));
  } else if (status.ok()) {
    spdlog::info("rpc={} id={} model={} code=OK us={} peer={}", call.method, call.id, call.model,
                 micros, context.peer());
  } else {
    spdlog::info("rpc={} id={} model={} code={} us={} peer={} error=\"{}\"", call.method, call.id,
                 call.model, StatusCodeName(status.code()), micros, context.peer(),
                 BoundMessage(status.message(), kMaxLoggedError));
  }
  if (metrics != nullptr) {
    metrics->Finished(call.method, status.code(), std::chrono::duration<double>(elapsed).count(),
                      call.request_bytes);
  }
}

}  // namespace memest
