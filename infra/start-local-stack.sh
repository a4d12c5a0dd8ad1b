#!/usr/bin/env bash
# Start the service stack on this machine, every port bound to 127.0.0.1:
#   Prefect server (API + UI)      http://127.0.0.1:4200
#   MLflow server (SQLite + ./mlartifacts)  http://127.0.0.1:5000
#   S3-compatible store (moto)     http://127.0.0.1:9000   bucket: rstar
#   sandbox service                http://127.0.0.1:8080
#   Ray head                       127.0.0.1:6379 (capped to this machine's CPUs)
# PIDs go to infra/.stack/pids; infra/stop-local-stack.sh stops exactly those processes.
# Then point the pipeline at them with the environment printed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
STATE=infra/.stack
mkdir -p "$STATE"
: > "$STATE/pids"
start() {  # name, command...
  local name=$1; shift
  setsid "$@" > "$STATE/$name.log" 2>&1 &
  echo "$! $name" >> "$STATE/pids"
  echo "started $name (pid $!, log $STATE/$name.log)"
}
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=120 RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
start prefect .venv/bin/prefect server start --host 127.0.0.1 --port 4200
start mlflow .venv/bin/mlflow server --host 127.0.0.1 --port 5000 \
  --backend-store-uri "sqlite:///$PWD/$STATE/mlflow.db" --artifacts-destination "$PWD/mlartifacts"
start s3 .venv/bin/moto_server -H 127.0.0.1 -p 9000
start sandbox .venv/bin/rstar sandbox serve --host 127.0.0.1 --port 8080 --config configs/sandbox.yaml
start ray .venv/bin/ray start --head --block --node-ip-address 127.0.0.1 --port 6379 \
  --num-cpus "$(nproc)" --object-store-memory $((512 * 1024 * 1024)) --include-dashboard false
sleep 5
AWS_ACCESS_KEY_ID=stack AWS_SECRET_ACCESS_KEY=stack AWS_DEFAULT_REGION=us-east-1 \
  .venv/bin/python -c "import boto3; boto3.client('s3', endpoint_url='http://127.0.0.1:9000').create_bucket(Bucket='rstar')"
cat <<ENV

Use the stack from a shell:
  export PREFECT_API_URL=http://127.0.0.1:4200/api
  export MLFLOW_TRACKING_URI=http://127.0.0.1:5000
  export RAY_ADDRESS=127.0.0.1:6379 RAY_AUTH_MODE=token
  export RSTAR_S3_ENDPOINT_URL=http://127.0.0.1:9000 AWS_ACCESS_KEY_ID=stack AWS_SECRET_ACCESS_KEY=stack AWS_DEFAULT_REGION=us-east-1
  .venv/bin/rstar pipeline run --set storage_root=s3://rstar/tiny --set tracking.tracking_uri=\$MLFLOW_TRACKING_URI
  .venv/bin/rstar serve        # deployments: run the pipeline from the Prefect UI; nightly re-evaluation
ENV
