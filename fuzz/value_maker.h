// The values the fuzzers' mutator (proto_mutator.h) puts into fields: the edges code gets wrong
// (0, -1, powers of two and their neighbours, 2^31, 2^62, INT64_MAX and MIN; NaN, infinities,
// denormals; empty, huge and odd strings, with newlines, NUL or invalid UTF-8), small values that
// make a request valid, words from a dictionary or from the message itself, and perturbations of
// the current value. All arithmetic is unsigned, so making a value is never undefined behaviour.
#ifndef MEMEST_FUZZ_VALUE_MAKER_H_
#define MEMEST_FUZZ_VALUE_MAKER_H_

#include <google/protobuf/descriptor.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace memest::fuzz {

struct MutatorOptions {
  // Words a string field may be set to (besides the strings the message holds already).
  std::vector<std::string> dictionary;
  // Longest string the mutator makes up; a message's serialized size is the caller's to bound.
  size_t max_string_length = 4096;
  // Strings that are not UTF-8 (proto3 refuses them when parsing: they test the parser only).
  bool invalid_utf8 = true;
};

// Well-formed UTF-8 as protobuf checks it: no overlong forms, no surrogates, nothing past
// U+10FFFF.
bool IsUtf8(const std::string& s);

class ValueMaker {
 public:
  // Both must outlive the ValueMaker.
  ValueMaker(std::mt19937_64* rng, const MutatorOptions* options);

  // A new value for a field holding `current`. Int: within [min, max] (an int32 field passes
  // its limits: the value keeps the low 32 bits). Unsigned: max is UINT32_MAX or UINT64_MAX.
  int64_t Int(int64_t current, int64_t min, int64_t max);
  uint64_t Unsigned(uint64_t current, uint64_t max);
  double Double(double current);
  // A number of the field's enum three times in four, else one it does not define.
  int Enum(const google::protobuf::FieldDescriptor* field, int current);
  // `strings`: the message's own strings, so that a name can refer to another one.
  std::string String(const std::string& current, const std::vector<std::string>& strings);

 private:
  size_t Below(size_t n) { return n == 0 ? 0 : static_cast<size_t>((*rng_)() % n); }
  bool OneIn(size_t n) { return Below(n) == 0; }

  std::mt19937_64* rng_;
  const MutatorOptions* options_;
};

}  // namespace memest::fuzz

#endif  // MEMEST_FUZZ_VALUE_MAKER_H_
