// The planner's search space and its order (engine/plan/planner.h): the GPU counts and
// divisors it walks, the model states' lower bound that prunes a split unestimated, and the
// order plans are listed in.
#ifndef MEMEST_ENGINE_PLAN_PLAN_SPACE_H_
#define MEMEST_ENGINE_PLAN_PLAN_SPACE_H_

#include <cstdint>
#include <vector>

#include "engine/ir/config.h"
#include "engine/plan/planner.h"

namespace memest {

// n's divisors, ascending.
std::vector<int64_t> Divisors(int64_t n);

// The GPU counts tried: powers of two up to the budget, and the budget itself.
std::vector<int64_t> GpuCounts(int64_t max_gpus);

// The model states of one GPU's step: parameters, gradients, optimizer state.
struct States {
  int64_t params = 0, grads = 0, state = 0;
  int64_t total() const { return params + grads + state; }  // each below 2^62 / 4
};

// What any rank of a split keeps at least (plan_space.cc says how it is bounded).
int64_t LowerBound(const States& s, DataSharding sharding, int64_t data, int64_t tensor,
                   int64_t pipeline, int64_t expert, bool half);

// Plan order: the smaller GPU, no recomputation first, the smaller bubble, fewer tensor and
// expert ranks, the larger micro-batch, the most headroom.
bool Before(const Plan& a, const Plan& b);

}  // namespace memest

#endif  // MEMEST_ENGINE_PLAN_PLAN_SPACE_H_
