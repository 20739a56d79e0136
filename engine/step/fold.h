// A folded pipeline schedule's check (engine/passes/pipeline.h, PipelineFold): the step
// simulator runs a stage's schedule short, and this says whether the simulated events let the
// real step be read from them (engine/step/schedule.h, RepeatedSpan).
#ifndef MEMEST_ENGINE_STEP_FOLD_H_
#define MEMEST_ENGINE_STEP_FOLD_H_

#include <optional>
#include <vector>

#include "engine/passes/pipeline.h"
#include "engine/step/schedule.h"

namespace memest {

// The repeated period of `schedule`, simulated from `fold.actions`, whose action k's events
// start at action_event[k] and its buffers at action_id[k] (one entry more: the end). Given
// when the period [fold.end - fold.period, fold.end) is the one before it moved on: the same
// events in the same order, with the same bytes and categories, each buffer it makes `ids` on
// from the one the period before made, each buffer it frees or retags either that (a buffer of
// the zone, from action fold.zone on) or the very same one (older); its contexts the same op and
// phase, fold.stride micro-batches on. None otherwise: the stage is then simulated in full.
std::optional<RepeatedSpan> FindRepeatedSpan(const Schedule& schedule,
                                             const std::vector<int>& action_event,
                                             const std::vector<int>& action_id,
                                             const PipelineFold& fold);

}  // namespace memest

#endif  // MEMEST_ENGINE_STEP_FOLD_H_
