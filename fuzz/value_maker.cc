#include "fuzz/value_maker.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>

namespace memest::fuzz {
namespace {

using google::protobuf::EnumDescriptor;
using google::protobuf::FieldDescriptor;

// Values that sit on the edges code gets wrong: signs, powers of two and their neighbours, the
// limits of 32, 53, 62 and 64 bits.
// clang-format off
constexpr int64_t kInterestingInts[] = {
    0, 1, -1, 2, 3, 4, 7, 8, 12, 16, 31, 32, 63, 64, 100, 127, 128, 255, 256, 512, 1000, 1023,
    1024, 4096, 65535, 65536, int64_t{1} << 20, int64_t{1} << 24,
    std::numeric_limits<int32_t>::max(), int64_t{1} << 31, std::numeric_limits<int32_t>::min(),
    std::numeric_limits<uint32_t>::max(), int64_t{1} << 32, int64_t{1} << 40, int64_t{1} << 53,
    int64_t{1} << 61, (int64_t{1} << 62) - 1, int64_t{1} << 62, (int64_t{1} << 62) + 1,
    std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min(),
    std::numeric_limits<int64_t>::min() + 1, -(int64_t{1} << 31), -(int64_t{1} << 62)};

const double kInterestingDoubles[] = {
    0.0, -0.0, 1.0, -1.0, 0.5, 0.1, 0.9999999, 2.0, 1e-300, 1e300,
    std::numeric_limits<double>::max(), -std::numeric_limits<double>::max(),
    std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
    std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::denorm_min(),
    9223372036854775808.0, -9223372036854775808.0, 18446744073709551616.0, 4294967296.0};

const char* const kSpecialStrings[] = {
    "a\nb", "\r\n", "%s%n%x", "{}", "\"", "\\", " ", "-1", "1e9", "NaN", "../../etc/passwd",
    "\xc3\xbc\xe6\xbc\xa2\xe5\xad\x97\xf0\x9f\x99\x82", "h.0", "0", "."};
const char* const kInvalidUtf8[] = {
    "\xff\xfe", "\xc3", "\xed\xa0\x80", "a\x80z", "\xf8\x88\x80\x80\x80"};
// clang-format on

}  // namespace

bool IsUtf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t extra;
    if (c < 0x80) {
      extra = 0;
    } else if (c >= 0xc2 && c <= 0xdf) {
      extra = 1;
    } else if ((c & 0xf0) == 0xe0) {
      extra = 2;
    } else if (c >= 0xf0 && c <= 0xf4) {
      extra = 3;
    } else {
      return false;
    }
    if (extra == 0) {
      ++i;
      continue;
    }
    if (s.size() - i <= extra) return false;
    for (size_t k = 1; k <= extra; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xc0) != 0x80) return false;
    }
    const auto next = static_cast<unsigned char>(s[i + 1]);
    if ((c == 0xe0 && next < 0xa0) || (c == 0xed && next >= 0xa0) || (c == 0xf0 && next < 0x90) ||
        (c == 0xf4 && next >= 0x90)) {
      return false;
    }
    i += extra + 1;
  }
  return true;
}

ValueMaker::ValueMaker(std::mt19937_64* rng, const MutatorOptions* options)
    : rng_(rng), options_(options) {}

int64_t ValueMaker::Int(int64_t current, int64_t min, int64_t max) {
  // Arithmetic in uint64_t: wrapping is what we want, and it is defined.
  const auto u = static_cast<uint64_t>(current);
  uint64_t v;
  switch (Below(8)) {
    case 0:
    case 1:
    case 2: {
      std::vector<int64_t> in_range;
      for (int64_t x : kInterestingInts) {
        if (x >= min && x <= max) in_range.push_back(x);
      }
      v = static_cast<uint64_t>(in_range[Below(in_range.size())]);
      break;
    }
    case 3:
    case 4:
      v = static_cast<uint64_t>(static_cast<int64_t>(Below(72)) - 8);  // small: -8 .. 63
      break;
    case 5:
      v = u + (OneIn(2) ? 1 : uint64_t(0) - 1) * (1 + Below(16));
      break;
    case 6:
      switch (Below(5)) {
        case 0:
          v = u * 2;
          break;
        case 1:
          v = static_cast<uint64_t>(current / 2);
          break;
        case 2:
          v = uint64_t(0) - u;
          break;
        case 3:
          v = u * 3 + 1;
          break;
        default:
          v = u ^ (uint64_t{1} << Below(64));
          break;
      }
      break;
    default:
      v = (*rng_)();
      break;
  }
  if (min == std::numeric_limits<int64_t>::min()) return static_cast<int64_t>(v);
  return static_cast<int32_t>(static_cast<uint32_t>(v));
}

