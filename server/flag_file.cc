#include "server/flag_file.h"

#include <errno.h>
#include <sys/stat.h>

#include <cstring>
#include <fstream>

#include "engine/ir/text.h"

namespace memest {

StatusOr<std::string> ReadFlagFile(const char* flag, const std::string& path, size_t max_bytes) {
  struct stat info {};
  if (stat(path.c_str(), &info) != 0) {
    return InvalidArgument(std::string(flag) + ": cannot read " + Quote(path) + ": " +
                           std::strerror(errno));
  }
  if (!S_ISREG(info.st_mode)) {
    return InvalidArgument(std::string(flag) + ": " + Quote(path) + " is not a regular file");
  }
  std::ifstream file(path, std::ios::binary);
  if (!file) return InvalidArgument(std::string(flag) + ": cannot read " + Quote(path));
  std::string text(max_bytes + 1, '\0');
  file.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(file.gcount()));
  if (text.size() > max_bytes) {
    return InvalidArgument(std::string(flag) + ": " + Quote(path) + " is larger than " +
                           (max_bytes % (1 << 20) == 0 ? std::to_string(max_bytes >> 20) + " MiB"
                                                       : std::to_string(max_bytes) + " bytes"));
  }
  return text;
}

}  // namespace memest
