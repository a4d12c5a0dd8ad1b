"""The machine this runs on, as figures and manifests name it."""

from __future__ import annotations

import platform


def cpu_model() -> str:
    """The CPU's name as the kernel reports it: the same two cores run the figures at very
    different speeds on different hosts, so every measurement and every shipped base says which
    it had."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(
                line.split(":", 1)[1].strip() for line in f if line.startswith("model name")
            )
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def give_back_memory() -> None:
    """Collect garbage and return the C heap's free pages to the system (glibc's malloc_trim).
    PyTorch's CPU tensors come and go through malloc; what one model's evaluation freed stays in
    the process otherwise, and an evaluation of five SmolLM2 checkpoints in one process was
    killed by Ray at 21 GB in its second checkpoint. Nothing on a libc without it."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


# ATen's x86 kernel sets (the values of ATEN_CPU_CAPABILITY), narrowest first
KERNEL_SETS = ("default", "avx2", "avx512")
# the CPU flags each needs, as ATen checks them
_NEEDS = {"avx2": {"avx2", "fma"}, "avx512": {"avx512f", "avx512bw", "avx512vl", "avx512dq"}}


def widest_kernels(flags: set[str] | None = None) -> str:
    """The widest of ATen's x86 kernel sets this CPU can run (`flags`: its /proc/cpuinfo
    flags, read when not given)."""
    if flags is None:
        try:
            with open("/proc/cpuinfo") as f:
                line = next(line for line in f if line.startswith("flags"))
            flags = set(line.split(":", 1)[1].split())
        except (OSError, StopIteration):
            return "default"
    return next(k for k in reversed(KERNEL_SETS) if _NEEDS.get(k, set()) <= flags)
