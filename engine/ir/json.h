// A JSON value as a request carries one (a Hugging Face config.json): the engine reads it
// without a JSON library; the server fills it from a google.protobuf.Struct, the CLI from a file
// through protobuf's JSON parser.
#ifndef MEMEST_ENGINE_IR_JSON_H_
#define MEMEST_ENGINE_IR_JSON_H_

#include <string>
#include <string_view>
#include <vector>

namespace memest {

struct JsonValue {
  enum class Kind { kNull, kBool, kNumber, kString, kList, kObject };
  Kind kind = Kind::kNull;
  bool boolean = false;
  double number = 0.0;
  std::string text;
  std::vector<JsonValue> items;  // kList: the elements; kObject: the values, keys alongside
  std::vector<std::string> keys;  // kObject: one per item, in the order given

  // The member named `key` of an object, or null when absent or not an object.
  const JsonValue* Find(std::string_view key) const {
    if (kind != Kind::kObject) return nullptr;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (keys[i] == key) return &items[i];
    }
    return nullptr;
  }
};

}  // namespace memest

#endif  // MEMEST_ENGINE_IR_JSON_H_
