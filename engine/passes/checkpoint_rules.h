// Whether a block-wise checkpoint policy fits the model it is asked of.
//
// PlanCheckpoints (engine/passes/checkpoint.h) runs CheckBlockPolicy before it makes regions, so
// that a policy the model cannot honour is refused instead of planned as something else.
#ifndef MEMEST_ENGINE_PASSES_CHECKPOINT_RULES_H_
#define MEMEST_ENGINE_PASSES_CHECKPOINT_RULES_H_

#include "engine/ir/config.h"
#include "engine/ir/graph.h"
#include "engine/ir/status.h"

namespace memest {

// For the every-block, every-k-blocks and sqrt(L) policies: INVALID_ARGUMENT naming
// "config.checkpoint.policy" when the graph has no blocks (an op graph without model.blocks),
// or "config.checkpoint.every_k" when every_k is more than the graph's blocks ("40 is more than
// the model's 12 blocks"). Every other policy is left to PlanCheckpoints.
Status CheckBlockPolicy(const Graph& graph, const CheckpointConfig& config);

}  // namespace memest

#endif  // MEMEST_ENGINE_PASSES_CHECKPOINT_RULES_H_
