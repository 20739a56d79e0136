// The flags of a LoRA fine-tune (`--lora-rank 16 --lora-targets q_proj,v_proj`, or PEFT's own
// adapter_config.json with `--lora-config`): config.lora.
#ifndef MEMEST_CLIENT_CLI_LORA_FLAGS_H_
#define MEMEST_CLIENT_CLI_LORA_FLAGS_H_

#include <CLI/CLI.hpp>
#include <google/protobuf/struct.pb.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/ir/status.h"
#include "memest/v1/memest.pb.h"

namespace memest::cli {

struct LoraFlags {
  std::string config;  // PEFT's adapter_config.json, or the adapter's directory
  std::optional<int64_t> rank;
  std::optional<double> alpha;
  std::optional<double> dropout;
  std::vector<std::string> targets;          // comma-separated or repeated
  std::vector<std::string> modules_to_save;  // comma-separated or repeated
  bool keep_adapter_dtype = false;
  bool use_dora = false;
  // QLoRA's base: transformers' BitsAndBytesConfig(load_in_4bit=True, ...), or load_in_8bit.
  std::string quantize;  // bnb-nf4 | bnb-fp4 | bnb-int8
  bool double_quant = false;
  std::string compute_dtype;
  std::vector<std::string> skip_modules;  // comma-separated or repeated
  bool no_kbit_preparation = false;
  std::optional<double> int8_threshold;
  std::optional<int64_t> int8_outlier_columns;
  // A quantized checkpoint served by vLLM (--quantize w8a8-fp8 | fp8 | w8a8-int8 | w4a16 |
  // w8a16, with --serve).
  std::string weight_scales;  // channel | tensor | block
  std::string block;          // NxK
  std::string inputs;         // token | tensor | static
  bool asymmetric_inputs = false;
  std::optional<int64_t> group_size;
  bool zero_point = false;
  bool act_order = false;
  bool gptq = false;
};

void AddLoraFlags(CLI::App* app, LoraFlags* flags);

// Sets config.lora from --lora-config's file and then the flags given (which override the
// file's fields), and config.quantization from --quantize and its flags; none: left unset. Errors name the flag, or the file's field
// ("--lora-config F: target_modules: ...").
Status ApplyLoraFlags(const LoraFlags& flags, v1::RunConfig* config);

// PEFT's adapter_config.json (a LoraConfig's to_dict()) as config.lora. Refused, naming the
// field: another peft_type, use_dora, a bias other than "none", rank_pattern,
// layers_to_transform, and a target_modules string other than "all-linear" (PEFT's regular
// expression: list the names instead). `context` prefixes the errors.
Status LoraFromAdapterConfig(const google::protobuf::Struct& adapter, const std::string& context,
                             v1::Lora* lora);

}  // namespace memest::cli

#endif  // MEMEST_CLIENT_CLI_LORA_FLAGS_H_
