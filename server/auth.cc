#include "server/auth.h"

#include <sys/stat.h>

#include <memory>
#include <utility>

#include "engine/ir/text.h"
#include "server/flag_file.h"

namespace memest {
namespace {

constexpr char kFlag[] = "--auth-token-file";
constexpr size_t kMaxToken = 4096;

}  // namespace

StatusOr<std::string> ReadTokenFile(const std::string& path) {
  MEMEST_ASSIGN_OR_RETURN(const std::string s, ReadFlagFile(kFlag, path, kMaxToken));
  const size_t begin = s.find_first_not_of(" \t\r\n");
  if (begin == std::string::npos) {
    return InvalidArgument(std::string(kFlag) + ": " + Quote(path) + " holds no token");
  }
  return s.substr(begin, s.find_last_not_of(" \t\r\n") - begin + 1);
}

bool SameToken(std::string_view a, std::string_view b) {
  const size_t n = a.size() > b.size() ? a.size() : b.size();
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

StatusOr<std::unique_ptr<TokenAuth>> TokenAuth::Open(const std::string& path) {
  std::unique_ptr<TokenAuth> auth(new TokenAuth(path));
  std::lock_guard<std::mutex> lock(auth->mu_);
  MEMEST_RETURN_IF_ERROR(auth->Reload());
  return auth;
}

Status TokenAuth::Reload() {
  struct stat st;
  if (stat(path_.c_str(), &st) != 0) {
    return InvalidArgument(std::string(kFlag) + ": cannot read " + Quote(path_));
  }
  const long long mtime =
      static_cast<long long>(st.st_mtim.tv_sec) * 1'000'000'000LL + st.st_mtim.tv_nsec;
  if (mtime == mtime_ns_ && static_cast<long long>(st.st_size) == size_) return Status::Ok();
  if (st.st_size > static_cast<off_t>(kMaxToken)) {
    return InvalidArgument(std::string(kFlag) + ": the token file holds more than " +
                           std::to_string(kMaxToken) + " bytes");
  }
  MEMEST_ASSIGN_OR_RETURN(const std::string token, ReadTokenFile(path_));
  for (char c : token) {
    if (c < 0x21 || c > 0x7e) {
      return InvalidArgument(std::string(kFlag) +
                             ": the token must be printable ASCII without spaces");
    }
  }
  token_ = token;
  mtime_ns_ = mtime;
  size_ = static_cast<long long>(st.st_size);
  return Status::Ok();
}

Status TokenAuth::Check(const grpc::CallbackServerContext& context) {
  std::string token;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const Status reloaded = Reload();  // an unreadable file keeps the last token
    (void)reloaded;
    token = token_;
  }
  const auto& metadata = context.client_metadata();
  const auto it = metadata.find("authorization");
  constexpr std::string_view kBearer = "Bearer ";
  if (it != metadata.end()) {
    const std::string_view value(it->second.data(), it->second.size());
    if (value.size() > kBearer.size() && value.substr(0, kBearer.size()) == kBearer &&
        SameToken(value.substr(kBearer.size()), token)) {
      return Status::Ok();
    }
  }
  return Unauthenticated(
      "this server requires its bearer token: metadata 'authorization: "
      "Bearer <token>' (memest --auth-token-file FILE, "
      "memest.Client(..., token=...))");
}

}  // namespace memest
