// Human-readable byte counts for the `memest` tables.
#ifndef MEMEST_CLIENT_CLI_UNITS_H_
#define MEMEST_CLIENT_CLI_UNITS_H_

#include <cstdint>
#include <string>

#include "engine/report/report.h"

namespace memest::cli {

// Byte counts as the engine formats them in its own messages (engine/report/report.h).
using ::memest::FormatBytes;

// Formats a count with a metric suffix: "124M", "6.74B", "950".
std::string FormatCount(int64_t count);

// Formats part/whole as a percentage with one decimal: "42.1%" ("-" when whole is 0).
std::string FormatPercent(int64_t part, int64_t whole);

}  // namespace memest::cli

#endif  // MEMEST_CLIENT_CLI_UNITS_H_
