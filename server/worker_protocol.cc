#include "server/worker_protocol.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

extern char** environ;

namespace memest::worker {

ssize_t WriteWithoutSigpipe(int fd, const char* data, size_t size) {
  sigset_t pipe_only, old;
  sigemptyset(&pipe_only);
  sigaddset(&pipe_only, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_only, &old);
  const ssize_t w = write(fd, data, size);
  const int err = errno;
  if (w < 0 && err == EPIPE) {
    const timespec now{0, 0};
    while (sigtimedwait(&pipe_only, nullptr, &now) < 0 && errno == EINTR) {
    }
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  errno = err;
  return w;
}

int SpawnWithDefaultSignals(pid_t* pid, const std::string& path,
                            const posix_spawn_file_actions_t* actions, char* const argv[]) {
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  for (int signal : {SIGTERM, SIGINT, SIGPIPE}) sigaddset(&defaults, signal);
  posix_spawnattr_setsigmask(&attributes, &none);
  posix_spawnattr_setsigdefault(&attributes, &defaults);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  const int rc = posix_spawn(pid, path.c_str(), actions, &attributes, argv, environ);
  posix_spawnattr_destroy(&attributes);
  return rc;
}

bool WriteFrame(int fd, char type, const std::string& payload) {
  std::string frame(5, '\0');
  frame[0] = type;
  const uint32_t n = static_cast<uint32_t>(payload.size());
  for (int i = 0; i < 4; ++i) frame[1 + i] = static_cast<char>((n >> (8 * i)) & 0xff);
  frame += payload;
  size_t done = 0;
  while (done < frame.size()) {
    const ssize_t w = ::write(fd, frame.data() + done, frame.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    done += static_cast<size_t>(w);
  }
  return true;
}

bool WriteEvent(int fd, const v1::ValidateEvent& event) {
  return WriteFrame(fd, kEventFrame, event.SerializeAsString());
}

bool WriteStatus(int fd, const Status& status) {
  return WriteFrame(fd, kStatusFrame,
                    std::to_string(static_cast<int>(status.code())) + "\n" + status.message());
}

Status ParseStatus(const std::string& payload) {
  const size_t nl = payload.find('\n');
  int code = -1;
  try {
    code = std::stoi(payload.substr(0, nl));
  } catch (...) {
  }
  if (nl == std::string::npos || code < 0 ||
      code > static_cast<int>(StatusCode::kDeadlineExceeded)) {
    return Internal("validation worker: malformed status frame");
  }
  return Status(static_cast<StatusCode>(code), payload.substr(nl + 1));
}

StatusOr<std::optional<FrameReader::Frame>> FrameReader::Next() {
  if (buffer_.size() < 5) return std::optional<Frame>();
  uint32_t n = 0;
  for (int i = 0; i < 4; ++i)
    n |= static_cast<uint32_t>(static_cast<unsigned char>(buffer_[1 + i])) << (8 * i);
  if ((buffer_[0] != kEventFrame && buffer_[0] != kStatusFrame) || n > kMaxFrameBytes) {
    return Internal("validation worker: malformed frame");
  }
  if (buffer_.size() < 5 + static_cast<size_t>(n)) return std::optional<Frame>();
  Frame f{buffer_[0], buffer_.substr(5, n)};
  buffer_.erase(0, 5 + static_cast<size_t>(n));
  return std::optional<Frame>(std::move(f));
}

}  // namespace memest::worker
