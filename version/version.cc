#include "version/version.h"

#include "version/commit.h"

namespace memest {

std::string VersionString(std::string_view program) {
  return std::string(program) + " " MEMEST_VERSION " (commit " MEMEST_COMMIT ")";
}

}  // namespace memest
