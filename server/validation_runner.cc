#include "server/validation_runner.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <thread>

#include "server/worker_protocol.h"

extern char** environ;

namespace memest {
namespace {

std::string SiblingWorker() {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return "memest-validate-worker";
  std::string path(self, static_cast<size_t>(n));
  return path.substr(0, path.rfind('/') + 1) + "memest-validate-worker";
}

std::string DescribeExit(int wstatus) {
  if (WIFSIGNALED(wstatus)) {
    const int sig = WTERMSIG(wstatus);
    const char* name = sigabbrev_np(sig);
    return std::string("killed by signal ") + std::to_string(sig) +
           (name ? std::string(" (SIG") + name + ")" : "");
  }
  return "exited with status " + std::to_string(WEXITSTATUS(wstatus));
}

// Stops the child: SIGTERM, then SIGKILL once `grace` has passed.
int Stop(pid_t pid, std::chrono::milliseconds grace) {
  kill(pid, SIGTERM);
  const auto until = std::chrono::steady_clock::now() + grace;
  int wstatus = 0;
  while (std::chrono::steady_clock::now() < until) {
    if (waitpid(pid, &wstatus, WNOHANG) == pid) return wstatus;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill(pid, SIGKILL);
  while (waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {
  }
  return wstatus;
}

}  // namespace

ValidationRunner::ValidationRunner(ValidationOptions options)
    : options_(std::move(options)),
      worker_(options_.worker_path.empty() ? SiblingWorker() : options_.worker_path) {
  if (options_.device < 0) {
    available_ = Unavailable(
        "this memest-server was started without --device: it estimates but "
        "does not validate (start it with --device 0 on a machine with a GPU)");
  } else {
    available_ = Unavailable("the device has not been probed yet");
  }
}

std::vector<std::string> ValidationRunner::WorkerArgs() const {
  std::vector<std::string> args = {worker_, "--device", std::to_string(options_.device)};
  args.insert(args.end(), options_.worker_args.begin(), options_.worker_args.end());
  return args;
}

Status ValidationRunner::Probe() {
  if (options_.device < 0) return available_;
  std::vector<std::string> args = WorkerArgs();
  args.push_back("--probe");
  // A driver that hangs must not hold the server's start for ever.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  Status s = RunWorker(
      args, "", [](const v1::ValidateEvent&) { return true; },
      [until] {
        return std::chrono::steady_clock::now() < until
                   ? Status::Ok()
                   : DeadlineExceeded("the device did not answer within 60 s");
      });
  std::lock_guard<std::mutex> lock(mu_);
  available_ = s.ok() ? Status::Ok()
                      : Unavailable("device " + std::to_string(options_.device) +
                                    " cannot validate: " + s.message());
  return s.ok() ? s : available_;
}

Status ValidationRunner::Available() const {
  std::lock_guard<std::mutex> lock(mu_);
  return available_;
}

int ValidationRunner::in_queue() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(queue_.size());
}

Status ValidationRunner::Validate(const v1::ValidateRequest& request,
                                  const std::function<bool(const v1::ValidateEvent&)>& emit,
                                  const std::function<bool()>& stopped,
                                  Clock::time_point deadline) {
  const Clock::time_point limit = Clock::now() + options_.max_duration;
  const bool ours = limit < deadline;  // this server's limit comes first
  if (ours) deadline = limit;
  auto why_stop = [&]() -> Status {
    if (stopped()) return Cancelled("validation cancelled by the caller");
    if (Clock::now() >= deadline) {
      return DeadlineExceeded(ours ? "validation took longer than this server allows (" +
                                         std::to_string(options_.max_duration.count()) + " s)"
                                   : "validation deadline exceeded");
    }
    return Status::Ok();
  };
  uint64_t ticket = 0;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (!available_.ok()) return available_;
    const int waiting = static_cast<int>(queue_.size()) - 1;  // the front one runs
    if (waiting >= options_.max_queued) {
      return ResourceExhausted("validation queue is full: " + std::to_string(queue_.size()) +
                               " validations ahead (this server queues at most " +
                               std::to_string(options_.max_queued) + ")");
    }
    ticket = next_ticket_++;
    queue_.push_back(ticket);
    int reported = -1;
    while (queue_.front() != ticket) {
      const int position =
          static_cast<int>(std::find(queue_.begin(), queue_.end(), ticket) - queue_.begin());
      if (position != reported) {
        reported = position;
        v1::ValidateEvent e;
        e.mutable_progress()->set_stage(v1::ValidateProgress::STAGE_QUEUED);
        e.mutable_progress()->set_queue_position(position);
        e.mutable_progress()->set_message(std::to_string(position) + " validation" +
                                          (position == 1 ? "" : "s") + " ahead");
        lock.unlock();
        const bool ok = emit(e);
        lock.lock();
        if (!ok) {
          queue_.erase(std::find(queue_.begin(), queue_.end(), ticket));
          turn_.notify_all();
          return Cancelled("validation cancelled by the caller");
        }
      }
      turn_.wait_for(lock, std::chrono::milliseconds(100));
      lock.unlock();
      Status s = why_stop();
      lock.lock();
      if (!s.ok()) {
        queue_.erase(std::find(queue_.begin(), queue_.end(), ticket));
        turn_.notify_all();
        return s;
      }
    }
  }
  Status result = why_stop();
  if (result.ok()) {
    result = RunWorker(WorkerArgs(), request.SerializeAsString(), emit, why_stop);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.pop_front();
  }
  turn_.notify_all();
  return result;
}

