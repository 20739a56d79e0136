#include "server/wire.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/stubs/logging.h>
#include <grpcpp/support/proto_buffer_reader.h>
#include <grpcpp/support/proto_buffer_writer.h>
#include <spdlog/spdlog.h>

#include <climits>
#include <mutex>
#include <string>
#include <vector>

#include "engine/ir/text.h"

namespace memest {
namespace {

namespace pb = google::protobuf;

// The most bytes of protobuf log text kept: the lines of one failed parse are a few hundred.
constexpr size_t kMaxLogText = 1024;

// Where the protobuf log lines of the parse running on this thread go; null when none runs.
thread_local std::string* captured_log = nullptr;

void OnProtobufLog(pb::LogLevel level, const char* /*filename*/, int /*line*/,
                   const std::string& message) {
  if (captured_log != nullptr) {
    if (captured_log->size() < kMaxLogText) *captured_log += message + "\n";
    return;
  }
  const std::string text = BoundMessage(message, kMaxLogText);
  switch (level) {
    case pb::LOGLEVEL_INFO:
      spdlog::info("protobuf: {}", text);
      break;
    case pb::LOGLEVEL_WARNING:
      spdlog::warn("protobuf: {}", text);
      break;
    case pb::LOGLEVEL_ERROR:
      spdlog::error("protobuf: {}", text);
      break;
    default:
      spdlog::critical("protobuf: {}", text);
      break;
  }
}

// Sends this thread's protobuf log lines to `log` while it lives.
class CaptureProtobufLog {
 public:
  explicit CaptureProtobufLog(std::string* log) : previous_(captured_log) { captured_log = log; }
  ~CaptureProtobufLog() { captured_log = previous_; }
  CaptureProtobufLog(const CaptureProtobufLog&) = delete;
  CaptureProtobufLog& operator=(const CaptureProtobufLog&) = delete;

