#include "engine/ir/budget.h"

#include <string>

namespace memest {

Status Budget::Check() {
  if (!status_.ok()) return status_;
  next_check_ = spent_ + kCheckEvery;
  if (spent_ > max_op_steps_) {
    status_ = ResourceExhausted("request: needs more than this server's budget of " +
                                std::to_string(max_op_steps_) +
                                " op steps (ops simulated once each, forward, backward or "
                                "recomputed, advice included); set skip_advice, or ask about a "
                                "smaller model");
  } else if (Clock::now() >= deadline_) {  // first: gRPC also cancels a call past its deadline
    status_ = DeadlineExceeded("request: its deadline passed while memest was working on it");
  } else if (cancelled_ && cancelled_()) {
    status_ = Cancelled("request: cancelled by the caller");
  }
  return status_;
}

}  // namespace memest
