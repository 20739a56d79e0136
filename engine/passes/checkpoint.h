// The checkpoint pass: which op ranges run under torch.utils.checkpoint. A region keeps only its
// inputs in forward and is recomputed with grad just before its backward (BuildSchedule,
// engine/step/schedule.h, runs them so).
//
// The regions come from the model's own code (a traced torch.utils.checkpoint: the graph's
// `checkpoints`) or from the config's policy: every block, every k blocks, sqrt(L) blocks, the
// attention core, or named scopes. CheckBlockPolicy (engine/passes/checkpoint_rules.h) refuses
// a block policy the model cannot take before any region is made.
#ifndef MEMEST_ENGINE_PASSES_CHECKPOINT_H_
#define MEMEST_ENGINE_PASSES_CHECKPOINT_H_

#include <utility>
#include <vector>

#include "engine/ir/config.h"
#include "engine/ir/graph.h"
#include "engine/ir/status.h"

namespace memest {

// Op ranges [first, last] that run under torch.utils.checkpoint.
using CheckpointRegions = std::vector<std::pair<int, int>>;

// Regions for the config's checkpoint policy. Errors name "config.checkpoint" when a policy
// finds nothing to checkpoint (a block policy on a model without blocks, unknown scopes).
StatusOr<CheckpointRegions> PlanCheckpoints(const Graph& graph, const CheckpointConfig& config);

}  // namespace memest

#endif  // MEMEST_ENGINE_PASSES_CHECKPOINT_H_
