// Liveness: walks a schedule through the allocator model and finds the peaks.
#ifndef MEMEST_ENGINE_STEP_LIVENESS_H_
#define MEMEST_ENGINE_STEP_LIVENESS_H_

#include <vector>

#include "engine/ir/budget.h"
#include "engine/report/report.h"
#include "engine/step/schedule.h"

namespace memest {

struct Liveness {
  PeakPoint peak;                   // the moment of the largest allocated total
  int64_t reserved_at_peak = 0;     // reserved at that same moment
  int64_t peak_reserved = 0;        // the largest reserved total of the step
  std::vector<PeakPoint> phases;    // per phase that ran, in step order
  CategoryBytes at_end{};           // what is still allocated when the step ends
};

// How allocations are counted: through the CUDA caching allocator model (rounded, with
// reserved segments), or exactly (each tensor's own bytes; reserved = allocated), as on the CPU.
enum class Accounting { kCachingAllocator, kExact };

// Replays `schedule` through CachingAllocatorModel (or exactly). Peak points name the op (kind
// and scope) of `graph` that was running. Refuses (INVALID_ARGUMENT, naming the op) a step
// that would hold more than kMaxBytes at once; every total it reports is then within kMaxBytes.
// Looks at `budget`'s deadline and cancellation every 256 ops walked (null: none).
StatusOr<Liveness> WalkSchedule(const Schedule& schedule, const Graph& graph,
                                bool expandable_segments,
                                Accounting accounting = Accounting::kCachingAllocator,
                                Budget* budget = nullptr);

}  // namespace memest

#endif  // MEMEST_ENGINE_STEP_LIVENESS_H_
