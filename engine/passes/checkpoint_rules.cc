#include "engine/passes/checkpoint_rules.h"

#include <cstdint>
#include <string>

namespace memest {

Status CheckBlockPolicy(const Graph& graph, const CheckpointConfig& config) {
  const bool block_wise = config.policy == CheckpointPolicy::kEveryBlock ||
                          config.policy == CheckpointPolicy::kEveryKBlocks ||
                          config.policy == CheckpointPolicy::kSqrtBlocks;
  if (!block_wise) return Status::Ok();
  const int64_t blocks = static_cast<int64_t>(graph.blocks.size());
  if (blocks == 0) {
    return InvalidArgument(std::string("config.checkpoint.policy: ") +
                           CheckpointPolicyName(config.policy) +
                           " needs the model's repeated blocks, and it has none (an op graph "
                           "names them in model.blocks); name scopes instead");
  }
  if (config.policy == CheckpointPolicy::kEveryKBlocks && config.every_k > blocks) {
    return InvalidArgument("config.checkpoint.every_k: " + std::to_string(config.every_k) +
                           " is more than the model's " + std::to_string(blocks) + " blocks");
  }
  return Status::Ok();
}

}  // namespace memest
