// Structured logs: `memest-server --log-format json` writes one JSON object a line to stderr,
//
//   {"time":"2026-11-29T19:45:44.123456Z","level":"info","msg":"memest-server 0.1.0 ... listening"}
//   {"time":"...","level":"info","rpc":"Estimate","id":"job-1234","model":"preset:gpt2-small",
//    "code":"OK","us":1830,"peer":"ipv4:10.0.0.7:51234"}
//
// A call's record (server/call_log.h) becomes fields of its own; any other message is "msg".
// Every string is escaped as JSON requires, so no request text can break a line or forge one.
#ifndef MEMEST_SERVER_JSON_LOG_H_
#define MEMEST_SERVER_JSON_LOG_H_

#include <spdlog/logger.h>

#include <memory>
#include <string>
#include <string_view>

namespace memest {

// Makes `logger` write JSON lines, and JsonLogs() true.
void UseJsonLogs(spdlog::logger& logger);
bool JsonLogs();

// `text` as a JSON string, quotes included: "a\"b\n" for a"b and a newline; bytes that are not
// UTF-8 become \ufffd, so that the line stays valid JSON.
std::string JsonString(std::string_view text);

// A message whose fields are already JSON ("\"rpc\":\"Estimate\",\"us\":12"): the formatter
// puts them beside time and level instead of quoting them as "msg". Log it with
// spdlog::info("{}", JsonFields(...)).
std::string JsonFields(std::string_view fields);

}  // namespace memest

#endif  // MEMEST_SERVER_JSON_LOG_H_
