// Hugging Face config.json test data (tests/data/hf_configs) as the engine's JsonValue, for the
// tests of the config front end.
#ifndef MEMEST_TESTS_ENGINE_HF_JSON_H_
#define MEMEST_TESTS_ENGINE_HF_JSON_H_

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <string>

#include "engine/ir/json.h"
#include "engine/models/model.h"

namespace memest {
namespace enginetest {

inline JsonValue FromJson(const nlohmann::json& j) {
  JsonValue v;
  if (j.is_boolean()) {
    v.kind = JsonValue::Kind::kBool;
    v.boolean = j.get<bool>();
  } else if (j.is_number()) {
    v.kind = JsonValue::Kind::kNumber;
    v.number = j.get<double>();
  } else if (j.is_string()) {
    v.kind = JsonValue::Kind::kString;
    v.text = j.get<std::string>();
  } else if (j.is_array()) {
    v.kind = JsonValue::Kind::kList;
    for (const auto& item : j) v.items.push_back(FromJson(item));
  } else if (j.is_object()) {
    v.kind = JsonValue::Kind::kObject;
    for (const auto& [key, item] : j.items()) {
      v.keys.push_back(key);
      v.items.push_back(FromJson(item));
    }
  }
  return v;
}

inline nlohmann::json ReadConfig(const std::string& name) {
  std::ifstream in(std::string(MEMEST_SOURCE_DIR) + "/tests/data/hf_configs/" + name + ".json");
  EXPECT_TRUE(in.good()) << name;
  return nlohmann::json::parse(in);
}

// The test config `name` as a model, built at `seq` tokens (0: a server's lengths).
inline ModelSpec HfModel(const std::string& name, int64_t seq = 0) {
  ModelSpec m;
  m.source = HfConfigSpec{FromJson(ReadConfig(name)), seq};
  return m;
}

// Two layers of four experts, two per token, as the conformance zoo's small Mixtral.
inline nlohmann::json SmallMixtral() {
  return {{"model_type", "mixtral"},    {"hidden_size", 64},        {"num_hidden_layers", 2},
          {"num_attention_heads", 4},   {"num_key_value_heads", 2}, {"intermediate_size", 96},
          {"vocab_size", 512},          {"num_local_experts", 4},   {"num_experts_per_tok", 2}};
}

}  // namespace enginetest
}  // namespace memest

#endif  // MEMEST_TESTS_ENGINE_HF_JSON_H_
