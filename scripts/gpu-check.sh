#!/usr/bin/env bash
# On a machine with a GPU: builds memest with CUDA, runs the GPU tests (ctest label gpu), a
# validation of every three-way configuration, and the same models in PyTorch on the GPU; then
# regenerates docs/validation.md from what it measured; and records real models' steps on the
# GPU for tests/validation/cuda_compare.py (tests/validation/cuda_record.py). Logs and the raw
# rows go to OUT_DIR.
#
# Usage: bash scripts/gpu-check.sh
# Environment: BUILD_DIR (default build), OUT_DIR (default build/gpu-check), PYTHON (a python
#              with PyTorch and CUDA; default python3), PREBUILT=1 (BUILD_DIR is an unpacked
#              scripts/gpu-bundle.sh archive, for a machine that cannot build memest: no build,
#              and the GPU tests run from the bundle instead of ctest).
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
readonly build_dir="${BUILD_DIR:-build}"
readonly out="${OUT_DIR:-${build_dir}/gpu-check}"
readonly python="${PYTHON:-python3}"
mkdir -p "${out}"

failed=()
nvidia-smi > "${out}/nvidia-smi.txt" 2>&1 || true
if [[ "${PREBUILT:-0}" == 1 ]]; then
  "${build_dir}/bin/kernels_gpu_test" --gtest_filter='-WorkCheckTest.*' > "${out}/ctest-gpu.log" 2>&1 ||
    failed+=("gpu tests")
else
  bash scripts/build.sh -DMEMEST_WITH_CUDA=ON > "${out}/build.log" 2>&1 || { tail -40 "${out}/build.log"; exit 1; }
  ctest --test-dir "${build_dir}" -L gpu --output-on-failure > "${out}/ctest-gpu.log" 2>&1 || failed+=("gpu tests")
fi
tail -5 "${out}/ctest-gpu.log"
"${python}" tests/validation/three_way.py --build "${build_dir}" --json "${out}/three_way.json" \
  > "${out}/three_way.log" 2>&1 || failed+=("three-way validation")
tail -15 "${out}/three_way.log"
cp docs/validation.md "${out}/validation.md"
# shellcheck disable=SC2086  # CUDA_RECORD_ARGS: more arguments for it (--no-trace, --only ...)
"${python}" tests/validation/cuda_record.py --out "${out}/cuda-record" ${CUDA_RECORD_ARGS:-} > "${out}/cuda-record.log" 2>&1 ||
  failed+=("cuda record")
cat "${out}/cuda-record.log"

if [[ ${#failed[@]} -gt 0 ]]; then
  echo "gpu-check: FAILED: ${failed[*]} (logs in ${out})"
  exit 1
fi
echo "gpu-check: passed (logs in ${out})"
