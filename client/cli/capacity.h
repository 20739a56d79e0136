// Parsing of device capacities given on the command line (--capacity).
#ifndef MEMEST_CLIENT_CLI_CAPACITY_H_
#define MEMEST_CLIENT_CLI_CAPACITY_H_

#include <cstdint>
#include <string_view>

#include "engine/ir/status.h"

namespace memest::cli {

// Parses a byte count: a plain integer ("85899345920"), or a number with a unit, binary
// ("80GiB", "24 GiB", "512MiB", "1.5TiB", also "80G" / "80Gi") or decimal ("80GB" = 80e9,
// "512MB"). Units are case-insensitive. Refuses negative, zero, fractional byte counts without
// a unit, and values beyond 2^62 bytes, with a message naming "--capacity".
StatusOr<int64_t> ParseCapacity(std::string_view text);

}  // namespace memest::cli

#endif  // MEMEST_CLIENT_CLI_CAPACITY_H_
