// Files named by flags (certificates, keys, tokens), read whole but bounded: a regular file (a
// Kubernetes Secret's symlinks lead to one), never a FIFO that would block nor /dev/zero, and no
// more than a bound of it.
#ifndef MEMEST_SERVER_FLAG_FILE_H_
#define MEMEST_SERVER_FLAG_FILE_H_

#include <cstddef>
#include <string>

#include "engine/ir/status.h"

namespace memest {

// The file's contents, at most `max_bytes`; INVALID_ARGUMENT naming `flag` and the path for a
// file that is missing or unreadable, not regular, or larger.
StatusOr<std::string> ReadFlagFile(const char* flag, const std::string& path, size_t max_bytes);

}  // namespace memest

#endif  // MEMEST_SERVER_FLAG_FILE_H_
