#include "client/cli/yaml_json.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <regex>

#include "engine/ir/text.h"

namespace memest::cli {
namespace {

// YAML 1.2 core schema forms of plain scalars.
const std::regex kInt(R"([-+]?(0|[1-9][0-9]*))");
const std::regex kFloat(R"([-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?)");

nlohmann::json Scalar(const YAML::Node& node) {
  const std::string& text = node.Scalar();
  if (node.Tag() == "!") return text;  // quoted: always a string
  if (text == "true" || text == "True" || text == "TRUE") return true;
  if (text == "false" || text == "False" || text == "FALSE") return false;
  if (text.empty() || text == "~" || text == "null" || text == "Null" || text == "NULL") {
    return nullptr;
  }
  if (std::regex_match(text, kInt)) {
    errno = 0;
    const long long v = std::strtoll(text.c_str(), nullptr, 10);
    if (errno == 0) return v;
    return text;  // beyond 64 bits: let the proto parser say which field
  }
  if (std::regex_match(text, kFloat)) return std::strtod(text.c_str(), nullptr);
  return text;
}

StatusOr<nlohmann::json> Convert(const YAML::Node& node, const std::string& where) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      return nlohmann::json(nullptr);
    case YAML::NodeType::Scalar:
      return Scalar(node);
    case YAML::NodeType::Sequence: {
      nlohmann::json out = nlohmann::json::array();
      for (size_t i = 0; i < node.size(); ++i) {
        MEMEST_ASSIGN_OR_RETURN(nlohmann::json v, Convert(node[i], where + "[" + std::to_string(i) + "]"));
        out.push_back(std::move(v));
      }
      return out;
    }
    case YAML::NodeType::Map: {
      nlohmann::json out = nlohmann::json::object();
      for (const auto& kv : node) {
        if (!kv.first.IsScalar()) {
          return InvalidArgument(where + ": a mapping key must be a plain name (line " +
                                 std::to_string(kv.first.Mark().line + 1) + ")");
        }
        const std::string key = kv.first.Scalar();
        MEMEST_ASSIGN_OR_RETURN(nlohmann::json v, Convert(kv.second, where + "." + Escape(key)));
        out[key] = std::move(v);
      }
      return out;
    }
  }
  return nlohmann::json(nullptr);
}

}  // namespace

StatusOr<std::string> YamlToJson(const std::string& yaml) {
  YAML::Node root;
  try {  // yaml-cpp reports errors by exception; they stop here
    root = YAML::Load(yaml);
  } catch (const YAML::Exception& e) {
    return InvalidArgument("YAML syntax error at line " + std::to_string(e.mark.line + 1) +
                           ", column " + std::to_string(e.mark.column + 1) + ": " + e.msg);
  }
  MEMEST_ASSIGN_OR_RETURN(nlohmann::json json, Convert(root, "model"));
  return json.dump();
}

bool IsYamlPath(const std::string& path) {
  std::string lower = path;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  auto ends = [&](const std::string& suffix) {
    return lower.size() >= suffix.size() &&
           lower.compare(lower.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  return ends(".yaml") || ends(".yml");
}

}  // namespace memest::cli
