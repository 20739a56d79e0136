// The build's version, for every binary's --version: "memest-server 0.1.0 (commit 326baf9d1e2f)".
#ifndef MEMEST_VERSION_VERSION_H_
#define MEMEST_VERSION_VERSION_H_

#include <string>
#include <string_view>

namespace memest {

// "<program> <project version> (commit <git describe --always --dirty>)"; the commit reads
// "unknown" for a build outside a git checkout.
std::string VersionString(std::string_view program);

}  // namespace memest

#endif  // MEMEST_VERSION_VERSION_H_
