#!/usr/bin/env bash
# Validates the Kubernetes manifests (deploy/kubernetes/*.yaml) against Kubernetes' own schemas
# with kubernetes-validate (PyPI), strictly (an unknown field fails), for the oldest version the
# manifests support (1.29: the gRPC probe, autoscaling/v2, policy/v1) and the newest it knows.
#
# Usage: bash scripts/validate-manifests.sh   (needs PyPI the first time; a few seconds after)
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${BUILD_DIR:-build}/kvenv"
if [[ ! -x "${venv}/bin/kubernetes-validate" ]]; then
  /usr/bin/python3 -m venv "${venv}"
  "${venv}/bin/pip" install --quiet "kubernetes-validate==1.37.0"
fi
for version in 1.29.0 1.37.0; do
  "${venv}/bin/kubernetes-validate" --strict --quiet -k "${version}" deploy/kubernetes/*.yaml
done
echo "validate-manifests: deploy/kubernetes/*.yaml valid for Kubernetes 1.29 and 1.37"