 private:
  std::string* previous_;
};

std::string Join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

// The path of a singular message field as the engine's messages name it: the layer-list and
// op-graph sources are flattened into "model." (model.layers[3], model.tensors[0]), as
// server/convert.cc names them.
std::string MessagePath(const std::string& prefix, const pb::FieldDescriptor* field) {
  const std::string& type = field->message_type()->full_name();
  if (type == "memest.v1.LayerModel" || type == "memest.v1.OpGraph") return prefix;
  return Join(prefix, field->name());
}

// A string field's value that is not valid UTF-8, and where it is.
struct BadString {
  std::string path;   // "model.layers[3].name"; "model.layers[0].attrs" for a map's key
  std::string value;  // the bytes, as parsed
  bool key = false;   // the value is a key of the map at `path`
};

bool IsString(const pb::FieldDescriptor* field) {
  return field->type() == pb::FieldDescriptor::TYPE_STRING;
}

// Finds the first string in `message` (walked in field order) that is not valid UTF-8. Map
// entries extend the path by their key, as the engine's field paths do ("attrs.<name>"). A map
// entry that failed is not in the map: protobuf keeps only the entries it parsed whole.
bool FindBadString(const pb::Message& message, const std::string& prefix, BadString* bad) {
  const pb::Reflection* reflection = message.GetReflection();
  std::vector<const pb::FieldDescriptor*> fields;
  reflection->ListFields(message, &fields);
  for (const pb::FieldDescriptor* field : fields) {
    const std::string path = Join(prefix, field->name());
    if (field->is_map()) {
      const pb::FieldDescriptor* key_field = field->message_type()->map_key();
      const pb::FieldDescriptor* value_field = field->message_type()->map_value();
      for (int i = 0; i < reflection->FieldSize(message, field); ++i) {
        const pb::Message& entry = reflection->GetRepeatedMessage(message, field, i);
        const pb::Reflection* entry_reflection = entry.GetReflection();
        std::string key = "[" + std::to_string(i) + "]";
        if (IsString(key_field)) {
          key = entry_reflection->GetString(entry, key_field);
          if (!IsValidUtf8(key)) {
            *bad = {path, key, true};
            return true;
          }
        }
        const std::string entry_path = path + "." + Escape(key);
        if (value_field->type() == pb::FieldDescriptor::TYPE_MESSAGE &&
            FindBadString(entry_reflection->GetMessage(entry, value_field), entry_path, bad)) {
          return true;
        }
        if (IsString(value_field)) {
          const std::string value = entry_reflection->GetString(entry, value_field);
          if (!IsValidUtf8(value)) {
            *bad = {entry_path, value, false};
            return true;
          }
        }
      }
    } else if (field->is_repeated()) {
      for (int i = 0; i < reflection->FieldSize(message, field); ++i) {
        const std::string item = path + "[" + std::to_string(i) + "]";
        if (field->type() == pb::FieldDescriptor::TYPE_MESSAGE &&
            FindBadString(reflection->GetRepeatedMessage(message, field, i), item, bad)) {
          return true;
        }
        if (IsString(field)) {
          const std::string value = reflection->GetRepeatedString(message, field, i);
          if (!IsValidUtf8(value)) {
            *bad = {item, value, false};
            return true;
          }
        }
      }
    } else if (field->type() == pb::FieldDescriptor::TYPE_MESSAGE) {
      if (FindBadString(reflection->GetMessage(message, field), MessagePath(prefix, field), bad)) {
        return true;
      }
    } else if (IsString(field)) {
      const std::string value = reflection->GetString(message, field);
      if (!IsValidUtf8(value)) {
        *bad = {path, value, false};
        return true;
      }
    }
  }
  return false;
}

// "memest.v1.Preset.name" from protobuf's "String field 'memest.v1.Preset.name' contains
// invalid UTF-8 data ..."; empty if the log holds no such line.
std::string FieldFromLog(const std::string& log) {
  static constexpr std::string_view kStart = "String field '";
  const size_t start = log.find(kStart);
  if (start == std::string::npos) return "";
  const size_t begin = start + kStart.size();
  const size_t end = log.find('\'', begin);
  if (end == std::string::npos) return "";
  return log.substr(begin, end - begin);
}

// Why `request` (parsed in part from `size` bytes, protobuf having logged `log`) failed.
Status ParseError(const pb::Message& request, size_t size, const std::string& log) {
  constexpr char kUtf8[] = "is not valid UTF-8 (proto3 strings must be)";
  BadString bad;
  if (FindBadString(request, "", &bad)) {
    return InvalidArgument(bad.path + ": " + (bad.key ? "a key " : "") + kUtf8 + ": " +
                           Quote(bad.value));
  }
  const std::string type = request.GetDescriptor()->full_name();
  const std::string field = FieldFromLog(log);
  if (!field.empty()) {
    return InvalidArgument("request: the string field " + Escape(field) + " of a " + type + " " +
                           kUtf8);
  }
  return InvalidArgument("request: not a valid " + type + ": its " + std::to_string(size) +
                         " bytes do not parse as one" +
                         (log.empty() ? "" : " (" + BoundMessage(log, 256) + ")"));
}

}  // namespace

void InstallProtobufLogHandler() {
  static std::once_flag once;
  std::call_once(once, [] { pb::SetLogHandler(&OnProtobufLog); });
}

Status ParseRequest(const grpc::ByteBuffer& bytes, pb::Message* request) {
  request->Clear();
  if (!bytes.Valid() || bytes.Length() == 0) return Status::Ok();  // all fields unset
  grpc::ByteBuffer copy(bytes);  // the reader consumes its buffer; the copy shares the slices
  std::string log;
  bool parsed = false;
  {
    CaptureProtobufLog capture(&log);
    grpc::ProtoBufferReader reader(&copy);
    parsed = reader.status().ok() && request->ParseFromZeroCopyStream(&reader);
  }
  if (parsed) return Status::Ok();
  Status error = ParseError(*request, bytes.Length(), log);
  request->Clear();
  return error;
}

Status SerializeReply(const pb::Message& reply, grpc::ByteBuffer* bytes) {
  const size_t size = reply.ByteSizeLong();
  grpc::ByteBuffer out;
  bool written = false;
  if (size <= INT_MAX) {
    grpc::ProtoBufferWriter writer(&out, grpc::kProtoBufferWriterMaxBufferLength,
                                   static_cast<int>(size));
    written = reply.SerializeToZeroCopyStream(&writer);
  }
  if (!written) {
    return Internal("reply: a " + reply.GetDescriptor()->full_name() + " of " +
                    std::to_string(size) + " bytes could not be serialized");
  }
  bytes->Swap(&out);
  return Status::Ok();
}

}  // namespace memest
