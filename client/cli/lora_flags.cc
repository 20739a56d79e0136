#include "client/cli/lora_flags.h"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <utility>

#include "client/cli/flags.h"
#include "client/cli/words.h"
#include "engine/ir/config.h"
#include "engine/ir/text.h"

namespace memest::cli {
namespace {

using google::protobuf::Value;

// A list of names: a JSON list of strings, or one string.
Status AddNames(const Value& v, const std::string& field, bool allow_one,
                google::protobuf::RepeatedPtrField<std::string>* out) {
  if (v.kind_case() == Value::kNullValue) return Status::Ok();
  if (allow_one && v.kind_case() == Value::kStringValue) {
    *out->Add() = v.string_value();
    return Status::Ok();
  }
  if (v.kind_case() != Value::kListValue) {
    return InvalidArgument(field + ": a list of module names");
  }
  for (int i = 0; i < v.list_value().values_size(); ++i) {
    const Value& name = v.list_value().values(i);
    if (name.kind_case() != Value::kStringValue) {
      return InvalidArgument(field + "[" + std::to_string(i) + "]: a module name (a string)");
    }
    *out->Add() = name.string_value();
  }
  return Status::Ok();
}

bool Set(const google::protobuf::Struct& s, const char* key) {
  auto it = s.fields().find(key);
  if (it == s.fields().end()) return false;
  const Value& v = it->second;
  switch (v.kind_case()) {
    case Value::kNullValue: return false;
    case Value::kBoolValue: return v.bool_value();
    case Value::kStringValue: return !v.string_value().empty();
    case Value::kListValue: return v.list_value().values_size() > 0;
    case Value::kStructValue: return v.struct_value().fields_size() > 0;
    default: return true;
  }
}

// The names of a comma-separated, repeatable flag.
std::vector<std::string> SplitCommas(const std::vector<std::string>& given) {
  std::vector<std::string> names;
  for (const std::string& g : given) {
    size_t start = 0;
    for (size_t comma = g.find(','); ; comma = g.find(',', start)) {
      names.push_back(g.substr(start, comma == std::string::npos ? std::string::npos
                                                                   : comma - start));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  }
  return names;
}

}  // namespace

Status LoraFromAdapterConfig(const google::protobuf::Struct& adapter, const std::string& context,
                             v1::Lora* lora) {
  const auto& f = adapter.fields();
  auto it = f.find("peft_type");
  if (it != f.end() && it->second.kind_case() == Value::kStringValue &&
      it->second.string_value() != "LORA") {
    return InvalidArgument(context + "peft_type: " + Quote(it->second.string_value()) +
                           "; memest models LoRA adapters (\"LORA\")");
  }
  for (const char* key : {"rank_pattern", "layers_to_transform", "layer_replication",
                          "lora_bias", "exclude_modules"}) {
    if (Set(adapter, key)) {
      return InvalidArgument(context + key + ": set, and memest models plain LoRA (one rank on "
                             "every target module of every layer)");
    }
  }
  it = f.find("bias");
  if (it != f.end() && it->second.kind_case() == Value::kStringValue &&
      it->second.string_value() != "none") {
    return InvalidArgument(context + "bias: " + Quote(it->second.string_value()) +
                           " trains the base model's biases, which memest does not model "
                           "(\"none\" does not)");
  }
  lora->set_use_dora(Set(adapter, "use_dora"));
  it = f.find("r");
  if (it == f.end() || it->second.kind_case() != Value::kNumberValue) {
    return InvalidArgument(context + "r: the adapters' rank (a number) is required");
  }
  const double r = it->second.number_value();
  if (!(r >= 1 && r <= static_cast<double>(kMaxLoraRank)) || r != std::floor(r)) {
    return InvalidArgument(context + "r: an integer in [1, " + std::to_string(kMaxLoraRank) +
                           "], got " + std::to_string(r));
  }
  lora->set_rank(static_cast<int64_t>(r));
  for (const auto& [key, is_alpha] : {std::pair<const char*, bool>{"lora_alpha", true},
                                      {"lora_dropout", false}}) {
    it = f.find(key);
    if (it == f.end() || it->second.kind_case() == Value::kNullValue) continue;
    if (it->second.kind_case() != Value::kNumberValue) {
      return InvalidArgument(context + key + ": a number");
    }
    if (is_alpha) lora->set_alpha(it->second.number_value());
    else lora->set_dropout(it->second.number_value());
  }
  it = f.find("target_modules");
  if (it != f.end() && it->second.kind_case() == Value::kStringValue) {
    // A string is a regular expression to PEFT, unless it is "all-linear" in any case.
    std::string lower = it->second.string_value();
    for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (lower != kLoraAllLinear) {
      return InvalidArgument(context + "target_modules: " + Quote(it->second.string_value()) +
                             " is a regular expression to PEFT; memest takes a list of names "
                             "or \"all-linear\"");
    }
    *lora->add_target_modules() = kLoraAllLinear;
  } else if (it != f.end()) {
    MEMEST_RETURN_IF_ERROR(AddNames(it->second, context + "target_modules", true,
                                    lora->mutable_target_modules()));
  }
  it = f.find("modules_to_save");
  if (it != f.end()) {
    MEMEST_RETURN_IF_ERROR(AddNames(it->second, context + "modules_to_save", false,
                                    lora->mutable_modules_to_save()));
  }
  return Status::Ok();
}

void AddLoraFlags(CLI::App* app, LoraFlags* f) {
  const char* group = "LoRA (PEFT's get_peft_model)";
  app->add_option("--lora-config", f->config,
                  "PEFT's adapter_config.json (or the adapter's directory): r, lora_alpha, "
                  "lora_dropout, target_modules, modules_to_save; the flags below override it")
      ->group(group)->type_name("FILE|DIR");
  app->add_option("--lora-rank", f->rank, "LoRA adapters of this rank (LoraConfig.r)")
      ->group(group)->type_name("R");
  app->add_option("--lora-alpha", f->alpha, "lora_alpha (default 8; no memory of its own)")
      ->group(group)->type_name("A");
  app->add_option("--lora-dropout", f->dropout,
                  "lora_dropout on the adapters' input (default 0: none, no copy)")
      ->group(group)->type_name("P");
  app->add_option("--lora-targets", f->targets,
                  "target_modules: module names (q_proj,v_proj; a module matches by its whole "
                  "name or its end after a '.'), or all-linear (every Linear but the output "
                  "layer)")
      ->group(group)->type_name("NAMES");
  app->add_option("--lora-modules-to-save", f->modules_to_save,
                  "modules_to_save: modules trained whole, as a copy beside the frozen "
                  "original (lm_head)")
      ->group(group)->type_name("NAMES");
  const char* quant = "4-bit or 8-bit base (bitsandbytes, as transformers loads it)";
  app->add_option("--quantize", f->quantize,
                  "bnb-nf4 or bnb-fp4: every Linear but the output layer a frozen bitsandbytes "
                  "Linear4bit (BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=...)); "
                  "bnb-int8: a Linear8bitLt, LLM.int8 (load_in_8bit=True); torchao-int4, "
                  "torchao-int8: torchao's weight-only quantization (TorchAoConfig; inference, "
                  "--quant-group-size for int4); "
                  "with --serve, a quantized checkpoint as vLLM serves it: w8a8-fp8, fp8 "
                  "(vLLM's --quantization fp8: per-tensor scales), w8a8-int8, w4a16, w8a16 "
                  "(an --hf-config's quantization_config is read without it)")
      ->group(quant);
  app->add_flag("--bnb-double-quant", f->double_quant, "bnb_4bit_use_double_quant")->group(quant);
  app->add_option("--bnb-compute-dtype", f->compute_dtype,
                  "bnb_4bit_compute_dtype: float32 (default), bfloat16, float16")
      ->group(quant);
  app->add_option("--bnb-skip-modules", f->skip_modules,
                  "llm_int8_skip_modules: modules left dense (default: the output layer)")
      ->group(quant)->type_name("NAMES");
  app->add_flag("--no-kbit-preparation", f->no_kbit_preparation,
                "skip PEFT's prepare_model_for_kbit_training, which training runs by default "
                "(it casts the float16/bfloat16 parameters that are not 4-bit to float32)")
      ->group(quant);
  app->add_option("--int8-threshold", f->int8_threshold,
                  "bnb-int8: llm_int8_threshold, the magnitude from which an input value is an "
                  "outlier (default 6.0; 0: no outlier decomposition)")
      ->group(quant);
  app->add_option("--int8-outlier-columns", f->int8_outlier_columns,
                  "bnb-int8: columns of each 8-bit Linear's input holding an outlier (data; "
                  "default 7, the LLM.int8 paper's bound to 13B parameters; a layer's input "
                  "width or more: every column, the worst case)")
      ->group(quant);
  const char* served = "quantized checkpoint served by vLLM (--quantize w8a8-fp8, w8a8-int8, "
                       "w4a16, w8a16; with --serve)";
  app->add_option("--quant-weight-scales", f->weight_scales,
                  "W8A8 weight scales: channel (default), tensor, block")
      ->group(served);
  app->add_option("--quant-block", f->block, "block-wise scales' block, NxK (default 128x128)")
      ->group(served);
  app->add_option("--quant-inputs", f->inputs,
                  "W8A8 input quantization: token (dynamic, default), tensor (dynamic), static")
      ->group(served);
  app->add_flag("--quant-asymmetric-inputs", f->asymmetric_inputs,
                "int8 inputs with zero points (compressed-tensors' symmetric: false)")
      ->group(served);
  app->add_option("--quant-group-size", f->group_size,
                  "W4A16/W8A16: input features per scale (default 128; -1: per channel)")
      ->group(served);
  app->add_flag("--quant-zero-point", f->zero_point, "W4A16/W8A16 zero points (AWQ, GPTQ sym=false)")
      ->group(served);
  app->add_flag("--quant-act-order", f->act_order, "GPTQ's desc_act")->group(served);
  app->add_flag("--quant-gptq", f->gptq, "a GPTQ checkpoint (its qzeros and g_idx stay loaded)")
      ->group(served);
  app->add_flag("--lora-use-dora", f->use_dora,
                "DoRA (LoraConfig(use_dora=True)): a trained magnitude per output feature, the "
                "base linear recomputed from its weight plus the adapters' product")
      ->group(group);
  app->add_flag("--lora-keep-adapter-dtype", f->keep_adapter_dtype,
                "get_peft_model(autocast_adapter_dtype=False): a bf16 or fp16 model's adapters "
                "keep its dtype (PEFT's default makes them float32)")
      ->group(group);
}

namespace {

const Word<v1::WeightFormat> kFormats[] = {
    {"bnb-nf4", v1::WEIGHT_FORMAT_BNB_NF4},   {"bnb-fp4", v1::WEIGHT_FORMAT_BNB_FP4},
    {"bnb-int8", v1::WEIGHT_FORMAT_BNB_INT8}, {"torchao-int4", v1::WEIGHT_FORMAT_TORCHAO_INT4},
    {"torchao-int8", v1::WEIGHT_FORMAT_TORCHAO_INT8},
    {"w8a8-fp8", v1::WEIGHT_FORMAT_W8A8_FP8}, {"fp8", v1::WEIGHT_FORMAT_W8A8_FP8},
    {"w8a8-int8", v1::WEIGHT_FORMAT_W8A8_INT8}, {"w4a16", v1::WEIGHT_FORMAT_W4A16},
    {"w8a16", v1::WEIGHT_FORMAT_W8A16},
};
const Word<v1::ScaleGranularity> kScales[] = {
    {"channel", v1::SCALE_GRANULARITY_CHANNEL},
    {"tensor", v1::SCALE_GRANULARITY_TENSOR},
    {"block", v1::SCALE_GRANULARITY_BLOCK},
};
const Word<v1::InputQuantization> kInputs[] = {
    {"token", v1::INPUT_QUANTIZATION_DYNAMIC_TOKEN},
    {"tensor", v1::INPUT_QUANTIZATION_DYNAMIC_TENSOR},
    {"static", v1::INPUT_QUANTIZATION_STATIC},
};

// The served formats' flags onto `q`. `fp8` is vLLM's --quantization fp8 of a dense checkpoint:
// one scale per weight and per input (Fp8Config's defaults), unless the flags say otherwise.
Status ApplyServedQuantizationFlags(const LoraFlags& f, v1::Quantization* q) {
  if (f.quantize == "fp8") {
    q->set_weight_scales(v1::SCALE_GRANULARITY_TENSOR);
    q->set_inputs(v1::INPUT_QUANTIZATION_DYNAMIC_TENSOR);
  }
  if (!f.weight_scales.empty()) {
    MEMEST_ASSIGN_OR_RETURN(v1::ScaleGranularity s,
                            ParseWord("--quant-weight-scales", f.weight_scales, kScales));
    q->set_weight_scales(s);
  }
  if (!f.inputs.empty()) {
    MEMEST_ASSIGN_OR_RETURN(v1::InputQuantization i, ParseWord("--quant-inputs", f.inputs, kInputs));
    q->set_inputs(i);
  }
  if (!f.block.empty()) {
    char* end = nullptr;
    const long long n = std::strtoll(f.block.c_str(), &end, 10);
    const bool joined = end != nullptr && *end == 'x';
    const long long k = joined ? std::strtoll(end + 1, &end, 10) : 0;
    if (!joined || n <= 0 || k <= 0 || *end != '\0') {
      return InvalidArgument("--quant-block: NxK, two positive integers (128x128), got " +
                             Quote(f.block));
    }
    q->set_block_n(n);
    q->set_block_k(k);
  }
  q->set_asymmetric_inputs(f.asymmetric_inputs);
  if (f.group_size) q->set_group_size(*f.group_size);
  q->set_zero_point(f.zero_point);
  q->set_act_order(f.act_order);
  q->set_gptq_layout(f.gptq);
  return Status::Ok();
}

Status ApplyQuantizationFlags(const LoraFlags& f, v1::RunConfig* config) {
  if (f.quantize.empty()) {
    if (f.double_quant || !f.compute_dtype.empty() || !f.skip_modules.empty() ||
        f.no_kbit_preparation || !f.weight_scales.empty() || !f.block.empty() ||
        !f.inputs.empty() || f.asymmetric_inputs || f.group_size || f.zero_point ||
        f.act_order || f.gptq || f.int8_threshold || f.int8_outlier_columns) {
      return InvalidArgument("--quantize: required with the --bnb-*, --int8-*, --quant-* and "
                             "--no-kbit-preparation flags");
    }
    return Status::Ok();
  }
  v1::Quantization* q = config->mutable_quantization();
  MEMEST_ASSIGN_OR_RETURN(v1::WeightFormat format, ParseWord("--quantize", f.quantize, kFormats));
  q->set_format(format);
  q->set_double_quant(f.double_quant);
  q->set_compute_dtype(f.compute_dtype);
  for (std::string& name : SplitCommas(f.skip_modules)) *q->add_skip_modules() = std::move(name);
  if (f.no_kbit_preparation) q->set_prepare_model_for_kbit_training(false);
  if (f.int8_threshold) q->set_int8_threshold(*f.int8_threshold);
  if (f.int8_outlier_columns) q->set_int8_outlier_columns(*f.int8_outlier_columns);
  return ApplyServedQuantizationFlags(f, q);
}

}  // namespace

Status ApplyLoraFlags(const LoraFlags& f, v1::RunConfig* config) {
  MEMEST_RETURN_IF_ERROR(ApplyQuantizationFlags(f, config));
  if (f.config.empty() && !f.rank && !f.alpha && !f.dropout && f.targets.empty() &&
      f.modules_to_save.empty() && !f.keep_adapter_dtype && !f.use_dora) {
    return Status::Ok();
  }
  v1::Lora* lora = config->mutable_lora();
  if (!f.config.empty()) {
    MEMEST_ASSIGN_OR_RETURN(google::protobuf::Struct adapter,
                            ReadJsonObjectFile(f.config, "--lora-config", "adapter_config.json"));
    MEMEST_RETURN_IF_ERROR(LoraFromAdapterConfig(
        adapter, "--lora-config " + Escape(f.config, kMaxNameBytes) + ": ", lora));
  }
  if (f.rank) lora->set_rank(*f.rank);
  if (f.alpha) lora->set_alpha(*f.alpha);
  if (f.dropout) lora->set_dropout(*f.dropout);
  if (!f.targets.empty()) {
    lora->clear_target_modules();
    for (std::string& name : SplitCommas(f.targets)) *lora->add_target_modules() = std::move(name);
  }
  if (!f.modules_to_save.empty()) {
    lora->clear_modules_to_save();
    for (std::string& name : SplitCommas(f.modules_to_save)) {
      *lora->add_modules_to_save() = std::move(name);
    }
  }
  lora->set_keep_adapter_dtype(f.keep_adapter_dtype);
  if (f.use_dora) lora->set_use_dora(true);
  if (lora->rank() == 0) {
    return InvalidArgument("--lora-rank: required with the other --lora flags");
  }
  if (lora->target_modules_size() == 0 && !config->has_serving()) {  // vLLM's: every module
    return InvalidArgument("--lora-targets: the modules to adapt are required (names, or "
                           "all-linear)");
  }
  return Status::Ok();
}

}  // namespace memest::cli
