// The `memest` binary as the CLI tests run it (MEMEST_CLI_PATH, set by tests/cli/CMakeLists.txt),
// and the JSON mapping's 64-bit integers, which it prints as strings or numbers.
#ifndef MEMEST_TESTS_CLI_MEMEST_COMMAND_H_
#define MEMEST_TESTS_CLI_MEMEST_COMMAND_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/cli/subprocess.h"

namespace memest {

// `memest <args...>`, run to completion.
inline testing::RunResult Memest(std::vector<std::string> args) {
  args.insert(args.begin(), MEMEST_CLI_PATH);
  return testing::Run(args);
}

// JSON mapping: uint64 fields are strings, int64 fields strings too; accept either.
inline int64_t JsonInt(const nlohmann::json& value) {
  if (value.is_string()) return std::stoll(value.get<std::string>());
  return value.get<int64_t>();
}

}  // namespace memest

#endif  // MEMEST_TESTS_CLI_MEMEST_COMMAND_H_
