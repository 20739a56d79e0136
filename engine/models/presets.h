// Presets: well-known models, built as graphs from a few parameters.
#ifndef MEMEST_ENGINE_MODELS_PRESETS_H_
#define MEMEST_ENGINE_MODELS_PRESETS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "engine/ir/graph.h"
#include "engine/models/model.h"

namespace memest {

struct PresetParam {
  std::string name;         // "seq"
  int64_t default_value;    // 1024
  std::string description;  // "sequence length in tokens"
};

struct PresetInfo {
  std::string name;         // "gpt2-small"
  std::string family;       // "gpt2"
  std::string description;  // "GPT-2 small: 12 layers, d_model 768, 12 heads, 124M parameters"
  std::vector<PresetParam> params;
};

// Every preset, in a stable order.
const std::vector<PresetInfo>& ListPresets();

// Builds the preset's graph for one micro-batch. Errors: NOT_FOUND for an unknown name (the
// message lists the known ones), INVALID_ARGUMENT naming "model.preset.params.<name>" for an
// unknown or out-of-range parameter.
StatusOr<Graph> BuildPreset(const PresetSpec& spec, const BuildContext& context);

}  // namespace memest

#endif  // MEMEST_ENGINE_MODELS_PRESETS_H_
