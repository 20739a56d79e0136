// The pipe between memest-server and memest-validate-worker.
//
// The server runs every validation in a child process (a CUDA fault, an out-of-memory kill or a
// hang then takes the child, never the server, and the device memory goes back when it exits).
// The child reads one serialized v1::ValidateRequest from stdin (to EOF) and writes frames to
// stdout: a type byte, a 4-byte little-endian length, the payload. 'E' frames carry a
// serialized v1::ValidateEvent; the last frame is one 'S' frame with the final status
// ("<code>\n<message>"). A child that exits without an 'S' frame died.
#ifndef MEMEST_SERVER_WORKER_PROTOCOL_H_
#define MEMEST_SERVER_WORKER_PROTOCOL_H_

#include <spawn.h>
#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>

#include "engine/ir/status.h"
#include "memest/v1/memest.pb.h"

namespace memest::worker {

inline constexpr char kEventFrame = 'E';
inline constexpr char kStatusFrame = 'S';
inline constexpr uint32_t kMaxFrameBytes = 256u << 20;

// Writes one frame to `fd`, all of it (retrying short writes); false if the pipe is gone.
bool WriteFrame(int fd, char type, const std::string& payload);
bool WriteEvent(int fd, const v1::ValidateEvent& event);
bool WriteStatus(int fd, const Status& status);
Status ParseStatus(const std::string& payload);

// write() to the worker's stdin, whose reader may be gone, without SIGPIPE and without touching
// the process's disposition (the server may be embedded in another program): SIGPIPE is blocked
// in the calling thread for the call, and the one a broken pipe raises (directed at this
// thread) is consumed before the mask is restored. A gone reader is then -1 with errno EPIPE.
ssize_t WriteWithoutSigpipe(int fd, const char* data, size_t size);

// posix_spawn of the worker at `path` with a clean signal state: an empty mask, and SIGTERM,
// SIGINT and SIGPIPE at their defaults, whatever the calling thread blocks or the process
// ignores. memest-server blocks SIGTERM and SIGINT in every thread (they are taken by sigwait),
// and the metrics' HTTP server ignores SIGPIPE; a child inherits both across exec, and a worker
// that blocks SIGTERM cannot be stopped gently. Returns posix_spawn's error number.
int SpawnWithDefaultSignals(pid_t* pid, const std::string& path,
                            const posix_spawn_file_actions_t* actions, char* const argv[]);

// Accumulates bytes read from the pipe and cuts them into frames.
class FrameReader {
 public:
  void Append(const char* data, size_t n) { buffer_.append(data, n); }
  struct Frame {
    char type;
    std::string payload;
  };
  // The next complete frame, if any; an error for a malformed stream.
  StatusOr<std::optional<Frame>> Next();

 private:
  std::string buffer_;
};

}  // namespace memest::worker

#endif  // MEMEST_SERVER_WORKER_PROTOCOL_H_
