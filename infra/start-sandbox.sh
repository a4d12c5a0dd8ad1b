#!/usr/bin/env bash
# Start the sandbox service bound to loopback (the default) from this checkout.
#   infra/start-sandbox.sh                      one node: executors on this machine, port 8080
#   PORT=8081 UID_BASE=210000 JOIN=http://127.0.0.1:8080 infra/start-sandbox.sh   a worker node joining a head
# Full isolation needs root (own uid per call, namespaces); otherwise it starts with warnings.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
args=(--host "${HOST:-127.0.0.1}" --port "${PORT:-8080}" --config "${CONFIG:-configs/sandbox.yaml}")
[ -n "${UID_BASE:-}" ] && args+=(--uid-base "$UID_BASE")
[ -n "${JOIN:-}" ] && args+=(--join "$JOIN")
exec .venv/bin/rstar sandbox serve "${args[@]}" --log-level "${LOG_LEVEL:-info}"
