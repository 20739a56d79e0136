#include "engine/step/schedule.h"

#include <string>

#include "engine/step/simulator.h"

namespace memest {

StatusOr<Schedule> BuildSchedule(const Graph& graph, const RunConfig& config,
                                 const CheckpointRegions& regions, const ScheduleOptions& options) {
  // A long pipeline schedule is simulated short when its steady state repeats event for event
  // (engine/step/fold.h); otherwise, and when Validate needs every op's operands, in full.
  if (options.pipeline != nullptr && options.pipeline->fold && !options.record_operands) {
    MEMEST_ASSIGN_OR_RETURN(Schedule folded,
                            StepSimulator(graph, config, regions, options, true).Run());
    if (folded.repeat) return folded;
  }
  return StepSimulator(graph, config, regions, options).Run();
}

Status ByteCountTooLarge(const StepContext* c, const Graph& g, const std::string& what) {
  std::string where = PhaseName(c != nullptr ? c->phase : Phase::kData);
  if (c != nullptr && c->op >= 0) {
    where += ", op " + g.ops[c->op].kind;
    if (!g.ops[c->op].scope.empty()) where += " in " + g.ops[c->op].scope;
  }
  return InvalidArgument("model, config.batch_size: " + what + " would pass 2^62 bytes (4 EiB) (" +
                         where + "); memest does not represent larger byte counts");
}

}  // namespace memest
