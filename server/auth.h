// Bearer-token authentication for memest.v1.MemoryEstimator (memest-server --auth-token-file).
//
// With a token file, every call to the estimator must carry the metadata
// "authorization: Bearer <token>", the file's content without surrounding whitespace; any other
// call gets UNAUTHENTICATED, which says what is expected and never echoes what was sent. The
// health service and reflection stay open (a load balancer's probe carries no token). The file
// is read again when its size or modification time changes, so a token is rotated by rewriting
// it. Tokens are compared in constant time.
#ifndef MEMEST_SERVER_AUTH_H_
#define MEMEST_SERVER_AUTH_H_

#include <grpcpp/grpcpp.h>

#include <mutex>
#include <string>
#include <string_view>

#include "engine/ir/status.h"

namespace memest {

class TokenAuth {
 public:
  // Reads `path` once: INVALID_ARGUMENT naming --auth-token-file when it cannot be read or holds
  // no token.
  static StatusOr<std::unique_ptr<TokenAuth>> Open(const std::string& path);

  // OK when the call's metadata carries the current token; UNAUTHENTICATED otherwise. A token
  // file that became unreadable keeps the last token it held.
  Status Check(const grpc::CallbackServerContext& context);

 private:
  explicit TokenAuth(std::string path) : path_(std::move(path)) {}
  Status Reload();  // with mu_ held

  const std::string path_;
  std::mutex mu_;
  std::string token_;
  long long mtime_ns_ = -1;
  long long size_ = -1;
};

// The token a --auth-token-file holds, surrounding whitespace trimmed (the server's and the
// CLI's reader): INVALID_ARGUMENT naming the flag and the path when the file cannot be read or
// holds nothing else.
StatusOr<std::string> ReadTokenFile(const std::string& path);

// Whether `a` and `b` are equal, in time that depends on their lengths only.
bool SameToken(std::string_view a, std::string_view b);

}  // namespace memest

#endif  // MEMEST_SERVER_AUTH_H_
