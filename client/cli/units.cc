#include "client/cli/units.h"

#include <cmath>
#include <cstdio>

namespace memest::cli {
namespace {

// Three significant figures: 1.23, 12.3, 123.
std::string ThreeFigures(double value) {
  char buf[32];
  if (value < 10) {
    std::snprintf(buf, sizeof(buf), "%.2f", value);
  } else if (value < 100) {
    std::snprintf(buf, sizeof(buf), "%.1f", value);
  } else {
    std::snprintf(buf, sizeof(buf), "%.0f", value);
  }
  return buf;
}

}  // namespace

std::string FormatCount(int64_t count) {
  if (count < 0) return "-" + FormatCount(-count);
  if (count < 1000) return std::to_string(count);
  static const char* const kSuffixes[] = {"K", "M", "B", "T"};
  double value = static_cast<double>(count) / 1000.0;
  int suffix = 0;
  while (value >= 999.5 && suffix + 1 < static_cast<int>(std::size(kSuffixes))) {
    value /= 1000.0;
    ++suffix;
  }
  return ThreeFigures(value) + kSuffixes[suffix];
}

std::string FormatPercent(int64_t part, int64_t whole) {
  if (whole == 0) return "-";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f%%",
                100.0 * static_cast<double>(part) / static_cast<double>(whole));
  return buf;
}

}  // namespace memest::cli
