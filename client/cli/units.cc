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

std::string FormatBytes(int64_t bytes) {
  if (bytes < 0) return "-" + FormatBytes(bytes == INT64_MIN ? INT64_MAX : -bytes);
  if (bytes < 1024) return std::to_string(bytes) + " B";
  static const char* const kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double value = static_cast<double>(bytes) / 1024.0;
  int unit = 0;
  // Move up a unit before rounding could print "1024 KiB".
  while (value >= 999.5 && unit + 1 < static_cast<int>(std::size(kUnits))) {
    value /= 1024.0;
    ++unit;
  }
  return ThreeFigures(value) + " " + kUnits[unit];
}

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
