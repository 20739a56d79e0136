// Budget: what one request may spend, checked while the engine works on it.
//
// An estimate, and every re-estimate its advice makes, charge one shared Budget for each op step
// they simulate (one op run once: its forward, its recomputation or its backward). The budget
// refuses further work once its op steps are spent (RESOURCE_EXHAUSTED), its deadline has passed
// (DEADLINE_EXCEEDED) or its caller has gone (CANCELLED). The clock and the cancellation are
// consulted every kCheckEvery op steps, a few microseconds of work, so a request stops promptly
// and the check costs nothing measurable on the estimate's hot path.
//
// Once refused, a budget stays refused with the same status. One request's thread uses it; it is
// not shared between threads.
#ifndef MEMEST_ENGINE_IR_BUDGET_H_
#define MEMEST_ENGINE_IR_BUDGET_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>

#include "engine/ir/status.h"

namespace memest {

class Budget {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr int64_t kCheckEvery = 256;

  Budget() = default;  // unlimited: no bound on op steps, no deadline, nothing to cancel

  // At most `op_steps` op steps (> 0).
  Budget& set_max_op_steps(int64_t op_steps) {
    max_op_steps_ = op_steps;
    return *this;
  }
  Budget& set_deadline(Clock::time_point deadline) {
    deadline_ = deadline;
    return *this;
  }
  // `cancelled` returns true once the caller no longer wants the answer (it is called from the
  // request's thread, every kCheckEvery op steps).
  Budget& set_cancelled(std::function<bool()> cancelled) {
    cancelled_ = std::move(cancelled);
    return *this;
  }

  // Charges `op_steps`; returns the refusal once the budget is spent, the deadline passed or the
  // caller cancelled, and OK otherwise.
  Status Charge(int64_t op_steps) {
    spent_ += op_steps;
    if (spent_ < next_check_ && spent_ <= max_op_steps_ && status_.ok()) return Status::Ok();
    return Check();
  }
  // Looks at the op steps, the clock and the cancellation now.
  Status Check();

  // True when `op_steps` more would stay within the bound on op steps.
  bool Affords(int64_t op_steps) const {
    return op_steps <= max_op_steps_ - spent_;
  }
  // True once the budget refused because its op steps were spent.
  bool spent_out() const { return status_.code() == StatusCode::kResourceExhausted; }
  const Status& status() const { return status_; }
  int64_t spent() const { return spent_; }
  int64_t max_op_steps() const { return max_op_steps_; }

 private:
  int64_t max_op_steps_ = std::numeric_limits<int64_t>::max() / 2;
  Clock::time_point deadline_ = Clock::time_point::max();
  std::function<bool()> cancelled_;
  int64_t spent_ = 0;
  int64_t next_check_ = kCheckEvery;
  Status status_;
};

}  // namespace memest

#endif  // MEMEST_ENGINE_IR_BUDGET_H_
