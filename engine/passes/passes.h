// Graph passes that run between building a model's graph and scheduling its step.
#ifndef MEMEST_ENGINE_PASSES_PASSES_H_
#define MEMEST_ENGINE_PASSES_PASSES_H_

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/ir/config.h"
#include "engine/ir/graph.h"

namespace memest {

// Rebuilds `graph` op by op through a GraphBuilder, re-inferring every output. For each op,
// `emit(i, builder, map)` may add replacement ops and map op i's outputs (map[old] = new) and
// return true, or return false to have op i copied as it is. `map` takes old tensor ids to new
// ones; a tensor left unmapped (-1) must not be read by a later op. Leaves, blocks, the loss,
// the model's checkpoint regions, held tensors (until the last op op i became) and outputs
// carry over; held tensors and outputs left unmapped are dropped. `budget` (null: none) can stop
// the replay at its deadline or cancellation. The new graph is built under `autocast` (by
// default as `graph` was: replaying an autocast graph under autocast adds no casts, its inputs
// are already cast).
using OpEmitter = std::function<bool(int op, GraphBuilder& b, std::vector<int>& map)>;
// Where a replay put the old graph's tensors and ops (-1: dropped): op i became ops
// [first_op[i], last_op[i]] of the new graph.
struct ReplayMap {
  std::vector<int> tensors;
  std::vector<int> first_op;
  std::vector<int> last_op;
};
// `drop_leaves` (null: none), per tensor of `graph`: leaves not copied (a rank's share of the
// parameters that leaves the rest out); no op the replay adds may read them.
StatusOr<Graph> ReplayGraph(const Graph& graph, const OpEmitter& emit,
                            std::optional<DType> autocast = std::nullopt,
                            ReplayMap* replay = nullptr, Budget* budget = nullptr,
                            const std::vector<char>* drop_leaves = nullptr);

// Op `op`'s inputs as `map` takes them to the graph being built.
std::vector<int> MappedInputs(const Op& op, const std::vector<int>& map);

// For an emitter that adds op `op` of `graph` itself: adds it to `b` with `inputs` (tensor ids in
// `b`) and `attrs`, its outputs named as in `graph`, and maps its outputs in `map`; returns them
// (empty on a builder error).
std::vector<int> ReplayOp(const Graph& graph, const Op& op, std::vector<int> inputs, Attrs attrs,
                          GraphBuilder& b, std::vector<int>& map);

// Rewrites `graph` as torch.autocast(device_type="cuda", dtype=half) runs it: the inputs of
// ops on CUDA autocast's lower-precision list (linear, addmm, matmul, bmm, einsum, conv,
// scaled_dot_product_attention) are cast to `half`; the inputs of ops on its float32 list
// (layer_norm, group_norm, mse_loss, exp, log1p, rsqrt, pow) are cast to float32; softmax and
// log_softmax compute in float32 (float16 inputs directly, half_to_float; bfloat16 inputs
// through a transient float32 copy); cross_entropy keeps half log-probabilities and nll_loss a
// float32 copy of them (attrs.nll_float32); linear_4bit, whose F.linear autocast reaches inside
// bitsandbytes' MatMul4Bit, is told the dtype (attrs.autocast) and casts there. Each other cast
// is an explicit `to` op. A parameter is cast once per forward: the cast carries
// attrs.autocast_weight and autocast's cache holds it until the autocast region (forward and
// loss) ends.
// Graphs built with GraphBuilder::EnableAutocast(half) already are; this replays others.
StatusOr<Graph> ApplyAutocast(const Graph& graph, DType half);

// The casts autocast makes before an op of `kind` runs on `inputs` (tensor ids in `b`): adds
// `to` ops to `b`, replaces `inputs` with the casts and may set attrs (softmax's
// half_to_float, linear_4bit's autocast). Called by GraphBuilder::Add under EnableAutocast.
void AutocastInputs(GraphBuilder& b, std::string_view kind, std::vector<int>& inputs, Attrs& attrs);

}  // namespace memest

#endif  // MEMEST_ENGINE_PASSES_PASSES_H_
