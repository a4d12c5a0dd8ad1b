#!/usr/bin/env bash
# The cluster path on one GPU, for a machine that has one (never CI). In an environment of its
# own (.venv-gpu) installed from the GPU workers' lock, constraints-gpu.txt, it checks:
#   1. torch sees a GPU, and torch, vLLM, transformers and verl are the lock's versions;
#   2. verl's SFT trainer trains the tiny base on the GPU (FSDP2), merged by verl's merger;
#   3. two RL steps of verl's own trainer (RoC inside verl's step) from the tiny SFT model with
#      vLLM rollouts, the project's agent loop, sandbox and reward, with the plan's own GPU
#      settings (rstar.train.gpu_sizing) scaled to this GPU;
#   4. evaluation on a vLLM engine replica (a Ray actor) behind the balanced scheduler.
# First the NVIDIA driver, which the lock's CUDA 13.0 packages need recent. Exits non-zero on the
# first failure. Usage: bash scripts/gpu-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."

# The lock's CUDA 13.0 packages need an NVIDIA driver 580.65.06 or later (docs/cluster.md)
NEED_DRIVER=580.65.06
driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1 || true)
if [ -z "$driver" ]; then
  echo "gpu-check: nvidia-smi finds no NVIDIA driver; the GPU lock needs $NEED_DRIVER or later" >&2
  exit 1
fi
if [ "$(printf '%s\n%s\n' "$NEED_DRIVER" "$driver" | sort -V | head -1)" != "$NEED_DRIVER" ]; then
  echo "gpu-check: NVIDIA driver $driver is older than $NEED_DRIVER, which CUDA 13.0 (the GPU lock) needs" >&2
  exit 1
fi
echo "NVIDIA driver $driver (the lock needs $NEED_DRIVER or later)"

if [ ! -x .venv-gpu/bin/python ]; then
  python3.11 -m venv .venv-gpu
  .venv-gpu/bin/python -m pip install -q --upgrade pip
  .venv-gpu/bin/python -m pip install -q -c constraints-gpu.txt -e ".[gpu,dev]"
fi
PY=.venv-gpu/bin/python
echo "== 1. GPU and the lock's versions"
$PY - <<'PY'
import importlib.metadata as md
import re

import torch

assert torch.cuda.is_available(), "torch sees no GPU"
lock = dict(
    line.split("==") for line in open("constraints-gpu.txt") if "==" in line and line[0] != "#"
)
for dist in ("torch", "vllm", "transformers", "verl"):
    have = md.version(dist)
    assert re.sub(r"\+.*", "", have) == lock[dist].strip(), f"{dist} {have}, the lock has {lock[dist]}"
    print(dist, have)
print("GPU:", torch.cuda.get_device_name(0))
PY
echo "== 2-4. SFT, two RL steps, evaluation on a vLLM replica: on the GPU"
$PY -m pytest -x -q -s -m gpu -p no:cacheprovider \
  tests/train/test_verl_sft.py tests/train/test_verl_run.py tests/rollout/test_vllm_engine.py
# the evaluation replicas' test takes the GPU wherever Ray has one
$PY -m pytest -x -q -s -p no:cacheprovider tests/rollout/test_ray_replicas.py -k vllm
echo "gpu-check: every check passed"
