#!/usr/bin/env bash
# Regenerate constraints-gpu.txt: the GPU workers' environment (the library with vLLM, CUDA
# builds of torch 2.13.0), resolved for Linux x86_64 against constraints.txt's versions. It
# takes every pin of constraints.txt but five: fastapi (vLLM's GPU build caps it below 0.137;
# the workers never run Prefect, which needs 0.139), protobuf (< 7 for its CUDA kernel
# packages), triton and apache-tvm-ffi, which the CPU and GPU builds of vLLM pin apart, and
# tabulate, which reasoning-gym (CPU only, the `real` extra) pins to 0.9.0.
# uv reads wheel metadata only, so nothing CUDA is downloaded. Usage: bash scripts/lock-gpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."
shared=$(mktemp)
trap 'rm -f "$shared"' EXIT
grep -vE '^(fastapi|protobuf|triton|apache-tvm-ffi|tabulate)==' constraints.txt > "$shared"
.venv/bin/uv pip compile pyproject.toml --extra gpu --extra dev -c "$shared" --python-version 3.11 \
  --python-platform x86_64-manylinux_2_28 --no-header --no-annotate -q -o constraints-gpu.txt
sed -i '1i # The GPU workers'"'"' versions (scripts/lock-gpu.sh made it from constraints.txt; do not edit).' constraints-gpu.txt
