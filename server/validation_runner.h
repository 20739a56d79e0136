// Runs Validate requests one at a time, each in a child memest-validate-worker process.
//
// The queue is first come, first served; a request waiting hears its position whenever it
// changes. A running validation is the child's: a CUDA fault or an abort kills the child, not the
// server, and the device memory is returned when it exits. Cancellation and the deadline are
// checked while waiting and while running; a running child is stopped (SIGTERM, then SIGKILL
// after a grace period).
#ifndef MEMEST_SERVER_VALIDATION_RUNNER_H_
#define MEMEST_SERVER_VALIDATION_RUNNER_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "engine/ir/status.h"
#include "memest/v1/memest.pb.h"

namespace memest {

struct ValidationOptions {
  // The CUDA device to validate on; -1: this server does not validate.
  int device = -1;
  // The worker binary; empty: memest-validate-worker next to the running executable.
  std::string worker_path;
  // Extra worker arguments (the tests' --fake-device-gib ...).
  std::vector<std::string> worker_args;
  // Validations waiting beyond this many are refused with RESOURCE_EXHAUSTED.
  int max_queued = 8;
  // How long a stopped child gets between SIGTERM and SIGKILL.
  std::chrono::milliseconds kill_grace{2000};
  // The longest a validation may take, waiting included, when the caller set no shorter
  // deadline: every validation has one.
  std::chrono::seconds max_duration{30 * 60};
};

class ValidationRunner {
 public:
  using Clock = std::chrono::system_clock;
  explicit ValidationRunner(ValidationOptions options);

  // Asks the worker whether the device can validate (--probe); the answer is kept, and
  // Validate answers UNAVAILABLE with its message until a later Probe succeeds. Returns it.
  Status Probe();
  // OK, or why Validate is UNAVAILABLE here.
  Status Available() const;

  // Waits its turn, runs the worker on `request` and passes each event to `emit` (from the
  // calling thread; false from emit stops the validation). `stopped` is polled (a cancelled
  // RPC); `deadline` (or max_duration from now, if sooner) bounds the whole call.
  Status Validate(const v1::ValidateRequest& request,
                  const std::function<bool(const v1::ValidateEvent&)>& emit,
                  const std::function<bool()>& stopped, Clock::time_point deadline);

  // Validations running or waiting now.
  int in_queue() const;

 private:
  // Runs the worker with `args`, feeding it `input`; events go to emit. `stop` says why to
  // stop it early (OK: keep going).
  Status RunWorker(const std::vector<std::string>& args, const std::string& input,
                   const std::function<bool(const v1::ValidateEvent&)>& emit,
                   const std::function<Status()>& stop);
  std::vector<std::string> WorkerArgs() const;

  const ValidationOptions options_;
  std::string worker_;
  mutable std::mutex mu_;
  std::condition_variable turn_;
  std::deque<uint64_t> queue_;  // tickets; the front one runs
  uint64_t next_ticket_ = 0;
  Status available_;
};

}  // namespace memest

#endif  // MEMEST_SERVER_VALIDATION_RUNNER_H_
