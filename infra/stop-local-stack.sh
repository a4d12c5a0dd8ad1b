#!/usr/bin/env bash
# Stop the processes infra/start-local-stack.sh started (their process groups), nothing else.
set -euo pipefail
cd "$(dirname "$0")/.."
PIDS=infra/.stack/pids
[ -f "$PIDS" ] || { echo "nothing started"; exit 0; }
while read -r pid name; do
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid"
    echo "stopped $name (pid $pid)"
  fi
done < "$PIDS"
rm -f "$PIDS"
