// Settings a request makes explicitly that do not apply to what it asks for.
//
// The engine's RunConfig holds values, not whether the user set them: an inference RunConfig
// carries AdamW and no checkpointing whether or not the request named them. The request does
// know: a proto3 enum or double that is not zero, a repeated field that is not empty, a bool
// that is true, an `optional` field that is present. RunConfigFromProto (server/convert.h)
// runs this check on the request so that such a setting is refused instead of silently
// ignored. A sub-message that is present but empty is not a setting: clients build requests
// that way (Python's `config.checkpoint.non_reentrant = False` marks `checkpoint` present).
// Rules the engine can decide from values alone are the engine's (ValidateSettingsApply in
// engine/ir/config.h).
#ifndef MEMEST_SERVER_EXPLICIT_SETTINGS_H_
#define MEMEST_SERVER_EXPLICIT_SETTINGS_H_

#include "engine/ir/status.h"
#include "memest/v1/memest.pb.h"

namespace memest {

// INVALID_ARGUMENT naming the field for:
//   - in MODE_INFERENCE, any of config.optimizer.{kind, impl, weight_decay},
//     config.checkpoint.{policy (other than NONE), every_k, scopes, non_reentrant} or
//     config.hold_outputs (true or false);
//   - config.checkpoint.every_k with a policy other than CHECKPOINT_POLICY_EVERY_K_BLOCKS;
//   - config.device_name set (the oneof holds it) to an empty string.
// Enum values the proto does not define are not checked here (the enum conversions are).
Status CheckExplicitSettings(const v1::RunConfig& config);

}  // namespace memest

#endif  // MEMEST_SERVER_EXPLICIT_SETTINGS_H_
