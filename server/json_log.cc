#include "server/json_log.h"

#include <spdlog/formatter.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>

#include "engine/ir/text.h"

namespace memest {
namespace {

// Starts a payload that JsonFields made; no other message starts with it.
constexpr char kFieldsMarker = '\x1f';

std::atomic<bool> json_logs{false};

void AppendEscaped(std::string_view text, std::string& out) {
  for (size_t i = 0; i < text.size();) {
    const char c = text[i];
    const size_t n = Utf8SequenceLength(text, i);
    if (n == 0) {
      out += "\\ufffd";
      ++i;
      continue;
    }
    if (n > 1) {
      out.append(text.data() + i, n);
      i += n;
      continue;
    }
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
          char escaped[8];
          std::snprintf(escaped, sizeof(escaped), "\\u%04x", static_cast<unsigned char>(c));
          out += escaped;
        } else {
          out += c;
        }
    }
    ++i;
  }
}

class JsonFormatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    const auto since_epoch = msg.time.time_since_epoch();
    const std::time_t seconds =
        std::chrono::duration_cast<std::chrono::seconds>(since_epoch).count();
    const long micros = static_cast<long>(
        std::chrono::duration_cast<std::chrono::microseconds>(since_epoch).count() % 1000000);
    std::tm utc{};
    gmtime_r(&seconds, &utc);
    char time[40];
    const size_t n = std::strftime(time, sizeof(time), "%Y-%m-%dT%H:%M:%S", &utc);
    std::snprintf(time + n, sizeof(time) - n, ".%06ldZ", micros);
    std::string line = "{\"time\":\"";
    line += time;
    line += "\",\"level\":\"";
    const auto level = spdlog::level::to_string_view(msg.level);
    line.append(level.data(), level.size());
    line += "\",";
    const std::string_view payload(msg.payload.data(), msg.payload.size());
    if (!payload.empty() && payload[0] == kFieldsMarker) {
      line.append(payload.substr(1));
    } else {
      line += "\"msg\":";
      line += JsonString(payload);
    }
    line += "}\n";
    dest.append(line.data(), line.data() + line.size());
  }

  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<JsonFormatter>();
  }
};

}  // namespace

void UseJsonLogs(spdlog::logger& logger) {
  logger.set_formatter(std::make_unique<JsonFormatter>());
  json_logs = true;
}

bool JsonLogs() { return json_logs; }

std::string JsonString(std::string_view text) {
  std::string out = "\"";
  AppendEscaped(text, out);
  out += '"';
  return out;
}

std::string JsonFields(std::string_view fields) {
  std::string out(1, kFieldsMarker);
  out.append(fields);
  return out;
}

}  // namespace memest
