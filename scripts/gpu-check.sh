#!/usr/bin/env bash
# The cluster path on one GPU, for a machine that has one (never CI). It checks, and prints:
#   1. torch sees a GPU and vLLM imports (installing the project's `gpu` extra if it is missing);
#   2. two RL steps of verl's own trainer (`python -m rstar.train.verl_trainer`, RoC inside
#      verl's step) from the tiny SFT model, with vLLM rollouts, the project's agent loop, the
#      sandbox service and the answer-only reward: each step samples 2G rollouts per prompt and
#      keeps G, some rollouts earn reward 1, a checkpoint is written, verl's model merger makes a
#      Hugging Face model of it that loads and differs from the SFT model;
#   3. the same on the CPU path, for comparison (skip with GPU_CHECK_CPU=0).
# Exits non-zero on the first failure. Usage: bash scripts/gpu-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."

[ -x .venv/bin/python ] || bash scripts/setup.sh
PY=.venv/bin/python
echo "== 1. GPU and vLLM"
$PY -c "import torch; assert torch.cuda.is_available(), 'torch sees no GPU'; print('GPU:', torch.cuda.get_device_name(0), '| torch', torch.__version__)"
$PY -c "import vllm" 2>/dev/null || .venv/bin/pip install -q -e ".[gpu]"
$PY -c "import vllm; print('vLLM', vllm.__version__)"

echo "== 2. two verl steps on the GPU (vLLM rollouts), from the tiny SFT model"
$PY -m pytest -x -q -s -m gpu tests/train/test_verl_run.py -k gpu -p no:cacheprovider

if [ "${GPU_CHECK_CPU:-1}" = "1" ]; then
  echo "== 3. the same two steps on the CPU path"
  $PY -m pytest -x -q -s tests/train/test_verl_run.py -k cpu -p no:cacheprovider
fi
echo "gpu-check: every check passed"