uint64_t ValueMaker::Unsigned(uint64_t current, uint64_t max) {
  static constexpr uint64_t kInteresting[] = {0,
                                              1,
                                              2,
                                              255,
                                              4096,
                                              uint64_t{1} << 30,
                                              uint64_t{1} << 31,
                                              uint64_t{1} << 32,
                                              uint64_t{80} << 30,
                                              uint64_t{1} << 40,
                                              (uint64_t{1} << 62) - 1,
                                              uint64_t{1} << 62,
                                              (uint64_t{1} << 62) + 1,
                                              uint64_t{1} << 63,
                                              std::numeric_limits<uint64_t>::max()};
  uint64_t v;
  switch (Below(5)) {
    case 0:
    case 1:
      v = kInteresting[Below(std::size(kInteresting))];
      break;
    case 2:
      v = Below(64);
      break;
    case 3:
      v = OneIn(2) ? current * 2 : current / 2 + (OneIn(2) ? 1 : 0);
      break;
    default:
      v = (*rng_)();
      break;
  }
  return max == std::numeric_limits<uint64_t>::max() ? v : static_cast<uint32_t>(v);
}

double ValueMaker::Double(double current) {
  switch (Below(4)) {
    case 0:
    case 1:
      return kInterestingDoubles[Below(std::size(kInterestingDoubles))];
    case 2:
      return static_cast<double>(Below(1000)) / 1000.0;
    default:
      switch (Below(4)) {
        case 0:
          return current * 2;
        case 1:
          return current / 2;
        case 2:
          return -current;
        default:
          return current + 1;
      }
  }
}

int ValueMaker::Enum(const FieldDescriptor* field, int current) {
  const EnumDescriptor* e = field->enum_type();
  if (!OneIn(4) && e->value_count() > 0) {
    return e->value(static_cast<int>(Below(e->value_count())))->number();
  }
  const int odd[] = {-1,
                     e->value_count(),
                     99,
                     std::numeric_limits<int32_t>::max(),
                     std::numeric_limits<int32_t>::min(),
                     static_cast<int>(static_cast<uint32_t>(current) + 1u)};
  return odd[Below(std::size(odd))];
}

std::string ValueMaker::String(const std::string& current,
                               const std::vector<std::string>& strings) {
  std::string s;
  switch (Below(12)) {
    case 0:
    case 1:
    case 2:
    case 3:
      if (!options_->dictionary.empty()) {
        s = options_->dictionary[Below(options_->dictionary.size())];
        break;
      }
      [[fallthrough]];
    case 4:
    case 5:
    case 6:
      if (!strings.empty()) s = strings[Below(strings.size())];
      break;
    case 7:
      s = "";
      break;
    case 8: {  // an edit of the current value
      s = current;
      switch (Below(4)) {
        case 0:
          s += static_cast<char>('a' + Below(26));
          break;
        case 1:
          s += "." + std::to_string(Below(16));
          break;
        case 2:
          s = s.substr(0, Below(s.size() + 1));
          break;
        default:
          s += s;
          break;
      }
      break;
    }
    case 9: {  // long
      const size_t lengths[] = {256, 1024, 4096, options_->max_string_length};
      const size_t length =
          std::min(lengths[Below(std::size(lengths))], options_->max_string_length);
      const std::string unit = current.empty() ? std::string("x") : current;
      while (s.size() < length) s += unit;
      s.resize(length);
      break;
    }
    case 10:
      s = OneIn(4) ? std::string("a\0b", 3) : kSpecialStrings[Below(std::size(kSpecialStrings))];
      break;
    default:
      if (options_->invalid_utf8) {
        s = current + kInvalidUtf8[Below(std::size(kInvalidUtf8))];
      } else {
        s = current + "\n";
      }
      break;
  }
  if (s.size() > options_->max_string_length) s.resize(options_->max_string_length);
  if (!options_->invalid_utf8 && !IsUtf8(s)) s.clear();
  return s;
}

}  // namespace memest::fuzz
