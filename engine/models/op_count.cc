#include "engine/models/op_count.h"

#include <limits>

namespace memest {

Status CheckLayeredOpCount(int64_t layers, const std::string& field, const std::string& what,
                           const BuildContext& context, const LayeredBuild& build) {
  constexpr int64_t kCountOpsAboveLayers = 64;
  if (layers <= kCountOpsAboveLayers) return Status::Ok();
  int64_t ops[2];
  BuildContext counting = context;
  counting.max_ops = std::numeric_limits<int64_t>::max();
  for (int n = 1; n <= 2; ++n) {
    MEMEST_ASSIGN_OR_RETURN(Graph g, build(n, counting));
    ops[n - 1] = static_cast<int64_t>(g.ops.size());
  }
  const int64_t per_layer = ops[1] - ops[0];
  const int64_t more = layers - 1;
  if (ops[0] > context.max_ops ||
      (per_layer > 0 && more > (context.max_ops - ops[0]) / per_layer)) {
    // Both factors are at most 2^24 (the largest layer count a front end takes) and a block's
    // few hundred ops: no overflow.
    return ResourceExhausted(field + ": " + what + " with " + std::to_string(layers) +
                             " layers expands to " + std::to_string(ops[0] + more * per_layer) +
                             " ops, more than the limit of " + std::to_string(context.max_ops));
  }
  return Status::Ok();
}

}  // namespace memest
