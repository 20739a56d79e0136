// Human-readable byte counts for the `memest` tables.
#ifndef MEMEST_CLIENT_CLI_UNITS_H_
#define MEMEST_CLIENT_CLI_UNITS_H_

#include <cstdint>
#include <string>

namespace memest::cli {

// Formats a byte count in binary units with three significant figures: "0 B", "512 B",
// "1.50 KiB", "23.4 MiB", "79.2 GiB", "1.20 TiB". Negative counts get a leading '-'.
std::string FormatBytes(int64_t bytes);

// Formats a count with a metric suffix: "124M", "6.74B", "950".
std::string FormatCount(int64_t count);

// Formats part/whole as a percentage with one decimal: "42.1%" ("-" when whole is 0).
std::string FormatPercent(int64_t part, int64_t whole);

}  // namespace memest::cli

#endif  // MEMEST_CLIENT_CLI_UNITS_H_
