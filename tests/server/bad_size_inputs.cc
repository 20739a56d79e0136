// Rows of the bad-input catalogue for sizes and limits: byte counts that cannot be represented
// (one tensor past 2^56 bytes, a step past 2^62), attributes past their bounds, and models that
// would expand past the op limit. Each used to wrap silently, crash or run for minutes (the
// fuzzer's findings, fuzz/regressions/); each is now refused naming the field.
#include <string>
#include <vector>

#include "tests/server/bad_inputs.h"

namespace memest::testing {
namespace {

constexpr grpc::StatusCode kInvalid = grpc::StatusCode::INVALID_ARGUMENT;
constexpr grpc::StatusCode kExhausted = grpc::StatusCode::RESOURCE_EXHAUSTED;

std::string Preset(const std::string& name, const std::string& params, int64_t batch) {
  return "model { preset { name: \"" + name + "\" " + params +
         " } } config { batch_size: " + std::to_string(batch) + " }";
}
std::string Param(const std::string& key, int64_t value) {
  return "params { key: \"" + key + "\" value: " + std::to_string(value) + " } ";
}
std::string Layers(const std::string& kind, const std::string& attrs,
                   const std::string& input = "[3, 32, 32]", int64_t batch = 2) {
  return "model { layers { input_shape: " + input + " layers { kind: \"" + kind + "\" " + attrs +
         " } } } config { batch_size: " + std::to_string(batch) + " }";
}
std::string Attr(const std::string& key, int64_t value) {
  return "attrs { key: \"" + key + "\" value { i: " + std::to_string(value) + " } } ";
}
// An op graph of one op of `kind` on x (batch 2) and the extra declarations `decls`.
std::string OneOp(const std::string& kind, const std::string& inputs, const std::string& attrs,
                  const std::string& decls = "", const std::string& x = "[2, 8]") {
  return "model { ops { tensors { name: \"x\" shape: " + x + " } " + decls + "ops { kind: \"" +
         kind + "\" inputs: " + inputs + " outputs: [\"y\"] " + attrs +
         " } } } config { batch_size: 2 mode: MODE_INFERENCE }";
}

constexpr int64_t kInt64Max = 9223372036854775807;
constexpr int64_t k2To62 = int64_t{1} << 62;

}  // namespace

std::vector<BadInput> BadSizeInputs() {
  return {
      {"NegativeMaxLayerRows",
       Preset("gpt2-small", Param("layers", 2), 2) + " max_layer_rows: -1", kInvalid,
       "max_layer_rows: must be 0 (no rows) or more, got -1"},
      // One tensor past 2^56 bytes, blamed on the field its size came from.
      {"BatchTwoTo62", Preset("gpt2-small", Param("layers", 2), k2To62), kInvalid,
       "config.batch_size: 4611686018427387904 is too large"},
      {"BatchFoldedIntoAnActivation", Preset("gpt2-small", Param("layers", 2), int64_t{1} << 34),
       kInvalid, "config.batch_size: 17179869184 is too large"},
      {"SwishBatchPastTheTensorBound", Layers("swish", "", "[8]", 905556242014986083), kInvalid,
       "config.batch_size"},
      {"TensorOfSixtyFiveDims",
       "model { ops { tensors { name: \"x\" shape: [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, "
       "1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, "
       "1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1] } ops { kind: \"relu\" "
       "inputs: [\"x\"] outputs: [\"y\"] } } } config { batch_size: 1 mode: MODE_INFERENCE }",
       kInvalid, "model.tensors[0].shape: has 65 dims"},
      // A step whose tensors each fit, but whose bytes held at once pass 2^62.
      {"StepPastTwoTo62", Preset("mlp", Param("layers", 1100) + Param("width", 16777216), 16777216),
       kInvalid, "config.batch_size: the bytes reserved at once would pass 2^62 bytes (4 EiB)"},
      // Attributes past their bounds, where their arithmetic would wrap.
      {"ConvPaddingInt64Max",
       Layers("conv2d",
              Attr("out_channels", 8) + Attr("kernel_size", 3) + Attr("padding", kInt64Max)),
       kInvalid, "model.layers[0].attrs.padding: must be at most 2147483647"},
      {"ConvDilationInt64Max",
       Layers("conv2d",
              Attr("out_channels", 8) + Attr("kernel_size", 3) + Attr("dilation", kInt64Max)),
       kInvalid, "model.layers[0].attrs.dilation: must be at most 2147483647"},
      {"PoolPaddingInt64Max",
       Layers("max_pool2d", Attr("kernel_size", 2) + Attr("padding", kInt64Max)), kInvalid,
       "model.layers[0].attrs.padding"},
      {"LinearOutFeaturesTwoTo40", Layers("linear", Attr("out_features", int64_t{1} << 40), "[8]"),
       kInvalid, "model.layers[0].attrs.out_features: must be at most 2147483647"},
      {"OpConvPaddingInt64Max",
       OneOp("conv1d", "[\"x\", \"w\"]",
             "attrs { key: \"padding\" value { i: " + std::to_string(kInt64Max) + " } }",
             "tensors { name: \"w\" shape: [4, 2, 3] role: TENSOR_ROLE_PARAMETER } ", "[2, 2, 8]"),
       kInvalid, "model.ops[0].attrs.padding: must be at most 2147483647"},
      {"SplitSizesPastTwoTo62",
       OneOp("split", "[\"x\"]",
             "attrs { key: \"dim\" value { i: 1 } } attrs { key: \"sizes\" value { ints { "
             "values: [" +
                 std::to_string(kInt64Max) + ", " + std::to_string(kInt64Max) + ", 10] } } }"),
       kInvalid, "model.ops[0].attrs.sizes"},
      {"AttentionScoresPastTheTensorBound",
       "model { ops { tensors { name: \"q\" shape: [1099511627776, 1] batch_dim: -1 } ops { kind: "
       "\"scaled_dot_product_attention\" inputs: [\"q\", \"q\", \"q\"] outputs: [\"y\"] } } } "
       "config { batch_size: 1 mode: MODE_INFERENCE }",
       kInvalid, "model.ops[0]: its attention scores"},
      // Models that would expand past the op limit: refused before they are built.
      {"MlpWithTwoTo24Layers", Preset("mlp", Param("layers", 16777216), 1), kExhausted,
       "model.preset.params.layers: mlp with 16777216 layers expands to 33554434 ops"},
      {"Llama70bWithTwoMillionLayers", Preset("llama-70b", Param("layers", 2097173), 1), kExhausted,
       "model.preset.params.layers: llama-70b with 2097173 layers"},
      {"Gpt2WithSixtyFiveThousandLayers", Preset("gpt2-small", Param("layers", 65536), 1),
       kExhausted, "model.preset.params.layers"},
  };
}

}  // namespace memest::testing
