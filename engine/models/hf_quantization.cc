#include "engine/models/hf_quantization.h"

#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "engine/ir/text.h"
#include "engine/passes/served_quantize.h"

namespace memest {
namespace {

using Kind = JsonValue::Kind;

constexpr int64_t kMaxGroup = int64_t{1} << 20;

std::string Num(double x) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.17g", x);
  return text;
}

// Reads one object of quantization_config, naming its fields under `path`.
class Reader {
 public:
  Reader(const JsonValue& object, std::string path) : o_(object), path_(std::move(path)) {}

  std::string Field(std::string_view key) const { return path_ + "." + std::string(key); }

  const JsonValue* Get(std::string_view key) const {
    const JsonValue* v = o_.Find(key);
    return v == nullptr || v->kind == Kind::kNull ? nullptr : v;
  }
  Status Wrong(std::string_view key, const char* expected) const {
    return InvalidArgument(Field(key) + ": must be " + expected);
  }
  StatusOr<std::string> Text(std::string_view key, std::string fallback) const {
    const JsonValue* v = Get(key);
    if (v == nullptr) return fallback;
    if (v->kind != Kind::kString) return Wrong(key, "a string");
    return v->text;
  }
  StatusOr<bool> Flag(std::string_view key, bool fallback) const {
    const JsonValue* v = Get(key);
    if (v == nullptr) return fallback;
    if (v->kind != Kind::kBool) return Wrong(key, "true or false");
    return v->boolean;
  }
  // An integer in [lo, hi]; -1 too where `minus_one`.
  StatusOr<int64_t> Int(std::string_view key, int64_t fallback, int64_t lo, int64_t hi,
                        bool minus_one = false) const {
    const JsonValue* v = Get(key);
    if (v == nullptr) return fallback;
    if (v->kind != Kind::kNumber || v->number != std::floor(v->number) ||
        !((v->number >= static_cast<double>(lo) && v->number <= static_cast<double>(hi)) ||
          (minus_one && v->number == -1))) {
      return InvalidArgument(Field(key) + ": must be an integer " + (minus_one ? "-1 or " : "") +
                             "from " + std::to_string(lo) + " to " + std::to_string(hi) +
                             (v->kind == Kind::kNumber ? ", got " + Num(v->number) : ""));
    }
    return static_cast<int64_t>(v->number);
  }
  // A number in [lo, hi].
  StatusOr<double> Real(std::string_view key, double fallback, double lo, double hi) const {
    const JsonValue* v = Get(key);
    if (v == nullptr) return fallback;
    if (v->kind != Kind::kNumber || !(v->number >= lo && v->number <= hi)) {
      return InvalidArgument(Field(key) + ": must be a number from " + Num(lo) + " to " +
                             Num(hi) + (v->kind == Kind::kNumber ? ", got " + Num(v->number) : ""));
    }
    return v->number;
  }
  // A list of module names (or "re:" patterns).
  Status Names(std::string_view key, std::vector<std::string>* out) const {
    const JsonValue* v = Get(key);
    if (v == nullptr) return Status::Ok();
    if (v->kind != Kind::kList) return Wrong(key, "a list of module names");
    if (v->items.size() > kMaxLoraModules) {
      return InvalidArgument(Field(key) + ": at most " + std::to_string(kMaxLoraModules) +
                             " names, got " + std::to_string(v->items.size()));
    }
    for (size_t i = 0; i < v->items.size(); ++i) {
      if (v->items[i].kind != Kind::kString || v->items[i].text.empty()) {
        return InvalidArgument(Field(key) + "[" + std::to_string(i) + "]: must be a module's name");
      }
      out->push_back(v->items[i].text);
    }
    return Status::Ok();
  }
  // [n, k]: a block's size.
  Status Block(std::string_view key, QuantizationConfig* q) const {
    const JsonValue* v = Get(key);
    if (v == nullptr) return Status::Ok();
    if (v->kind != Kind::kList || v->items.size() != 2) return Wrong(key, "[n, k], a block's size");
    int64_t nk[2];
    for (int i = 0; i < 2; ++i) {
      const JsonValue& e = v->items[i];
      if (e.kind != Kind::kNumber || e.number != std::floor(e.number) || e.number < 1 ||
          e.number > static_cast<double>(kMaxGroup)) {
        return Wrong(key, "[n, k], two integers from 1 to 1048576");
      }
      nk[i] = static_cast<int64_t>(e.number);
    }
    q->weight_scales = ScaleGranularity::kBlock;
    q->block_n = nk[0];
    q->block_k = nk[1];
    return Status::Ok();
  }
  const JsonValue& object() const { return o_; }
  const std::string& path() const { return path_; }

