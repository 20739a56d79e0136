// Graph passes that run between building a model's graph and scheduling its step.
#ifndef MEMEST_ENGINE_PASSES_H_
#define MEMEST_ENGINE_PASSES_H_

#include <functional>
#include <vector>

#include "engine/config.h"
#include "engine/graph.h"

namespace memest {

// Rebuilds `graph` op by op through a GraphBuilder, re-inferring every output. For each op,
// `emit(i, builder, map)` may add replacement ops and map op i's outputs (map[old] = new) and
// return true, or return false to have op i copied as it is. `map` takes old tensor ids to new
// ones; a tensor left unmapped (-1) must not be read by a later op. Leaves, blocks and the loss
// carry over.
using OpEmitter = std::function<bool(int op, GraphBuilder& b, std::vector<int>& map)>;
StatusOr<Graph> ReplayGraph(const Graph& graph, const OpEmitter& emit);

// Rewrites `graph` as torch.autocast(device_type="cuda", dtype=half) runs it: the inputs of
// ops on CUDA autocast's lower-precision list (linear, addmm, matmul, bmm, einsum, conv,
// scaled_dot_product_attention) are cast to `half`; the inputs of ops on its float32 list
// (layer_norm, group_norm, mse_loss, exp, log1p, rsqrt, pow) are cast to float32; softmax,
// log_softmax and cross_entropy (which decomposes into log_softmax and nll_loss) compute in
// float32: float16 inputs directly (half_to_float), bfloat16 inputs through a transient float32
// copy. Each cast is an explicit `to` op. A parameter is cast once per
// forward: the cast carries attrs.autocast_weight and autocast's cache holds it until the
// autocast region (forward and loss) ends.
StatusOr<Graph> ApplyAutocast(const Graph& graph, DType half);

}  // namespace memest

#endif  // MEMEST_ENGINE_PASSES_H_
