// Rows of the bad-input catalogue for the 8-bit and torchao weight formats and fp8 training
// (EstimateRequest.config.quantization's bnb-int8 and torchao settings, config.fp8): values out
// of range, settings of another format, and what makes no sense for the mode or the device.
#include <string>
#include <vector>

#include "tests/server/bad_inputs.h"

namespace memest::testing {
namespace {

constexpr grpc::StatusCode kInvalid = grpc::StatusCode::INVALID_ARGUMENT;

const std::string kInt64Max = "9223372036854775807";

// GPT-2 small cut small with more RunConfig fields.
std::string Gpt2(const std::string& config) {
  return std::string(kGpt2) + "config { batch_size: 2 " + config + " }";
}

// The same with an 8-bit base and adapters on c_attn.
std::string Int8(const std::string& quantization) {
  return Gpt2(
      "lora { rank: 8 target_modules: \"c_attn\" } quantization { format: "
      "WEIGHT_FORMAT_BNB_INT8 " +
      quantization + " }");
}

// A layer list of two 16-wide linears (fp8's dims), trained in `precision` (bf16) on `device`
// (an H100).
std::string Fp8Layers(const std::string& fp8, const std::string& config = "",
                      const std::string& precision = "PRECISION_BF16_AMP",
                      const std::string& device = "h100-80gb") {
  return "model { layers { input_shape: [ 16 ] layers { kind: \"linear\" name: \"fc\" attrs { "
         "key: \"out_features\" value { i: 16 } } } layers { kind: \"linear\" name: \"head\" "
         "attrs { key: \"out_features\" value { i: 16 } } } } } config { batch_size: 8 "
         "precision: " +
         precision + " device_name: \"" + device + "\" fp8 { " + fp8 + " } " + config + " }";
}

}  // namespace

std::vector<BadInput> BadPrecisionInputs() {
  return {
      {"Int8ThresholdNegative", Int8("int8_threshold: -1"), kInvalid,
       "config.quantization.int8_threshold"},
      {"Int8ThresholdNan", Int8("int8_threshold: nan"), kInvalid,
       "config.quantization.int8_threshold"},
      {"Int8ThresholdInfinite", Int8("int8_threshold: inf"), kInvalid,
       "config.quantization.int8_threshold"},
      {"Int8OutlierColumnsNegative", Int8("int8_outlier_columns: -1"), kInvalid,
       "config.quantization.int8_outlier_columns"},
      {"Int8OutlierColumnsInt64Max", Int8("int8_outlier_columns: " + kInt64Max), kInvalid,
       "config.quantization.int8_outlier_columns"},
      {"Int8OutlierColumnsWithoutThreshold", Int8("int8_threshold: 0 int8_outlier_columns: 4"),
       kInvalid, "config.quantization.int8_outlier_columns"},
      {"Int8WithDoubleQuant", Int8("double_quant: true"), kInvalid,
       "config.quantization.double_quant"},
      {"Int8SettingOnNf4",
       Gpt2("lora { rank: 8 target_modules: \"c_attn\" } quantization { format: "
            "WEIGHT_FORMAT_BNB_NF4 int8_threshold: 4 }"),
       kInvalid, "config.quantization.int8_threshold"},
      {"TorchaoInTraining",
       Gpt2("precision: PRECISION_BF16_PURE quantization { format: "
            "WEIGHT_FORMAT_TORCHAO_INT8 }"),
       kInvalid, "config.quantization.format"},
      {"TorchaoInt4GroupSize",
       Gpt2("mode: MODE_INFERENCE precision: PRECISION_BF16_PURE quantization { format: "
            "WEIGHT_FORMAT_TORCHAO_INT4 group_size: 100 }"),
       kInvalid, "config.quantization.group_size"},
      {"TorchaoInt4Fp32",
       Gpt2("mode: MODE_INFERENCE quantization { format: WEIGHT_FORMAT_TORCHAO_INT4 }"), kInvalid,
       "config.precision"},
      {"TorchaoInt4OnA100",
       Gpt2("mode: MODE_INFERENCE precision: PRECISION_BF16_PURE device_name: \"a100-80gb\" "
            "quantization { format: WEIGHT_FORMAT_TORCHAO_INT4 }"),
       kInvalid, "config.quantization.format"},
      {"Fp8RecipeUnset", Fp8Layers("amax_history_len: 16"), kInvalid, "config.fp8.recipe"},
      {"Fp8RecipeUndefined", Fp8Layers("recipe: FP8_RECIPE_DELAYED"), kInvalid, "config.fp8.recipe",
       [](v1::EstimateRequest* r) {
         r->mutable_config()->mutable_fp8()->set_recipe(static_cast<v1::Fp8Recipe>(99));
       }},
      {"Fp8HistoryZero", Fp8Layers("recipe: FP8_RECIPE_DELAYED amax_history_len: 0"), kInvalid,
       "config.fp8.amax_history_len"},
      {"Fp8HistoryInt64Max", Fp8Layers("recipe: FP8_RECIPE_DELAYED amax_history_len: " + kInt64Max),
       kInvalid, "config.fp8.amax_history_len"},
      {"Fp8HistoryWithCurrentScaling", Fp8Layers("recipe: FP8_RECIPE_CURRENT amax_history_len: 16"),
       kInvalid, "config.fp8.amax_history_len"},
      {"Fp8InInference", Fp8Layers("recipe: FP8_RECIPE_DELAYED", "mode: MODE_INFERENCE"), kInvalid,
       "config.fp8"},
      {"Fp8Fp32", Fp8Layers("recipe: FP8_RECIPE_DELAYED", "", "PRECISION_FP32"), kInvalid,
       "config.precision"},
      {"Fp8OnA100", Fp8Layers("recipe: FP8_RECIPE_DELAYED", "", "PRECISION_BF16_AMP", "a100-80gb"),
       kInvalid, "config.fp8"},
      {"Fp8OnCpu", Fp8Layers("recipe: FP8_RECIPE_DELAYED", "runtime: RUNTIME_CPU_TORCH_1_13"),
       kInvalid, "config.fp8"},
      {"Fp8LayerNormModel",
       Gpt2("precision: PRECISION_BF16_AMP fp8 { recipe: FP8_RECIPE_DELAYED }"), kInvalid,
       "config.fp8"},
  };
}

}  // namespace memest::testing
