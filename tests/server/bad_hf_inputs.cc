// Rows of the bad-input catalogue for EstimateRequest.model.hf_config: configs that are not
// objects, miss or mistype a field, name an unknown model type, nest without end, or expand
// past the op limit; each refused naming the field, through the wire's Struct.
#include <string>
#include <vector>

#include "tests/server/bad_inputs.h"

namespace memest::testing {
namespace {

constexpr grpc::StatusCode kInvalid = grpc::StatusCode::INVALID_ARGUMENT;
constexpr grpc::StatusCode kExhausted = grpc::StatusCode::RESOURCE_EXHAUSTED;

// One Struct field in text format: `value` is a google.protobuf.Value's text.
std::string Field(const std::string& key, const std::string& value) {
  return "fields { key: \"" + key + "\" value { " + value + " } } ";
}
std::string Number(const std::string& key, int64_t n) {
  return Field(key, "number_value: " + std::to_string(n));
}

// A small Llama config with `extra` fields appended (a later field of the same key wins in
// text format's map parsing) and `seq` tokens.
std::string Llama(const std::string& extra, int64_t seq = 16) {
  return "model { hf_config { config { " + Field("model_type", "string_value: \"llama\"") +
         Number("hidden_size", 64) + Number("num_hidden_layers", 2) +
         Number("num_attention_heads", 4) + Number("intermediate_size", 128) +
         Number("vocab_size", 512) + extra + " } seq: " + std::to_string(seq) + " } } " + kConfig;
}

// A list nested `depth` deep.
std::string Nested(int depth) {
  std::string value = "null_value: NULL_VALUE";
  for (int i = 0; i < depth; ++i) value = "list_value { values { " + value + " } }";
  return Field("nest", value);
}

}  // namespace

std::vector<BadInput> BadHfConfigInputs() {
  return {
      {"HfConfigUnset", std::string("model { hf_config { seq: 16 } } ") + kConfig, kInvalid,
       "model.hf_config.config: missing"},
      {"HfConfigNoSeq", Llama("", 0), kInvalid, "model.hf_config.seq: required"},
      {"HfConfigUnknownType", Llama(Field("model_type", "string_value: \"falcon9\"")), kInvalid,
       "model.hf_config.config.model_type: 'falcon9' is not supported"},
      {"HfConfigSizeAsBool", Llama(Field("hidden_size", "bool_value: true")), kInvalid,
       "model.hf_config.config.hidden_size: must be a positive integer, got a boolean"},
      {"HfConfigSizeHuge", Llama(Field("vocab_size", "number_value: 1e300")), kInvalid,
       "model.hf_config.config.vocab_size: must be an integer from 1 to 16777216"},
      {"HfConfigSizeNaN", Llama(Field("vocab_size", "number_value: nan")), kInvalid,
       "model.hf_config.config.vocab_size"},
      {"HfConfigNestedTooDeep", Llama(Nested(40)), kInvalid,
       "model.hf_config.config: nested more than 32 levels deep"},
      {"HfConfigDeepModel", Llama(Number("num_hidden_layers", 16'000'000)), kExhausted,
       "model.hf_config.config.num_hidden_layers"},
      {"HfConfigBadDtype", Llama(Field("torch_dtype", "string_value: \"float8\"")), kInvalid,
       "model.hf_config.config.torch_dtype: unknown 'float8'"},
      {"HfConfigBadAttention",
       Llama(Field("_attn_implementation", "string_value: \"flex_attention\"")), kInvalid,
       "model.hf_config.config._attn_implementation: unknown 'flex_attention'"},
      {"HfConfigSeqTooLong", Llama("", int64_t{1} << 40), kInvalid,
       "model.hf_config.seq: must be from 1 to 16777216"},
  };
}

}  // namespace memest::testing