 private:
  const JsonValue& o_;
  std::string path_;
};

StatusOr<QuantizationConfig> Bitsandbytes(const Reader& r) {
  QuantizationConfig q;
  MEMEST_ASSIGN_OR_RETURN(bool four, r.Flag("load_in_4bit", false));
  MEMEST_ASSIGN_OR_RETURN(bool eight, r.Flag("load_in_8bit", false));
  if (four == eight) {
    return InvalidArgument(r.Field("load_in_4bit") + ": one of load_in_4bit and load_in_8bit " +
                           "must be true, got " + (four ? "both" : "neither"));
  }
  MEMEST_RETURN_IF_ERROR(r.Names("llm_int8_skip_modules", &q.skip_modules));
  if (eight) {  // LLM.int8; BitsAndBytesConfig.to_dict() writes the 4-bit keys too: unread
    q.format = WeightFormat::kBnbInt8;
    MEMEST_ASSIGN_OR_RETURN(bool fp16_weights, r.Flag("llm_int8_has_fp16_weight", false));
    if (fp16_weights) {
      return InvalidArgument(r.Field("llm_int8_has_fp16_weight") +
                             ": 8-bit layers that keep and train float16 weights are not "
                             "modelled (false, transformers' default, is)");
    }
    MEMEST_ASSIGN_OR_RETURN(q.int8_threshold, r.Real("llm_int8_threshold", 6.0, 0, 1e6));
    return q;
  }
  MEMEST_ASSIGN_OR_RETURN(std::string type, r.Text("bnb_4bit_quant_type", "fp4"));
  if (type != "nf4" && type != "fp4") {
    return InvalidArgument(r.Field("bnb_4bit_quant_type") + ": nf4 or fp4, got " + Quote(type));
  }
  q.format = type == "nf4" ? WeightFormat::kBnbNf4 : WeightFormat::kBnbFp4;
  MEMEST_ASSIGN_OR_RETURN(q.double_quant, r.Flag("bnb_4bit_use_double_quant", false));
  MEMEST_ASSIGN_OR_RETURN(std::string compute, r.Text("bnb_4bit_compute_dtype", "float32"));
  StatusOr<DType> dtype = ParseDType(compute);
  if (!dtype.ok() || !IsFloating(*dtype) || *dtype == DType::kFloat64) {
    return InvalidArgument(r.Field("bnb_4bit_compute_dtype") + ": float32, float16 or bfloat16, got " +
                           Quote(compute));
  }
  q.compute_dtype = *dtype;
  return q;
}

StatusOr<QuantizationConfig> Fp8(const Reader& r) {
  QuantizationConfig q;
  q.format = WeightFormat::kW8A8Fp8;
  q.weight_scales = ScaleGranularity::kTensor;
  MEMEST_RETURN_IF_ERROR(r.Block("weight_block_size", &q));
  MEMEST_ASSIGN_OR_RETURN(std::string scheme, r.Text("activation_scheme", "dynamic"));
  if (scheme != "dynamic" && scheme != "static") {
    return InvalidArgument(r.Field("activation_scheme") + ": dynamic or static, got " + Quote(scheme));
  }
  q.inputs = scheme == "static" ? InputQuantization::kStatic : InputQuantization::kDynamicTensor;
  MEMEST_RETURN_IF_ERROR(r.Names("modules_to_not_convert", &q.skip_modules));
  MEMEST_RETURN_IF_ERROR(r.Names("ignored_layers", &q.skip_modules));
  return q;
}

// vLLM converts an AWQ or GPTQ checkpoint to its Marlin-family kernels only when its config
// names these keys (is_awq_marlin_compatible, is_gptq_marlin_compatible); otherwise it runs
// AWQ's or GPTQ's own kernels, which dequantize whole weights per call: not modelled.
Status RequireMarlinKeys(const Reader& r, std::initializer_list<const char*> keys,
                         const char* method) {
  for (const char* key : keys) {
    if (r.Get(key) == nullptr) {
      return InvalidArgument(r.Field(key) + ": missing; without it vLLM runs " + method +
                             "'s own kernels (a weight dequantized whole per call), which memest "
                             "does not model");
    }
  }
  return Status::Ok();
}

// check_marlin_supported's group sizes.
Status RequireMarlinGroup(const Reader& r, int64_t group) {
  if (group == -1 || group == 32 || group == 64 || group == 128) return Status::Ok();
  return InvalidArgument(r.Field("group_size") + ": " + std::to_string(group) +
                         "; vLLM's Marlin kernels take -1, 32, 64 or 128 (with another it runs "
                         "the method's own kernels, not modelled)");
}

StatusOr<QuantizationConfig> Awq(const Reader& r) {
  MEMEST_RETURN_IF_ERROR(RequireMarlinKeys(r, {"bits", "group_size", "zero_point"}, "AWQ"));
  QuantizationConfig q;
  q.format = WeightFormat::kW4A16;
  MEMEST_RETURN_IF_ERROR(r.Int("bits", 4, 4, 4).status());
  MEMEST_ASSIGN_OR_RETURN(q.group_size, r.Int("group_size", 128, 1, kMaxGroup, true));
  MEMEST_RETURN_IF_ERROR(RequireMarlinGroup(r, q.group_size));
  MEMEST_ASSIGN_OR_RETURN(q.zero_point, r.Flag("zero_point", true));
  if (!q.zero_point) {
    return InvalidArgument(r.Field("zero_point") + ": false; vLLM's Marlin kernels take AWQ's "
                           "4-bit weights with zero points only (uint4), and its own AWQ "
                           "kernels are not modelled");
  }
  MEMEST_RETURN_IF_ERROR(r.Names("modules_to_not_convert", &q.skip_modules));
  return q;
}

StatusOr<QuantizationConfig> Gptq(const Reader& r) {
  MEMEST_RETURN_IF_ERROR(RequireMarlinKeys(r, {"bits", "group_size", "sym", "desc_act"}, "GPTQ"));
  QuantizationConfig q;
  MEMEST_ASSIGN_OR_RETURN(int64_t bits, r.Int("bits", 4, 4, 8));
  if (bits != 4 && bits != 8) {
    return InvalidArgument(r.Field("bits") + ": 4 or 8 (vLLM's Marlin and Machete kernels), got " +
                           std::to_string(bits));
  }
  q.format = bits == 4 ? WeightFormat::kW4A16 : WeightFormat::kW8A16;
  q.gptq_layout = true;
  MEMEST_ASSIGN_OR_RETURN(q.group_size, r.Int("group_size", 128, 1, kMaxGroup, true));
  MEMEST_RETURN_IF_ERROR(RequireMarlinGroup(r, q.group_size));
  MEMEST_ASSIGN_OR_RETURN(q.act_order, r.Flag("desc_act", false));
  if (q.group_size == -1) q.act_order = false;  // one group: nothing to reorder
  MEMEST_ASSIGN_OR_RETURN(bool sym, r.Flag("sym", true));
  if (!sym) {
    return InvalidArgument(r.Field("sym") + ": false; vLLM's gptq_marlin takes symmetric "
                           "weights only (its TYPE_MAP), and GPTQ's own kernels are not modelled");
  }
  MEMEST_ASSIGN_OR_RETURN(bool lm_head, r.Flag("lm_head", false));
  if (lm_head) {
    return InvalidArgument(r.Field("lm_head") + ": a quantized lm_head is not modelled");
  }
  // Per-module overrides leave layers unquantized or quantize them otherwise (gptq_utils.py).
  for (const char* key : {"dynamic", "modules_in_block_to_quantize"}) {
    const JsonValue* v = r.Get(key);
    if (v != nullptr && !((v->kind == Kind::kObject || v->kind == Kind::kList) && v->items.empty())) {
      return InvalidArgument(r.Field(key) + ": per-module settings are not modelled (every "
                             "linear would be taken as quantized alike)");
    }
  }
  return q;
}

// compressed-tensors' weights and input_activations of one scheme.
StatusOr<QuantizationConfig> Scheme(const Reader& group) {
  QuantizationConfig q;
  const JsonValue* weights = group.Get("weights");
  if (weights == nullptr || weights->kind != Kind::kObject) {
    return InvalidArgument(group.Field("weights") + ": must be the weights' scheme (an object)");
  }
  const Reader w(*weights, group.Field("weights"));
  MEMEST_ASSIGN_OR_RETURN(int64_t bits, w.Int("num_bits", 8, 4, 8));
  MEMEST_ASSIGN_OR_RETURN(std::string type, w.Text("type", "int"));
  MEMEST_ASSIGN_OR_RETURN(std::string strategy, w.Text("strategy", "tensor"));
  MEMEST_ASSIGN_OR_RETURN(bool symmetric, w.Flag("symmetric", true));
  const JsonValue* inputs = group.Get("input_activations");
  if ((bits != 4 && bits != 8) || (type != "int" && type != "float") ||
      (type == "float" && bits != 8)) {
    return InvalidArgument(w.Field(bits != 4 && bits != 8 ? "num_bits" : "type") +
                           ": 4- or 8-bit int weights or 8-bit float weights are modelled, got " +
                           std::to_string(bits) + "-bit " + type);
  }
  if (inputs == nullptr) {  // weight-only: vLLM's CompressedTensorsWNA16
    if (type == "float") {
      return InvalidArgument(group.Field("input_activations") + ": fp8 weights alone (W8A16 FP8) "
                             "are not modelled; W8A8 FP8 is");
    }
    q.format = bits == 4 ? WeightFormat::kW4A16 : WeightFormat::kW8A16;
    if (strategy == "channel") {
      q.group_size = -1;
    } else if (strategy == "group") {
      MEMEST_ASSIGN_OR_RETURN(q.group_size, w.Int("group_size", 0, 1, kMaxGroup));
      if (q.group_size == 0) return InvalidArgument(w.Field("group_size") + ": required with strategy group");
    } else {
      return InvalidArgument(w.Field("strategy") + ": channel or group for int weights alone, got " +
                             Quote(strategy));
    }
    q.zero_point = !symmetric;
    const JsonValue* actorder = w.Get("actorder");
    q.act_order = actorder != nullptr &&
                  ((actorder->kind == Kind::kString && actorder->text == "group") ||
                   (actorder->kind == Kind::kBool && actorder->boolean));
    return q;
  }
  if (inputs->kind != Kind::kObject) {
    return InvalidArgument(group.Field("input_activations") + ": must be null or an object");
  }
  const Reader a(*inputs, group.Field("input_activations"));
  MEMEST_ASSIGN_OR_RETURN(int64_t input_bits, a.Int("num_bits", 8, 8, 8));
  (void)input_bits;
  MEMEST_ASSIGN_OR_RETURN(std::string input_type, a.Text("type", type));
  if (bits != 8 || input_type != type) {
    return InvalidArgument((bits != 8 ? w.Field("num_bits") : a.Field("type")) +
                           ": W8A8 with weights and inputs of one type is "
                           "modelled, got " + std::to_string(bits) + "-bit " + type + " weights and " +
                           input_type + " inputs");
  }
  q.format = type == "float" ? WeightFormat::kW8A8Fp8 : WeightFormat::kW8A8Int8;
  if (strategy == "channel") {
    q.weight_scales = ScaleGranularity::kChannel;
  } else if (strategy == "tensor") {
    q.weight_scales = ScaleGranularity::kTensor;
  } else if (strategy == "block" && type == "float") {
    MEMEST_RETURN_IF_ERROR(w.Block("block_structure", &q));
    q.weight_scales = ScaleGranularity::kBlock;
  } else {
    return InvalidArgument(w.Field("strategy") + ": channel, tensor (or block for fp8) with "
                           "quantized inputs, got " + Quote(strategy));
  }
  MEMEST_ASSIGN_OR_RETURN(bool dynamic, a.Flag("dynamic", false));
  MEMEST_ASSIGN_OR_RETURN(std::string input_strategy, a.Text("strategy", "tensor"));
  if (!dynamic) {
    q.inputs = InputQuantization::kStatic;
  } else if (input_strategy == "token" || input_strategy == "group") {
    q.inputs = InputQuantization::kDynamicToken;
  } else if (input_strategy == "tensor") {
    q.inputs = InputQuantization::kDynamicTensor;
  } else {
    return InvalidArgument(a.Field("strategy") + ": token, group or tensor, got " +
                           Quote(input_strategy));
  }
  MEMEST_ASSIGN_OR_RETURN(bool input_symmetric, a.Flag("symmetric", true));
  q.asymmetric_inputs = !input_symmetric && type == "int";
  return q;
}

bool SameScheme(const QuantizationConfig& a, const QuantizationConfig& b) {
  return a.format == b.format && a.weight_scales == b.weight_scales && a.block_n == b.block_n &&
         a.block_k == b.block_k && a.inputs == b.inputs &&
         a.asymmetric_inputs == b.asymmetric_inputs && a.group_size == b.group_size &&
         a.zero_point == b.zero_point && a.act_order == b.act_order;
}

StatusOr<QuantizationConfig> CompressedTensors(const Reader& r) {
  if (r.Get("sparsity_config") != nullptr) {
    return InvalidArgument(r.Field("sparsity_config") + ": sparse (2:4) checkpoints are not modelled");
  }
  MEMEST_ASSIGN_OR_RETURN(std::string format, r.Text("format", "pack-quantized"));
  if (format != "float-quantized" && format != "int-quantized" && format != "pack-quantized" &&
      format != "naive-quantized") {
    return InvalidArgument(r.Field("format") + ": " + Quote(format) + "; modelled: "
                           "float-quantized, int-quantized, pack-quantized, naive-quantized");
  }
  const JsonValue* groups = r.Get("config_groups");
  if (groups == nullptr || groups->kind != Kind::kObject || groups->items.empty()) {
    return InvalidArgument(r.Field("config_groups") + ": must hold the checkpoint's schemes");
  }
  QuantizationConfig q;
  for (size_t i = 0; i < groups->items.size(); ++i) {
    if (groups->items[i].kind != Kind::kObject) {
      return InvalidArgument(r.Field("config_groups." + groups->keys[i]) + ": must be an object");
    }
    const Reader group(groups->items[i], r.Field("config_groups." + groups->keys[i]));
    // A scheme for some layer types only (vLLM raises for a linear no target matches).
    const JsonValue* targets = group.Get("targets");
    if (targets != nullptr &&
        !(targets->kind == Kind::kList && targets->items.size() == 1 &&
          targets->items[0].kind == Kind::kString && targets->items[0].text == "Linear")) {
      return InvalidArgument(group.Field("targets") + ": schemes for every Linear ([\"Linear\"]) "
                             "are modelled");
    }
    MEMEST_ASSIGN_OR_RETURN(QuantizationConfig s, Scheme(group));
    if (i > 0 && !SameScheme(q, s)) {
      return InvalidArgument(r.Field("config_groups." + groups->keys[i]) +
                             ": a second scheme; checkpoints with one scheme for every linear "
                             "are modelled");
    }
    q = s;
  }
  MEMEST_RETURN_IF_ERROR(r.Names("ignore", &q.skip_modules));
  for (size_t i = 0; i < q.skip_modules.size(); ++i) {
    if (!ReadableSkipEntry(q.skip_modules[i])) {
      return InvalidArgument(r.Field("ignore[" + std::to_string(i) + "]") + ": " +
                             Quote(q.skip_modules[i]) + " is a pattern memest does not read "
                             "(literal text, '.', '.*', '\\.' and a final '$')");
    }
  }
  return q;
}

}  // namespace

