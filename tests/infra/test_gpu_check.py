"""scripts/gpu-check.sh first checks the NVIDIA driver the lock's CUDA 13.0 packages need, in
one line, before it installs anything."""

import os
import shutil
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu-check.sh"


def run_with_driver(tmp_path, version: str | None) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if version:
        smi = bin_dir / "nvidia-smi"
        smi.write_text(f"#!/bin/sh\necho {version}\n")
        smi.chmod(0o755)
    # the fake nvidia-smi and the tools the check uses, nothing else (a real nvidia-smi of the
    # machine would answer instead)
    for tool in ("dirname", "sort", "head"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    env = {**os.environ, "PATH": str(bin_dir)}
    bash = shutil.which("bash")
    return subprocess.run([bash, str(SCRIPT)], env=env, capture_output=True, text=True)


def test_an_old_driver_is_named_before_anything_is_installed(tmp_path):
    run = run_with_driver(tmp_path, "570.86.15")
    assert run.returncode == 1
    assert run.stderr.strip().splitlines() == [
        "gpu-check: NVIDIA driver 570.86.15 is older than 580.65.06, which CUDA 13.0 (the GPU "
        "lock) needs"
    ]


def test_no_driver_at_all_is_one_line_too(tmp_path):
    run = run_with_driver(tmp_path, None)
    assert run.returncode == 1 and "finds no NVIDIA driver" in run.stderr
