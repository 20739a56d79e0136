#!/usr/bin/env bash
# On a machine with a GPU: builds memest with CUDA, runs the GPU tests (ctest label gpu), a
# validation of every three-way configuration, and the same models in PyTorch on the GPU; then
# regenerates docs/validation.md from what it measured. Logs and the raw rows go to OUT_DIR.
#
# Usage: bash scripts/gpu-check.sh
# Environment: BUILD_DIR (default build), OUT_DIR (default build/gpu-check), PYTHON (a python
#              with PyTorch and CUDA; default python3).
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
readonly build_dir="${BUILD_DIR:-build}"
readonly out="${OUT_DIR:-${build_dir}/gpu-check}"
readonly python="${PYTHON:-python3}"
mkdir -p "${out}"

failed=()
nvidia-smi > "${out}/nvidia-smi.txt" 2>&1 || true
bash scripts/build.sh -DMEMEST_WITH_CUDA=ON > "${out}/build.log" 2>&1 || { tail -40 "${out}/build.log"; exit 1; }
ctest --test-dir "${build_dir}" -L gpu --output-on-failure > "${out}/ctest-gpu.log" 2>&1 || failed+=("gpu tests")
tail -5 "${out}/ctest-gpu.log"
"${python}" tests/validation/three_way.py --build "${build_dir}" --json "${out}/three_way.json" \
  > "${out}/three_way.log" 2>&1 || failed+=("three-way validation")
tail -15 "${out}/three_way.log"
cp docs/validation.md "${out}/validation.md"

if [[ ${#failed[@]} -gt 0 ]]; then
  echo "gpu-check: FAILED: ${failed[*]} (logs in ${out})"
  exit 1
fi
echo "gpu-check: passed (logs in ${out})"
