"""The GPU workers' lock (constraints-gpu.txt) resolves with the project's requirements on the
platform the workers run (Linux x86_64, CUDA builds from PyPI), and shares constraints.txt's
versions but the five pinned apart (DIFFERENT says why). uv reads the wheels' metadata only:
nothing CUDA is downloaded (about 55 MB of metadata on a fresh cache)."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
UV = Path(sys.executable).with_name("uv")
# vLLM 0.27.1's GPU build caps fastapi below 0.137 (the CPU lock overrides that stale cap for
# Prefect 3.9.1, which needs 0.139) and, through its CUDA kernels' packages, protobuf below 7;
# its CPU and GPU builds pin triton and apache-tvm-ffi apart (scripts/lock-gpu.sh); reasoning-gym
# (the `real` extra: problems read on the CPU, never on a GPU worker) pins tabulate to 0.9.0
DIFFERENT = {"fastapi", "protobuf", "triton", "apache-tvm-ffi", "tabulate"}


def pins(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            out[re.sub(r"[-_.]+", "-", name.lower())] = version
    return out


def resolve(lock: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            str(UV), "pip", "compile", "pyproject.toml", "--extra", "gpu", "--extra", "dev",
            "-c", str(lock), "--python-version", "3.11",
            "--python-platform", "x86_64-manylinux_2_28", "--no-header", "--no-annotate", "-q",
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def test_the_gpu_lock_resolves_to_itself():
    run = resolve(ROOT / "constraints-gpu.txt")
    assert run.returncode == 0, run.stderr[-3000:]
    lock = pins((ROOT / "constraints-gpu.txt").read_text())
    # every package the resolution takes is pinned by the lock, at the lock's version
    assert pins(run.stdout) == lock
    assert {lock[p] for p in ("torch", "vllm", "transformers", "verl")} == {
        "2.13.0", "0.27.1", "5.10.4", "0.9.1"
    }  # fmt: skip


def test_the_gpu_lock_shares_the_cpu_locks_versions():
    cpu = pins((ROOT / "constraints.txt").read_text())
    gpu = pins((ROOT / "constraints-gpu.txt").read_text())
    assert {p for p in cpu.keys() & gpu.keys() if cpu[p] != gpu[p]} == DIFFERENT


def test_a_lock_that_conflicts_fails_to_resolve(tmp_path):
    broken = tmp_path / "lock.txt"
    text = (ROOT / "constraints-gpu.txt").read_text()
    broken.write_text(text.replace("\nfastapi==0.136.3\n", "\nfastapi==0.150.0\n"))
    run = resolve(broken)
    assert run.returncode != 0 and "fastapi" in run.stderr


def test_each_image_installs_from_its_lock_and_the_gpu_one_has_a_compiler():
    """Read, not built (no Docker here): the GPU image takes constraints-gpu.txt and a C
    compiler (Triton builds its launcher with it on first use), the CPU one constraints.txt and
    Prefect; scripts/gpu-check.sh installs the same lock."""
    docker = (ROOT / "infra" / "Dockerfile").read_text()
    gpu, cpu = docker.split('if [ "$ROLE" = gpu ]; then')[2].split("else")
    assert '-c constraints-gpu.txt -e ".[gpu]"' in gpu and "constraints.txt" not in gpu
    assert "build-essential" in docker.split('if [ "$ROLE" = gpu ]; then')[1]
    assert '-c constraints.txt -e ".[dev,flows,real]"' in cpu
    check = (ROOT / "scripts" / "gpu-check.sh").read_text()
    assert '-c constraints-gpu.txt -e ".[gpu,dev]"' in check