Status ValidationRunner::RunWorker(const std::vector<std::string>& args, const std::string& input,
                                   const std::function<bool(const v1::ValidateEvent&)>& emit,
                                   const std::function<Status()>& stop) {
  int in[2], out[2];
  if (pipe2(in, O_CLOEXEC) != 0) return Internal(std::string("pipe: ") + strerror(errno));
  if (pipe2(out, O_CLOEXEC) != 0) {
    close(in[0]);
    close(in[1]);
    return Internal(std::string("pipe: ") + strerror(errno));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in[0], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = worker::SpawnWithDefaultSignals(&pid, worker_, &actions, argv.data());
  posix_spawn_file_actions_destroy(&actions);
  close(in[0]);
  close(out[1]);
  if (rc != 0) {
    close(in[1]);
    close(out[0]);
    return Unavailable("cannot start the validation worker " + worker_ + ": " + strerror(rc));
  }
  int to_child = in[1];
  fcntl(to_child, F_SETFL, O_NONBLOCK);
  size_t sent = 0;
  if (input.empty()) {
    close(to_child);
    to_child = -1;
  }
  worker::FrameReader reader;
  std::optional<Status> final_status;
  Status stopped_for = Status::Ok();
  bool eof = false;
  char chunk[1 << 16];
  while (!eof) {
    pollfd fds[2] = {{out[0], POLLIN, 0}, {to_child, POLLOUT, 0}};
    const int n = poll(fds, to_child >= 0 ? 2 : 1, 100);
    if (n < 0 && errno != EINTR) break;
    if (to_child >= 0 && (fds[1].revents & (POLLOUT | POLLERR | POLLHUP))) {
      const ssize_t w =
          worker::WriteWithoutSigpipe(to_child, input.data() + sent, input.size() - sent);
      if (w > 0) sent += static_cast<size_t>(w);
      if ((w < 0 && errno != EAGAIN && errno != EINTR) || sent == input.size()) {
        close(to_child);  // all sent, or the child stopped reading (it reports why)
        to_child = -1;
      }
    }
    if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      const ssize_t r = read(out[0], chunk, sizeof(chunk));
      if (r == 0) eof = true;
      if (r > 0) {
        reader.Append(chunk, static_cast<size_t>(r));
        while (true) {
          StatusOr<std::optional<worker::FrameReader::Frame>> f = reader.Next();
          if (!f.ok()) {
            stopped_for = f.status();
            break;
          }
          if (!f->has_value()) break;
          worker::FrameReader::Frame& frame = **f;
          if (frame.type == worker::kStatusFrame) {
            final_status = worker::ParseStatus(frame.payload);
            continue;
          }
          v1::ValidateEvent e;
          if (!e.ParseFromString(frame.payload)) {
            stopped_for = Internal("validation worker: unreadable event");
          } else if (!emit(e)) {
            stopped_for = Cancelled("validation cancelled by the caller");
          }
        }
      }
    }
    if (stopped_for.ok()) stopped_for = stop();
    if (!stopped_for.ok()) break;
  }
  if (to_child >= 0) close(to_child);
  close(out[0]);
  int wstatus = 0;
  if (!stopped_for.ok()) {
    Stop(pid, options_.kill_grace);
    return stopped_for;
  }
  while (waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {
  }
  if (final_status) return *final_status;
  return Internal("the validation worker died before it finished (" + DescribeExit(wstatus) +
                  "); the server is unaffected and the device memory was returned");
}

}  // namespace memest
