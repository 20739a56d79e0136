#!/usr/bin/env bash
# Validates the Kubernetes manifests against Kubernetes' own schemas with kubernetes-validate
# (PyPI), strictly (an unknown field fails), for the oldest version the manifests support (1.29:
# the gRPC probe, autoscaling/v2, policy/v1) and the newest it knows: deploy/kubernetes/memest.yaml
# and webhook.yaml, and the TLS overlay deploy/kubernetes-tls as kustomize renders it (with
# `kubectl kustomize` where kubectl is installed; without it the overlay is reported unchecked).
#
# Usage: bash scripts/validate-manifests.sh   (needs PyPI the first time; a few seconds after)
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${BUILD_DIR:-build}/kvenv"
if [[ ! -x "${venv}/bin/kubernetes-validate" ]]; then
  /usr/bin/python3 -m venv "${venv}"
  "${venv}/bin/pip" install --quiet "kubernetes-validate==1.37.0"
fi
manifests=(deploy/kubernetes/memest.yaml deploy/kubernetes/webhook.yaml)
if command -v kubectl > /dev/null; then
  rendered="$(mktemp /tmp/memest-kustomize.XXXXXX.yaml)"
  trap 'rm -f "${rendered}"' EXIT
  kubectl kustomize deploy/kubernetes-tls 2> /dev/null > "${rendered}"
  grep -q -- "--tls-client-ca" "${rendered}" || { echo "validate-manifests: the TLS overlay lost its flags"; exit 1; }
  manifests+=("${rendered}")
else
  echo "validate-manifests: no kubectl: deploy/kubernetes-tls (a kustomize overlay) not rendered, not checked"
fi
for version in 1.29.0 1.37.0; do
  "${venv}/bin/kubernetes-validate" --strict --quiet -k "${version}" "${manifests[@]}"
done
echo "validate-manifests: ${#manifests[@]} manifests valid for Kubernetes 1.29 and 1.37"
