// YAML model files: a YAML document becomes the JSON text that the proto's JSON mapping reads,
// so YAML and JSON model files describe the same memest.v1.Model.
#ifndef MEMEST_CLIENT_CLI_YAML_JSON_H_
#define MEMEST_CLIENT_CLI_YAML_JSON_H_

#include <string>

#include "engine/ir/status.h"

namespace memest::cli {

// Converts one YAML document to JSON. Mappings become objects, sequences arrays; a quoted
// scalar stays a string, a plain one becomes a number, true/false or null when it reads as
// one (YAML 1.2 core schema), else a string. Anchors and aliases resolve as YAML defines them.
// Errors (a syntax error, with its line and column, or a mapping key that is not a scalar)
// are INVALID_ARGUMENT.
StatusOr<std::string> YamlToJson(const std::string& yaml);

// True for paths ending in .yaml or .yml (case-insensitive).
bool IsYamlPath(const std::string& path);

}  // namespace memest::cli

#endif  // MEMEST_CLIENT_CLI_YAML_JSON_H_