std::string HfQuantMethod(const JsonValue& config) {
  const JsonValue* qc = config.Find("quantization_config");
  const JsonValue* m = qc == nullptr ? nullptr : qc->Find("quant_method");
  return m != nullptr && m->kind == Kind::kString ? m->text : "";
}

StatusOr<QuantizationConfig> HfConfigQuantization(const JsonValue& config) {
  const std::string path = "model.hf_config.config.quantization_config";
  const JsonValue* qc = config.Find("quantization_config");
  if (qc == nullptr || qc->kind != Kind::kObject) {
    return InvalidArgument(path + ": must be an object (the checkpoint's quantization)");
  }
  const Reader r(*qc, path);
  MEMEST_ASSIGN_OR_RETURN(std::string method, r.Text("quant_method", ""));
  if (method == "bitsandbytes") return Bitsandbytes(r);
  if (method == "fp8") return Fp8(r);
  if (method == "compressed-tensors") return CompressedTensors(r);
  if (method == "awq") return Awq(r);
  if (method == "gptq") return Gptq(r);
  return InvalidArgument(r.Field("quant_method") + ": " +
                         (method.empty() ? std::string("missing") : Quote(method)) +
                         "; modelled: bitsandbytes (4-bit), fp8, compressed-tensors, awq, gptq");
}

StatusOr<ModelSpec> ResolveCheckpointQuantization(const ModelSpec& model, RunConfig* config) {
  const auto* hf = std::get_if<HfConfigSpec>(&model.source);
  if (hf == nullptr || hf->config.Find("quantization_config") == nullptr) return model;
  MEMEST_ASSIGN_OR_RETURN(QuantizationConfig q, HfConfigQuantization(hf->config));
  if (config->quantization.format != WeightFormat::kDense) {
    return InvalidArgument("config.quantization: the checkpoint is quantized already "
                           "(model.hf_config.config.quantization_config, quant_method " +
                           Quote(HfQuantMethod(hf->config)) + "); leave it unset");
  }
  config->quantization = std::move(q);
  HfConfigSpec plain = *hf;
  for (size_t i = 0; i < plain.config.keys.size(); ++i) {
    if (plain.config.keys[i] != "quantization_config") continue;
    plain.config.keys.erase(plain.config.keys.begin() + static_cast<std::ptrdiff_t>(i));
    plain.config.items.erase(plain.config.items.begin() + static_cast<std::ptrdiff_t>(i));
    break;
  }
  ModelSpec resolved = model;
  resolved.source = std::move(plain);
  return resolved;
}

}  // namespace memest
