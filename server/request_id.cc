#include "server/request_id.h"

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <random>

namespace memest {

bool ValidRequestId(std::string_view id) {
  if (id.empty() || id.size() > 64) return false;
  for (char c : id) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == ':' || c == '-';
    if (!ok) return false;
  }
  return true;
}

std::string NewRequestId() {
  // A random start per process, then one more per call: unique within the process, and two
  // processes (replicas) are unlikely to meet.
  static std::atomic<uint64_t> next{std::random_device{}() * uint64_t{0x9e3779b97f4a7c15}};
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx",
                static_cast<unsigned long long>(next.fetch_add(1, std::memory_order_relaxed)));
  return text;
}

std::string TagRequest(grpc::CallbackServerContext* context) {
  std::string id;
  const auto& metadata = context->client_metadata();
  const auto given = metadata.find(kRequestIdKey);
  if (given != metadata.end()) {
    const std::string_view value(given->second.data(), given->second.size());
    if (ValidRequestId(value)) id = std::string(value);
  }
  if (id.empty()) id = NewRequestId();
  context->AddInitialMetadata(kRequestIdKey, id);
  return id;
}

}  // namespace memest
