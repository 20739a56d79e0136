#include "server/explicit_settings.h"

#include <string>

namespace memest {
namespace {

Status TrainingOnly(const std::string& field, const char* why) {
  return InvalidArgument(field + ": applies to training only; " + why);
}

Status CheckInference(const v1::RunConfig& config) {
  constexpr char kNoOptimizer[] = "inference runs no optimizer step";
  const v1::Optimizer& optimizer = config.optimizer();
  if (optimizer.kind() != v1::OPTIMIZER_KIND_UNSPECIFIED) {
    return TrainingOnly("config.optimizer.kind", kNoOptimizer);
  }
  if (optimizer.impl() != v1::OPTIMIZER_IMPL_UNSPECIFIED) {
    return TrainingOnly("config.optimizer.impl", kNoOptimizer);
  }
  if (optimizer.weight_decay() != 0.0) {
    return TrainingOnly("config.optimizer.weight_decay", kNoOptimizer);
  }
  constexpr char kNoBackward[] =
      "inference keeps nothing for a backward pass, so nothing is recomputed";
  const v1::Checkpoint& checkpoint = config.checkpoint();
  if (checkpoint.policy() != v1::CHECKPOINT_POLICY_UNSPECIFIED &&
      checkpoint.policy() != v1::CHECKPOINT_POLICY_NONE) {
    return TrainingOnly("config.checkpoint.policy", kNoBackward);
  }
  if (checkpoint.has_every_k()) return TrainingOnly("config.checkpoint.every_k", kNoBackward);
  if (checkpoint.scopes_size() > 0) return TrainingOnly("config.checkpoint.scopes", kNoBackward);
  if (checkpoint.non_reentrant()) {
    return TrainingOnly("config.checkpoint.non_reentrant", kNoBackward);
  }
  if (config.has_hold_outputs()) {
    return TrainingOnly("config.hold_outputs",
                        "it says whether a training loop keeps the model's outputs through "
                        "backward; in inference the caller holds them anyway");
  }
  return Status::Ok();
}

}  // namespace

Status CheckExplicitSettings(const v1::RunConfig& config) {
  if (config.mode() == v1::MODE_INFERENCE) MEMEST_RETURN_IF_ERROR(CheckInference(config));
  const v1::Checkpoint& checkpoint = config.checkpoint();
  if (checkpoint.has_every_k() && checkpoint.policy() != v1::CHECKPOINT_POLICY_EVERY_K_BLOCKS) {
    const bool none = checkpoint.policy() == v1::CHECKPOINT_POLICY_UNSPECIFIED ||
                      checkpoint.policy() == v1::CHECKPOINT_POLICY_NONE;
    return InvalidArgument(
        "config.checkpoint.every_k: applies to CHECKPOINT_POLICY_EVERY_K_BLOCKS only, and " +
        (none ? std::string("no policy is set")
              : "the policy is " + v1::CheckpointPolicy_Name(checkpoint.policy())));
  }
  if (config.device_case() == v1::RunConfig::kDeviceName && config.device_name().empty()) {
    return InvalidArgument(
        "config.device_name: must name a device from the catalog; leave the "
        "device unset for no device");
  }
  return Status::Ok();
}

}  // namespace memest
