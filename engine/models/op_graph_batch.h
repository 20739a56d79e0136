// The batch of an op graph: where the run's micro-batch meets the batch the graph was written at.
//
// A graph with traced_batch is rescaled to the run's micro-batch: inputs and targets along their
// batch_dim, and the shape attributes that name the batch (view and reshape with -1, expand
// keeping an input's dim with -1; expand and full with attrs.batch_dim, the dim of their `shape`
// that is the batch: a size-1 dim expanded to the batch, a tensor the forward makes at the
// batch's size). A graph without traced_batch is used at the batch it was written at: a run at
// another micro-batch is refused, never silently estimated at the graph's own batch.
#ifndef MEMEST_ENGINE_MODELS_OP_GRAPH_BATCH_H_
#define MEMEST_ENGINE_MODELS_OP_GRAPH_BATCH_H_

#include <cstdint>
#include <string>

#include "engine/ir/graph.h"
#include "engine/ir/status.h"
#include "engine/models/model.h"

namespace memest {

// OK when the graph has traced_batch, or when every input with a batch dim (every target when
// no input has one) has the run's micro-batch there; otherwise INVALID_ARGUMENT naming
// config.batch_size and the input.
Status CheckUnscaledBatch(const OpGraphSpec& spec, int64_t micro_batch);

// The attributes op `op` (at `field`, "model.ops[3]") is built with: its own, with
// shape[batch_dim] set to the micro-batch when `rescale` (expand, full). Refuses batch_dim on
// other kinds, outside `shape`, or (with traced_batch) where the shape is not the traced batch.
StatusOr<Attrs> BatchScaledAttrs(const OpSpec& op, const std::string& field, int64_t traced_batch,
                                 int64_t micro_batch, bool rescale);

}  // namespace memest

#endif  // MEMEST_ENGINE_MODELS_OP_GRAPH_BATCH_H_
