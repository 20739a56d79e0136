// Advice: what would make the step fit, each fix measured by re-running the estimate.
#ifndef MEMEST_ENGINE_REPORT_ADVICE_H_
#define MEMEST_ENGINE_REPORT_ADVICE_H_

#include <vector>

#include "engine/ir/budget.h"
#include "engine/ir/config.h"
#include "engine/ir/graph.h"
#include "engine/models/model.h"
#include "engine/report/report.h"

namespace memest {

// Advice for `report` (the estimate of `model` under `config`, whose graph is `graph`), biggest
// saving first. The first entry names the biggest contributor at the peak; the others are fixes,
// each with the peak it saves, found by re-estimating the model with the fix applied:
//   broadcast_reduce   a broadcast multiply reduced by sum/mean, written as one einsum
//   fused_activation   x * sigmoid(x) written as silu(x)
//   attention_scaling  the score matrix scaled by a scalar, moved onto queries and keys
//   use_cache          the model called with use_cache=False: the loop's outputs hold no keys
//                      and values
//   checkpoint         torch.utils.checkpoint every block, or every sqrt(L) blocks
//   micro_batch        half the micro-batch with twice the gradient accumulation
//   optimizer          a for-loop or fused optimizer instead of foreach
//   precision          bf16 autocast instead of fp32
// and, when a device is given, `max_batch`: the largest micro-batch that fits it (saving 0).
//
// Every re-estimate charges `budget`. Once the budget's op steps are spent the advice measured so
// far is returned (budget->spent_out() tells the caller); a deadline or a cancellation is
// returned as the error.
StatusOr<std::vector<Advice>> MakeAdvice(const ModelSpec& model, const Graph& graph,
                                         const RunConfig& config, const Report& report,
                                         Budget* budget);

}  // namespace memest

#endif  // MEMEST_ENGINE_REPORT_ADVICE_H_
