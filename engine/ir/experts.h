// How a mixture-of-experts router spreads a micro-batch's tokens over its experts
// (config.expert_load, ExpertLoad in engine/ir/config.h): the model builders and the
// expert-parallel pass share it.
#ifndef MEMEST_ENGINE_IR_EXPERTS_H_
#define MEMEST_ENGINE_IR_EXPERTS_H_

#include <cstdint>
#include <vector>

#include "engine/ir/config.h"

namespace memest {

// The tokens each of `experts` experts computes on when `tokens` tokens each choose `top_k`
// of them, as `load` spreads them; all zero when tokens * top_k overflows.
std::vector<int64_t> ExpertTokens(int64_t tokens, int64_t experts, int64_t top_k, ExpertLoad load);

}  // namespace memest

#endif  // MEMEST_ENGINE_IR_EXPERTS_H_
