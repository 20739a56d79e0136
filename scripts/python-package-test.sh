#!/usr/bin/env bash
# The Python package as a user gets it: an sdist built from the checkout, installed from it into
# a clean venv (no Debian packages, no protoc on the way: its gRPC stubs come from grpcio-tools,
# a build requirement pip fetches from PyPI, and grpcio, protobuf and grpcio-health-checking from
# PyPI too), then used against a real memest-server: memest.serve() waits for health through
# grpcio-health-checking, and a Client estimates.
#
# Usage: bash scripts/python-package-test.sh   (needs PyPI; about a minute)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${BUILD_DIR:-build}"
work="$(mktemp -d /tmp/memest-pypkg.XXXXXX)"
trap 'rm -rf "${work}"' EXIT

/usr/bin/python3 -m venv "${work}/venv"
py="${work}/venv/bin/python"
"${py}" -m pip install --quiet --upgrade pip build
# No protoc and no gRPC plugin: the build must use grpcio-tools.
export PROTOC=/nonexistent/protoc GRPC_PYTHON_PLUGIN=/nonexistent/grpc_python_plugin
"${py}" -m build --sdist --outdir "${work}/dist" client/python > "${work}/build.log" 2>&1 ||
  { cat "${work}/build.log"; exit 1; }
sdist="$(ls "${work}"/dist/memest-*.tar.gz)"
listing="$(tar -tzf "${sdist}")"
grep -q "proto/memest/v1/memest.proto" <<< "${listing}" ||
  { echo "python-package-test: the sdist lacks the proto"; exit 1; }
(cd "${work}" && "${py}" -m pip install --quiet "${sdist}")
MEMEST_SERVER="$(pwd)/${BUILD_DIR}/bin/memest-server" "${py}" - <<'PY'
import grpc_health, memest
from memest.v1 import memest_pb2
print("python-package-test: memest from", memest.__file__)
with memest.serve(args=["--log-level", "warn"]) as server:
    with memest.Client(server) as client:
        estimate = client.estimate(preset="gpt2-small", seq=64)
        assert estimate.peak.allocated_bytes > 0, estimate
        print("python-package-test: gpt2-small, seq 64:", estimate.peak.allocated_bytes, "bytes")
PY
"${py}" -c 'import importlib.metadata as m; print("python-package-test: requires", m.requires("memest"))'
echo "python-package-test: passed"
