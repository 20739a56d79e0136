// model.hf_config: the config.json object (a google.protobuf.Struct) into the engine's JsonValue,
// and the run settings the config implies where the request leaves them unset.
#include <string>
#include <utility>

#include "engine/models/hf_config.h"
#include "server/convert.h"

namespace memest {
namespace {

// Deeper than any config.json (two or three levels); protobuf stops at 100 while parsing.
constexpr int kMaxDepth = 32;

StatusOr<JsonValue> ObjectFromProto(const google::protobuf::Struct& object, int depth);

StatusOr<JsonValue> FromProto(const google::protobuf::Value& value, int depth) {
  if (depth > kMaxDepth) {
    return InvalidArgument("model.hf_config.config: nested more than " + std::to_string(kMaxDepth) +
                           " levels deep");
  }
  JsonValue out;
  switch (value.kind_case()) {
    case google::protobuf::Value::kNullValue:
    case google::protobuf::Value::KIND_NOT_SET:
      break;
    case google::protobuf::Value::kBoolValue:
      out.kind = JsonValue::Kind::kBool;
      out.boolean = value.bool_value();
      break;
    case google::protobuf::Value::kNumberValue:
      out.kind = JsonValue::Kind::kNumber;
      out.number = value.number_value();
      break;
    case google::protobuf::Value::kStringValue:
      out.kind = JsonValue::Kind::kString;
      out.text = value.string_value();
      break;
    case google::protobuf::Value::kListValue:
      out.kind = JsonValue::Kind::kList;
      out.items.reserve(value.list_value().values_size());
      for (const google::protobuf::Value& item : value.list_value().values()) {
        MEMEST_ASSIGN_OR_RETURN(JsonValue v, FromProto(item, depth + 1));
        out.items.push_back(std::move(v));
      }
      break;
    case google::protobuf::Value::kStructValue:
      MEMEST_ASSIGN_OR_RETURN(out, ObjectFromProto(value.struct_value(), depth + 1));
      break;
  }
  return out;
}

StatusOr<JsonValue> ObjectFromProto(const google::protobuf::Struct& object, int depth) {
  JsonValue out;
  out.kind = JsonValue::Kind::kObject;
  out.keys.reserve(object.fields_size());
  out.items.reserve(object.fields_size());
  for (const auto& [key, value] : object.fields()) {
    MEMEST_ASSIGN_OR_RETURN(JsonValue v, FromProto(value, depth));
    out.keys.push_back(key);
    out.items.push_back(std::move(v));
  }
  return out;
}

}  // namespace

StatusOr<HfConfigSpec> HfConfigFromProto(const v1::HfConfig& hf) {
  HfConfigSpec spec;
  if (!hf.has_config()) {
    return InvalidArgument("model.hf_config.config: missing: the config.json's object");
  }
  MEMEST_ASSIGN_OR_RETURN(spec.config, ObjectFromProto(hf.config(), 0));
  spec.seq = hf.seq();
  return spec;
}

Status ApplyModelHints(const ModelSpec& model, const v1::RunConfig& proto, RunConfig* run,
                       std::vector<std::string>* notes) {
  const auto* hf = std::get_if<HfConfigSpec>(&model.source);
  if (hf == nullptr || run->runtime != Runtime::kCuda) return Status::Ok();
  // A server picks its dtype itself (ApplyServingDtype, convert_serving.cc).
  const bool precision = proto.precision() == v1::PRECISION_UNSPECIFIED && !proto.has_serving();
  // A server runs its own attention backend, whatever the config's attn_implementation says.
  const bool attention = !proto.has_attention() && !proto.has_serving();
  MEMEST_ASSIGN_OR_RETURN(HfRunHints hints, HfConfigRunHints(hf->config, precision, attention));
  if (precision && hints.dtype) {
    switch (*hints.dtype) {
      case DType::kBFloat16:
        run->precision = Precision::kBf16Pure;
        break;
      case DType::kFloat16:
        run->precision = Precision::kFp16Pure;
        break;
      default:
        run->precision = Precision::kFp32;
        break;
    }
    if (notes != nullptr) {
      notes->push_back(std::string("precision ") + PrecisionName(run->precision) +
                       " from the config's torch_dtype " + std::string(DTypeName(*hints.dtype)) +
                       " (the weights as from_pretrained loads them); set the precision to "
                       "choose another");
    }
  }
  if (attention && hints.attention) {
    run->attention = *hints.attention;
    if (notes != nullptr) {
      notes->push_back(std::string("attention ") + AttentionImplName(run->attention) +
                       " from the config's attn_implementation");
    }
  }
  const JsonValue* type = hf->config.Find("model_type");
  const bool gemma2 =
      type != nullptr && type->kind == JsonValue::Kind::kString && type->text == "gemma2";
  if (gemma2 && notes != nullptr && run->mode == Mode::kTraining &&
      ResolveAttention(*run) != AttentionImpl::kEager) {
    notes->push_back(std::string("attention ") + AttentionImplName(ResolveAttention(*run)) +
                     " for Gemma 2, which transformers recommends training with eager "
                     "attention: SDPA drops the scores' attn_logit_softcapping, and transformers "
                     "4.4x runs eager unless sdpa is asked for; --attention eager estimates "
                     "that run ([T, T] scores, their tanh kept for backward)");
  }
  return Status::Ok();
}

}  // namespace memest
