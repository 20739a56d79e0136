#!/usr/bin/env bash
# Builds the Estimate fuzzer (fuzz/README.md) with clang, libFuzzer, AddressSanitizer and
# UndefinedBehaviorSanitizer into its own build directory, then fuzzes for the given time.
#
# Usage: bash scripts/fuzz.sh [seconds] [extra libFuzzer args...]
#   seconds  how long to fuzz (-max_total_time); default 60; 0 builds and replays the committed
#            inputs only
#   extra    passed to libFuzzer after the script's own, e.g. -fork=1 -ignore_crashes=1
#            -ignore_timeouts=1 -ignore_ooms=1 to keep going after a finding (long runs)
# Environment: FUZZ_BUILD_DIR (default build-fuzz), JOBS (parallel compile jobs),
#              MEMEST_FUZZ_CHECKS=0 (ignore broken checks of the answer; fuzz/README.md).
#
# Inputs: fuzz/corpus (the seeds) and fuzz/regressions are read, never written; inputs that
# reach new coverage are kept in $FUZZ_BUILD_DIR/corpus across runs. Each crash, timeout (10 s),
# out-of-memory (2 GiB) or leak is written to $FUZZ_BUILD_DIR/artifacts/ as crash-*, timeout-*,
# oom-*, leak-* (or slow-unit-*). Exit status: 0 when this run found nothing; 1 when it did (the
# new artifacts are listed); 2 when the build failed.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

readonly seconds="${1:-60}"
shift || true
readonly build_dir="${FUZZ_BUILD_DIR:-build-fuzz}"
readonly binary="${build_dir}/bin/memest-fuzz-estimate"
readonly artifacts="${build_dir}/artifacts"
readonly work_corpus="${build_dir}/corpus"

for tool in clang++; do
  if ! command -v "${tool}" >/dev/null 2>&1; then
    echo "fuzz: ${tool} not found; install clang and libclang-rt-14-dev" >&2
    exit 2
  fi
done

build_start=${SECONDS}
cmake -S . -B "${build_dir}" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_COMPILER=clang++ -DMEMEST_FUZZ=ON \
  -DMEMEST_WITH_CUDA=OFF -DMEMEST_BUILD_TESTS=OFF -DMEMEST_BUILD_BENCHMARKS=OFF >/dev/null ||
  exit 2
ninja -C "${build_dir}" ${JOBS:+-j "${JOBS}"} memest-fuzz-estimate || exit 2
echo "fuzz: built ${binary} in $((SECONDS - build_start)) s"

mkdir -p "${artifacts}" "${work_corpus}"
stamp="$(mktemp)"
trap 'rm -f "${stamp}"' EXIT

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:strict_string_checks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

if [[ "${seconds}" == 0 ]]; then
  # The committed inputs once each, under the sanitizers.
  mapfile -t inputs < <(find fuzz/corpus fuzz/regressions -type f ! -name '*.md' | sort)
  "${binary}" -rss_limit_mb=2048 -timeout=10 -artifact_prefix="${artifacts}/" "$@" "${inputs[@]}"
  status=$?
else
  # -max_len: room to grow the largest seed; the first directory receives new inputs.
  "${binary}" -max_total_time="${seconds}" -rss_limit_mb=2048 -timeout=10 -max_len=65536 \
    -print_final_stats=1 -artifact_prefix="${artifacts}/" "$@" \
    "${work_corpus}" fuzz/corpus fuzz/regressions
  status=$?
fi

mapfile -t found < <(find "${artifacts}" -type f -newer "${stamp}" | sort)
if [[ ${#found[@]} -gt 0 ]]; then
  echo "fuzz: ${#found[@]} finding(s) in this run (libFuzzer exit ${status}):"
  printf '  %s\n' "${found[@]}"
  echo "fuzz: reproduce with ${binary} FILE; minimize with ${binary} -minimize_crash=1 -runs=20000 FILE"
  exit 1
fi
if [[ ${status} -ne 0 ]]; then
  echo "fuzz: libFuzzer exited ${status} without an artifact" >&2
  exit 1
fi
echo "fuzz: no findings (corpus ${work_corpus}: $(find "${work_corpus}" -type f | wc -l) inputs)"
