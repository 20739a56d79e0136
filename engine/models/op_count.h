// A deep model refused before it is built: the models the presets and the Hugging Face front end
// build repeat one block `layers` times, so their op count is one + (layers - 1) * (two - one),
// where one and two are the counts of the model built with one and two layers.
#ifndef MEMEST_ENGINE_MODELS_OP_COUNT_H_
#define MEMEST_ENGINE_MODELS_OP_COUNT_H_

#include <cstdint>
#include <functional>
#include <string>

#include "engine/ir/graph.h"
#include "engine/models/model.h"

namespace memest {

// Builds the model with `layers` layers under `context` (whose max_ops is lifted).
using LayeredBuild = std::function<StatusOr<Graph>(int64_t layers, const BuildContext& context)>;

// OK when `layers` is small (at most 64: such a model is simply built, and the builder stops at
// max_ops too) or the model of `layers` layers stays within context.max_ops; otherwise
// RESOURCE_EXHAUSTED naming `field`: "<field>: <what> with N layers expands to M ops, more than
// the limit of L".
Status CheckLayeredOpCount(int64_t layers, const std::string& field, const std::string& what,
                           const BuildContext& context, const LayeredBuild& build);

}  // namespace memest

#endif  // MEMEST_ENGINE_MODELS_OP_COUNT_H_
