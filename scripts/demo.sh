#!/usr/bin/env bash
# The README's first command: installs the Debian packages, builds, starts memest-server on a
# free localhost port, asks it how much memory one training step of GPT-2 small takes
# (batch 8, sequence 1024, AdamW, bf16 autocast) on an A100 80GB, prints the table, and stops
# the server.
#
# Usage: bash scripts/demo.sh
# Exit status: that of the `memest estimate` query (0 = fits; see README "Exit codes").
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/install-deps.sh
bash scripts/build.sh

readonly server_log="$(mktemp -t memest-server.XXXXXX.log)"
build/bin/memest-server --address 127.0.0.1:0 >"${server_log}" 2>&1 &
readonly server_pid=$!

# Stops the server (SIGTERM: it drains and exits) and removes its log.
stop_server() {
  if kill -0 "${server_pid}" 2>/dev/null; then
    kill -TERM "${server_pid}" 2>/dev/null || true
    wait "${server_pid}" 2>/dev/null || true
  fi
  rm -f "${server_log}"
}
trap stop_server EXIT

# The server prints "memest-server listening on 127.0.0.1:PORT" once it is serving.
port=""
for _ in $(seq 1 100); do
  port="$(sed -n 's/.*memest-server listening on 127\.0\.0\.1:\([0-9][0-9]*\).*/\1/p' \
    "${server_log}" | head -n 1)"
  [[ -n "${port}" ]] && break
  if ! kill -0 "${server_pid}" 2>/dev/null; then
    echo "demo: memest-server exited before listening; its log:" >&2
    cat "${server_log}" >&2
    exit 1
  fi
  sleep 0.1
done
if [[ -z "${port}" ]]; then
  echo "demo: memest-server did not report its port within 10 s; its log:" >&2
  cat "${server_log}" >&2
  exit 1
fi
echo "demo: memest-server listening on 127.0.0.1:${port}"
echo

query=(build/bin/memest estimate --server "127.0.0.1:${port}"
  --preset gpt2-small --batch 8 --seq 1024 --optimizer adamw --precision bf16
  --device a100-80gb)
echo "\$ ${query[*]}"
status=0
"${query[@]}" || status=$?

exit "${status}"  # the EXIT trap stops the server
