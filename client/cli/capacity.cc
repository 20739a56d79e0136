#include "client/cli/capacity.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <string>

#include "engine/ir/shape.h"
#include "engine/ir/text.h"

namespace memest::cli {
namespace {

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Bytes per unit, or 0 for an unknown unit.
double UnitBytes(const std::string& unit) {
  struct Entry {
    const char* name;
    double bytes;
  };
  static const Entry kUnits[] = {
      {"", 1},          {"b", 1},
      {"k", 1024.0},    {"ki", 1024.0},    {"kib", 1024.0},    {"kb", 1e3},
      {"m", 1048576.0}, {"mi", 1048576.0}, {"mib", 1048576.0}, {"mb", 1e6},
      {"g", 1073741824.0}, {"gi", 1073741824.0}, {"gib", 1073741824.0}, {"gb", 1e9},
      {"t", 1099511627776.0}, {"ti", 1099511627776.0}, {"tib", 1099511627776.0}, {"tb", 1e12},
  };
  for (const Entry& e : kUnits) {
    if (unit == e.name) return e.bytes;
  }
  return 0;
}

}  // namespace

StatusOr<int64_t> ParseCapacity(std::string_view text) {
  const std::string field = "--capacity";
  const std::string input(text);
  const char* begin = input.c_str();
  char* end = nullptr;
  errno = 0;
  const double number = std::strtod(begin, &end);
  if (end == begin || errno != 0 || !std::isfinite(number)) {
    return InvalidArgument(field + ": expected a byte count such as 85899345920 or 80GiB, got \"" +
                           Escape(input) + "\"");
  }
  std::string unit = Lower(std::string_view(end));
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  const double unit_bytes = UnitBytes(unit);
  if (unit_bytes == 0) {
    return InvalidArgument(field + ": unknown unit \"" + Escape(unit) +
                           "\" (use B, KiB, MiB, GiB, TiB, or KB, MB, GB, TB)");
  }
  const double bytes = number * unit_bytes;
  if (bytes <= 0) {
    return InvalidArgument(field + ": must be positive, got \"" + Escape(input) + "\"");
  }
  if (bytes > static_cast<double>(kMaxBytes)) {
    return InvalidArgument(field + ": larger than 2^62 bytes: \"" + Escape(input) + "\"");
  }
  if (unit_bytes == 1 && bytes != std::floor(bytes)) {
    return InvalidArgument(field + ": a byte count must be whole, got \"" + Escape(input) + "\"");
  }
  return static_cast<int64_t>(std::llround(bytes));
}

}  // namespace memest::cli
