#!/usr/bin/env bash
# The README's second command (and what .ci/run runs): installs the Debian packages, builds
# everything, and runs every test. Each section below is one suite; a failing section fails
# the script, after all sections have run.
#
# Usage: bash scripts/test.sh
# Environment: BUILD_DIR (default build), as for scripts/build.sh.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

failed=()

section() { echo; echo "==== $* ===="; }

section "dependencies"
bash scripts/install-deps.sh --test || exit 1

section "build"
bash scripts/build.sh || exit 1

# C++ tests: engine (table-driven), validate (the replay on a fake device), kernels (label
# gpu: they skip without a GPU), server (end to end over gRPC on port 0, Validate through a
# fake-device worker), cli (the `memest` binary, locally and against a real server).
section "ctest"
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure || failed+=("ctest")

# The Estimate fuzzer (fuzz/README.md) for a minute: clang with libFuzzer, ASan and UBSan builds
# it into build-fuzz/ (about a minute on 2 cores), then it mutates requests from fuzz/corpus.
# A crash, a sanitizer report, a broken check of the answer, a timeout (10 s) or more than 2 GiB
# fails the section; the input is in build-fuzz/artifacts/.
section "fuzz"
bash scripts/fuzz.sh 60 || failed+=("fuzz")

# The conformance suite: memest (--runtime cpu-1.13) against real PyTorch 1.13 on the CPU
# (Debian's python3-torch, hence /usr/bin/python3), case by case; writes build/conformance.json
# and regenerates docs/fidelity.md.
section "conformance"
/usr/bin/python3 tests/conformance/run.py --report "${BUILD_DIR:-build}/conformance.json" || failed+=("conformance")
# The cases with convolutions again with oneDNN capped at AVX2: their scratch depends on the
# CPU's vector ISA, and memest models both (--cpu-isa).
for k in conv resnet unet; do
  /usr/bin/python3 tests/conformance/run.py -k "${k}" --onednn-max-isa AVX2 || failed+=("conformance ${k} on AVX2")
done

# The per-rank truth of data, tensor and pipeline parallelism (tests/parallel): 2 and 4 gloo
# ranks of PyTorch 1.13 on the CPU, every rank measured and compared with
# tests/parallel/expected/ (docs/parallelism-truth.md); then memest's estimate of every DDP and
# ZeroRedundancyOptimizer case against the rank it estimates, and of every pipeline case's
# stages against each stage (docs/parallelism.md, "Checked").
section "parallel"
/usr/bin/python3 tests/parallel/run.py --memest "${BUILD_DIR:-build}/bin/memest" || failed+=("parallel")
# memest's DeepSpeed ZeRO-3 against DeepSpeed 0.16.0 measured by hand on the CPU
# (tests/parallel/zero3.py; the expected files are read, no PyTorch is needed).
/usr/bin/python3 tests/parallel/zero3_compare.py --check --memest "${BUILD_DIR:-build}/bin/memest" \
    || failed+=("parallel zero3")
# memest's DTensor tensor parallelism against PyTorch 2.15's DTensor measured by hand on the CPU
# (tests/parallel/dtensor_tp.py; the expected files are read, no PyTorch is needed).
/usr/bin/python3 tests/parallel/dtensor_compare.py --check --memest "${BUILD_DIR:-build}/bin/memest" \
    || failed+=("parallel dtensor")

# The Python client (client/python): installed into a venv that sees Debian's grpcio,
# protobuf, pandas and matplotlib (no network), then pytest against a real memest-server on
# port 0.
section "python"
pyenv="${BUILD_DIR:-build}/pyenv"
# The model zoo also needs Hugging Face transformers, from PyPI: 4.47.1 is the last release
# whose models run on PyTorch 1.13 (4.48 requires torch >= 2.0); it pulls no torch. PEFT 0.13.2
# (with accelerate 1.1.1, which it needs) is the truth for LoRA (tests/python/test_lora.py):
# without their dependencies, which transformers' cover, since Debian's torch calls itself
# 1.13.0a0, below their torch>=1.13, and pip would fetch a CUDA torch 2.x of gigabytes.
if /usr/bin/python3 -m venv --system-site-packages "${pyenv}" &&
    "${pyenv}/bin/pip" install --quiet --no-build-isolation --no-deps ./client/python &&
    "${pyenv}/bin/pip" install --quiet --no-deps "grpcio-health-checking==1.51.1" &&
    "${pyenv}/bin/pip" install --quiet "transformers==4.47.1" &&
    "${pyenv}/bin/pip" install --quiet --no-deps "peft==0.13.2" "accelerate==1.1.1"; then
  MEMEST_SERVER="${BUILD_DIR:-build}/bin/memest-server" \
    "${pyenv}/bin/python" -m pytest tests/python -q || failed+=("python")
  # The conformance cases again, each traced by memest.trace instead of written by hand.
  "${pyenv}/bin/python" tests/conformance/run.py --via-tracer || failed+=("conformance via the tracer")
  # The model zoo's representative subset (tests/conformance/zoo_models.py, ci=True): real
  # torchvision, Hugging Face, nn.Transformer, RNN and UNet models traced by memest.trace and
  # measured by real PyTorch. The whole zoo: tests/conformance/zoo.py without --ci.
  "${pyenv}/bin/python" tests/conformance/zoo.py --ci --quiet --report "${BUILD_DIR:-build}/zoo-ci.json" ||
    failed+=("model zoo")
  # The example notebook, top to bottom, against a real server (memest.serve()).
  MEMEST_SERVER="$(pwd)/${BUILD_DIR:-build}/bin/memest-server" PYDEVD_DISABLE_FILE_VALIDATION=1 \
    "${pyenv}/bin/python" -Xfrozen_modules=off tests/python/run_notebook.py \
    client/python/examples/memest_tour.ipynb || failed+=("notebook")
else
  failed+=("python")
fi

# The package as a user installs it: an sdist, built and installed without protoc (grpcio-tools
# and the runtime dependencies from PyPI), used against a real server.
section "python package"
bash scripts/python-package-test.sh || failed+=("python package")

# The three-way validation's PyTorch models: the same parameters and buffers as memest's
# presets, and a training step that runs (on the CPU here; the GPU run is scripts/gpu-check.sh).
section "validation models"
/usr/bin/python3 -m pytest tests/validation -q || failed+=("validation models")

# The Kubernetes manifests against Kubernetes' schemas (kubernetes-validate).
section "manifests"
bash scripts/validate-manifests.sh || failed+=("manifests")

# The Slurm job-submission hook (deploy/slurm/job_submit.lua) against a real slurmctld and
# slurmd from Debian's packages and a real memest-server (docs/slurm.md); needs root.
section "slurm"
bash scripts/slurm-test.sh || failed+=("slurm")

# Later suites go here as their own sections.

echo
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "test: FAILED sections: ${failed[*]}"
  exit 1
fi
echo "test: all sections passed"
