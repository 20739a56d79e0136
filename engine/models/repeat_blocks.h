// The loop over a model's repeated blocks (a decoder's layers, an encoder's), which stamps
// blocks alike rather than building each (GraphBuilder::StampBlock).
#ifndef MEMEST_ENGINE_MODELS_REPEAT_BLOCKS_H_
#define MEMEST_ENGINE_MODELS_REPEAT_BLOCKS_H_

#include <cstdint>
#include <functional>
#include <string>

#include "engine/ir/graph.h"

namespace memest {

// `layers` repeated blocks under "<prefix><i>", each marked a block (a checkpoint unit):
// block(i, x) builds block i on the hidden state x. Returns the last block's output.
//
// With `variant`, the caller promises that what block(i, x) adds depends only on variant(i), on
// x's shape, dtype and strides and on tensors made before the loop, and that it changes nothing
// but the graph builder. A block is then stamped (GraphBuilder::StampBlock) from the last block
// of its variant, once two of that variant were built (the first may make what the later ones
// share, such as autocast's casts of a weight made before the loop), instead of built again;
// the graph is the same. Without it every block is built.
int RepeatBlocks(GraphBuilder& b, const std::string& prefix, int64_t layers, int h,
                 const std::function<int(int64_t, int)>& block,
                 const std::function<int64_t(int64_t)>& variant = nullptr);

// The variant of blocks that are all alike.
inline int64_t AllAlike(int64_t) { return 0; }

}  // namespace memest

#endif  // MEMEST_ENGINE_MODELS_REPEAT_BLOCKS_H_
