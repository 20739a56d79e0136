#!/usr/bin/env bash
# Configures and builds memest with CMake and Ninja into build/; binaries land in build/bin
# (build/bin/memest-server, build/bin/memest, the test and benchmark binaries).
#
# Usage: bash scripts/build.sh [extra cmake -D options...]
# Environment: BUILD_DIR (default build), BUILD_TYPE (default RelWithDebInfo),
#              JOBS (parallel compile jobs; default: ninja's choice).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

readonly build_dir="${BUILD_DIR:-build}"
readonly build_type="${BUILD_TYPE:-RelWithDebInfo}"

cmake -S . -B "${build_dir}" -G Ninja -DCMAKE_BUILD_TYPE="${build_type}" "$@"
if [[ -n "${JOBS:-}" ]]; then
  ninja -C "${build_dir}" -j "${JOBS}"
else
  ninja -C "${build_dir}"
fi
