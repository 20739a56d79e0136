#!/usr/bin/env bash
# Installs the Debian 12 packages memest needs to build, test and benchmark.
#
# Usage: bash scripts/install-deps.sh [--test]
#
# Runs `apt-get update` once and installs the list below. When every package is already
# installed it says so and touches nothing. Works as root (containers, CI) and as a user with
# sudo. The Dockerfile's build stage runs this same script, so this list is the one place that
# names the build dependencies.
set -euo pipefail

# Keep in step with the runtime libraries in the Dockerfile's final stage.
readonly PACKAGES=(
  build-essential
  cmake
  ninja-build
  pkg-config
  libgrpc++-dev
  libabsl-dev
  libssl-dev
  prometheus-cpp-dev
  protobuf-compiler-grpc
  libprotobuf-dev
  protobuf-compiler
  libspdlog-dev
  libcli11-dev
  nlohmann-json3-dev
  libyaml-cpp-dev
  libgtest-dev
  libgmock-dev
  libbenchmark-dev
  libgoogle-perftools-dev
  python3
)
# With --test, also what the tests need beyond building: the conformance suite
# (tests/conformance) runs real PyTorch, Debian's 1.13, CPU only; the Python client
# (client/python, tests/python) is installed into a venv and tested with pytest, and its example
# notebook is executed with nbclient. The fuzzer (scripts/fuzz.sh) is built with clang, whose
# libFuzzer and sanitizer runtimes are in libclang-rt-14-dev. Slurm's controller, node daemon
# and commands run the job-submission hook's test (scripts/slurm-test.sh).
readonly TEST_PACKAGES=(
  clang
  libclang-rt-14-dev
  python3-torch
  python3-torchvision
  python3-venv
  python3-pip
  python3-setuptools
  python3-wheel
  python3-grpcio
  python3-protobuf
  python3-cryptography
  python3-pandas
  python3-matplotlib
  python3-pytest
  python3-pytest-asyncio
  python3-nbclient
  python3-nbformat
  python3-ipykernel
  slurmctld
  slurmd
  slurm-client
)

wanted=("${PACKAGES[@]}")
if [[ "${1:-}" == "--test" ]]; then
  wanted+=("${TEST_PACKAGES[@]}")
fi

missing=()
for package in "${wanted[@]}"; do
  status="$(dpkg-query -W -f='${db:Status-Status}' "${package}" 2>/dev/null || true)"
  if [[ "${status}" != "installed" ]]; then
    missing+=("${package}")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps: all ${#wanted[@]} packages already installed; skipping apt-get"
  exit 0
fi

if [[ "$(id -u)" -eq 0 ]]; then
  as_root=()
elif command -v sudo >/dev/null 2>&1; then
  as_root=(sudo)
else
  echo "install-deps: not root and sudo is not available; install as root:" >&2
  echo "  apt-get install ${missing[*]}" >&2
  exit 1
fi

echo "install-deps: installing ${missing[*]}"
"${as_root[@]}" apt-get update
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
  apt-get install -y --no-install-recommends "${wanted[@]}"
