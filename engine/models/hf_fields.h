// Reading a Hugging Face config.json's fields (engine/models/hf_config.cc): each read checks the
// value's type and range and names the field in its error, "model.hf_config.config.<key>".
#ifndef MEMEST_ENGINE_MODELS_HF_FIELDS_H_
#define MEMEST_ENGINE_MODELS_HF_FIELDS_H_

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <utility>

#include "engine/ir/json.h"
#include "engine/ir/status.h"
#include "engine/models/layers.h"

namespace memest::hf {

using Kind = JsonValue::Kind;

// The largest size a config may give: far beyond any real model's, and small enough that
// products of a few sizes cannot overflow (as kMaxParamValue for the presets).
inline constexpr int64_t kMaxSize = int64_t{1} << 24;

// "model.hf_config.config.<key>".
std::string Field(std::string_view key);
// "null", "a boolean", "a number", ...
const char* KindName(Kind kind);
// INVALID_ARGUMENT "<field>: must be <expected>, got <kind>".
Status WrongKind(std::string_view key, const char* expected, const JsonValue& got);

// Reads a config's fields; a field absent or null takes the caller's fallback.
class Fields {
 public:
  Fields(const JsonValue& config, std::string model_type)
      : config_(config), model_type_(std::move(model_type)) {}

  bool Present(std::string_view key) const { return config_.Find(key) != nullptr; }

  const JsonValue* Get(std::string_view key) const {
    const JsonValue* v = config_.Find(key);
    return v == nullptr || v->kind == Kind::kNull ? nullptr : v;
  }

  // A positive integer of at most kMaxSize, which the config must give.
  StatusOr<int64_t> Size(std::string_view key) const {
    if (Get(key) == nullptr) {
      return InvalidArgument(Field(key) + ": missing; a " + model_type_ +
                             " config must give it");
    }
    return Size(key, 0);
  }
  StatusOr<int64_t> Size(std::string_view key, int64_t fallback) const {
    return Integer(key, fallback, 1, "a positive integer");
  }
  // An integer from 0 to kMaxSize (a count that may be none: first_k_dense_replace).
  StatusOr<int64_t> Count(std::string_view key, int64_t fallback) const {
    return Integer(key, fallback, 0, "an integer >= 0");
  }
  StatusOr<bool> Flag(std::string_view key, bool fallback) const {
    const JsonValue* v = Get(key);
    if (v == nullptr) return fallback;
    if (v->kind != Kind::kBool) return WrongKind(key, "true or false", *v);
    return v->boolean;
  }
  // A fraction in (0, 1].
  StatusOr<double> Fraction(std::string_view key, double fallback) const {
    const JsonValue* v = Get(key);
    if (v == nullptr) return fallback;
    if (v->kind != Kind::kNumber) return WrongKind(key, "a fraction", *v);
    if (!(v->number > 0 && v->number <= 1)) {
      return InvalidArgument(Field(key) + ": must be in (0, 1], got " + JsonNumber(v->number));
    }
    return v->number;
  }
  // A finite number > 0 (Gemma's query_pre_attn_scalar, a soft-capping value).
  StatusOr<double> Positive(std::string_view key, double fallback) const {
    const JsonValue* v = Get(key);
    if (v == nullptr) return fallback;
    if (v->kind != Kind::kNumber) return WrongKind(key, "a positive number", *v);
    if (!(v->number > 0 && std::isfinite(v->number))) {
      return InvalidArgument(Field(key) + ": must be a finite number > 0, got " +
                             JsonNumber(v->number));
    }
    return v->number;
  }
  // A dropout probability in [0, 1).
  StatusOr<double> Probability(std::string_view key, double fallback) const {
    const JsonValue* v = Get(key);
    if (v == nullptr) return fallback;
    if (v->kind != Kind::kNumber) return WrongKind(key, "a probability", *v);
    if (!(v->number >= 0 && v->number < 1)) {
      return InvalidArgument(Field(key) + ": must be a probability in [0, 1), got " +
                             JsonNumber(v->number));
    }
    return v->number;
  }
  StatusOr<std::string> Text(std::string_view key, const std::string& fallback) const {
    const JsonValue* v = Get(key);
    if (v == nullptr) return fallback;
    if (v->kind != Kind::kString) return WrongKind(key, "a string", *v);
    return v->text;
  }

  static std::string JsonNumber(double x) {
    if (!std::isfinite(x)) return "a non-finite number";
    char text[32];
    std::snprintf(text, sizeof(text), "%.17g", x);
    return text;
  }

 private:
  StatusOr<int64_t> Integer(std::string_view key, int64_t fallback, int64_t lowest,
                            const char* kind) const {
    const JsonValue* v = Get(key);
    if (v == nullptr) return fallback;
    if (v->kind != Kind::kNumber) return WrongKind(key, kind, *v);
    if (!(v->number >= static_cast<double>(lowest) &&
          v->number <= static_cast<double>(kMaxSize)) ||
        v->number != std::floor(v->number)) {
      return InvalidArgument(Field(key) + ": must be an integer from " + std::to_string(lowest) +
                             " to " + std::to_string(kMaxSize) + ", got " + JsonNumber(v->number));
    }
    return static_cast<int64_t>(v->number);
  }

  const JsonValue& config_;
  std::string model_type_;
};

// HF's ACT2FN names of the activations the decoders run (silu, swish, gelu, gelu_new,
// gelu_pytorch_tanh, relu).
StatusOr<Activation> ActivationOf(const Fields& f, std::string_view key,
                                  const std::string& fallback);
// The causal-LM class a model type builds; a config naming another architecture (a
// classification head, an encoder) is refused rather than built as something else.
Status CheckArchitecture(const Fields& f, const std::string& causal_lm);
// rope_scaling or rope_parameters: a type transformers knows; transformers 5's parameters per
// layer type ({"full_attention": {...}, "sliding_attention": {...}}, Gemma 3) each.
Status CheckRope(const Fields& f, const char* field);
// A setting that changes the model in a way not modelled: refused when true.
Status RefuseIfSet(const Fields& f, std::string_view key, const char* why);

}  // namespace memest::hf

#endif  // MEMEST_ENGINE_MODELS_HF_FIELDS_H_
