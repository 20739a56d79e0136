// One value of a protobuf message's field, read and written through reflection whatever the
// field's type: the singular value, element `index` of a repeated field, or a new element
// appended (kAppend). Reads of kAppend give the type's default. Part of the fuzzers' mutator
// (proto_mutator.h).
#ifndef MEMEST_FUZZ_FIELD_SLOT_H_
#define MEMEST_FUZZ_FIELD_SLOT_H_

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>

namespace memest::fuzz {

// Slot indices besides an element's: the singular value, or a new element appended.
inline constexpr int kSingular = -1;
inline constexpr int kAppend = -2;

class FieldSlot {
 public:
  FieldSlot(google::protobuf::Message* message, const google::protobuf::FieldDescriptor* field,
            int index)
      : m_(message), f_(field), r_(message->GetReflection()), index_(index) {}

  // Int: int32 and int64 fields (an int32 keeps the low 32 bits); UInt: uint32 and uint64;
  // Double: double and float (beyond float's range, infinity); Enum: the number, known or not.
  int64_t GetInt() const {
    if (index_ == kAppend) return 0;
    const bool is32 = f_->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_INT32;
    if (index_ == kSingular) return is32 ? r_->GetInt32(*m_, f_) : r_->GetInt64(*m_, f_);
    return is32 ? r_->GetRepeatedInt32(*m_, f_, index_) : r_->GetRepeatedInt64(*m_, f_, index_);
  }
  void SetInt(int64_t v) {
    if (f_->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_INT32) {
      const auto v32 = static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint64_t>(v)));
      if (index_ == kAppend)
        r_->AddInt32(m_, f_, v32);
      else if (index_ == kSingular)
        r_->SetInt32(m_, f_, v32);
      else
        r_->SetRepeatedInt32(m_, f_, index_, v32);
    } else {
      if (index_ == kAppend)
        r_->AddInt64(m_, f_, v);
      else if (index_ == kSingular)
        r_->SetInt64(m_, f_, v);
      else
        r_->SetRepeatedInt64(m_, f_, index_, v);
    }
  }
  uint64_t GetUInt() const {
    if (index_ == kAppend) return 0;
    const bool is32 = f_->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_UINT32;
    if (index_ == kSingular) return is32 ? r_->GetUInt32(*m_, f_) : r_->GetUInt64(*m_, f_);
    return is32 ? r_->GetRepeatedUInt32(*m_, f_, index_) : r_->GetRepeatedUInt64(*m_, f_, index_);
  }
  void SetUInt(uint64_t v) {
    if (f_->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_UINT32) {
      const auto v32 = static_cast<uint32_t>(v);
      if (index_ == kAppend)
        r_->AddUInt32(m_, f_, v32);
      else if (index_ == kSingular)
        r_->SetUInt32(m_, f_, v32);
      else
        r_->SetRepeatedUInt32(m_, f_, index_, v32);
    } else {
      if (index_ == kAppend)
        r_->AddUInt64(m_, f_, v);
      else if (index_ == kSingular)
        r_->SetUInt64(m_, f_, v);
      else
        r_->SetRepeatedUInt64(m_, f_, index_, v);
    }
  }
  double GetDouble() const {
    if (index_ == kAppend) return 0;
    const bool is_float = f_->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_FLOAT;
    if (index_ == kSingular) return is_float ? r_->GetFloat(*m_, f_) : r_->GetDouble(*m_, f_);
    return is_float ? r_->GetRepeatedFloat(*m_, f_, index_)
                    : r_->GetRepeatedDouble(*m_, f_, index_);
  }
  void SetDouble(double v) {
    if (f_->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_FLOAT) {
      // A double beyond float's range is undefined behaviour to convert: saturate it.
      const double limit = std::numeric_limits<float>::max();
      const float f = std::isnan(v) ? std::numeric_limits<float>::quiet_NaN()
                      : v > limit   ? std::numeric_limits<float>::infinity()
                      : v < -limit  ? -std::numeric_limits<float>::infinity()
                                    : static_cast<float>(v);
      if (index_ == kAppend)
        r_->AddFloat(m_, f_, f);
      else if (index_ == kSingular)
        r_->SetFloat(m_, f_, f);
      else
        r_->SetRepeatedFloat(m_, f_, index_, f);
    } else {
      if (index_ == kAppend)
        r_->AddDouble(m_, f_, v);
      else if (index_ == kSingular)
        r_->SetDouble(m_, f_, v);
      else
        r_->SetRepeatedDouble(m_, f_, index_, v);
    }
  }
  bool GetBool() const {
    if (index_ == kAppend) return false;
    if (index_ == kSingular) return r_->GetBool(*m_, f_);
    return r_->GetRepeatedBool(*m_, f_, index_);
  }
  void SetBool(bool v) {
    if (index_ == kAppend)
      r_->AddBool(m_, f_, v);
    else if (index_ == kSingular)
      r_->SetBool(m_, f_, v);
    else
      r_->SetRepeatedBool(m_, f_, index_, v);
  }
  std::string GetString() const {
    if (index_ == kAppend) return "";
    if (index_ == kSingular) return r_->GetString(*m_, f_);
    return r_->GetRepeatedString(*m_, f_, index_);
  }
  void SetString(std::string v) {
    if (index_ == kAppend)
      r_->AddString(m_, f_, std::move(v));
    else if (index_ == kSingular)
      r_->SetString(m_, f_, std::move(v));
    else
      r_->SetRepeatedString(m_, f_, index_, std::move(v));
  }
  int GetEnum() const {
    if (index_ == kAppend) return 0;
    if (index_ == kSingular) return r_->GetEnumValue(*m_, f_);
    return r_->GetRepeatedEnumValue(*m_, f_, index_);
  }
  void SetEnum(int v) {
    if (index_ == kAppend)
      r_->AddEnumValue(m_, f_, v);
    else if (index_ == kSingular)
      r_->SetEnumValue(m_, f_, v);
    else
      r_->SetRepeatedEnumValue(m_, f_, index_, v);
  }

  const google::protobuf::FieldDescriptor* field() const { return f_; }

 private:
  google::protobuf::Message* m_;
  const google::protobuf::FieldDescriptor* f_;
  const google::protobuf::Reflection* r_;
  int index_;
};

// Copies `from`'s value into `to`, a slot of a field of the same type.
inline void CopySlot(const FieldSlot& from, FieldSlot* to) {
  switch (from.field()->cpp_type()) {
    case google::protobuf::FieldDescriptor::CPPTYPE_INT32:
    case google::protobuf::FieldDescriptor::CPPTYPE_INT64:
      to->SetInt(from.GetInt());
      break;
    case google::protobuf::FieldDescriptor::CPPTYPE_UINT32:
    case google::protobuf::FieldDescriptor::CPPTYPE_UINT64:
      to->SetUInt(from.GetUInt());
      break;
    case google::protobuf::FieldDescriptor::CPPTYPE_DOUBLE:
    case google::protobuf::FieldDescriptor::CPPTYPE_FLOAT:
      to->SetDouble(from.GetDouble());
      break;
    case google::protobuf::FieldDescriptor::CPPTYPE_BOOL:
      to->SetBool(from.GetBool());
      break;
    case google::protobuf::FieldDescriptor::CPPTYPE_ENUM:
      to->SetEnum(from.GetEnum());
      break;
    case google::protobuf::FieldDescriptor::CPPTYPE_STRING:
      to->SetString(from.GetString());
      break;
    case google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE:
      break;
  }
}

}  // namespace memest::fuzz

#endif  // MEMEST_FUZZ_FIELD_SLOT_H_
