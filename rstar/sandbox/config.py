"""Limits and sizing of the sandbox. One dataclass, shared by executors, service and CLI."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, fields


def available_cpus(cpu_max: str = "/sys/fs/cgroup/cpu.max") -> int:
    """The CPUs this process may use: its affinity mask, capped by its cgroup's CPU quota (a
    container's limit; os.cpu_count() counts the host's cores)."""
    cpus = len(os.sched_getaffinity(0))
    try:
        with open(cpu_max) as f:
            quota, period = f.read().split()
        if quota != "max":
            cpus = min(cpus, int(quota) // int(period))
    except (OSError, ValueError):
        pass  # no cgroup v2 quota: the affinity mask is the limit
    return max(1, cpus)


@dataclass
class SandboxConfig:
    # Per-call limits (enforced by the kernel in the call's process, not by Python).
    timeout_s: float = 10.0  # wall clock, default per call
    max_timeout_s: float = 120.0  # a request may ask for more time, up to this
    cpu_time_s: int = 10  # RLIMIT_CPU; the hard limit is one second above
    memory_mb: int = 1024  # address space the call may add on top of its warm parent
    file_size_mb: int = 16  # RLIMIT_FSIZE; also bounds stdout/stderr floods
    max_processes: int = 16  # RLIMIT_NPROC of the call's own uid (fork bombs stop here)
    max_open_files: int = 256
    max_output_bytes: int = (
        8192  # stdout/stderr returned to the caller, each; the rest is cut with a mark
    )
    max_code_bytes: int = 256 * 1024
    max_stdin_bytes: int = 1024 * 1024

    # Executors (fork servers) on this node.
    lean_executors: int = field(default_factory=available_cpus)
    warm_executors: int = field(default_factory=available_cpus)
    slots_per_executor: int = 16  # concurrent calls per executor, each with its own uid
    spares_per_executor: int = 1  # call processes forked ahead while idle: lower latency per call
    warm_modules: tuple[str, ...] = ("numpy", "sympy")
    # Code importing any of these goes to a warm executor (the rest is cheaper to fork from a lean
    # one).
    warm_routes: tuple[str, ...] = ("numpy", "sympy", "mpmath", "scipy", "networkx")
    # calls run as uids from here up; each service on a host leases its own block
    # (rstar.sandbox.uids)
    uid_base: int = 200_000
    workdir_mb: int = 512  # tmpfs holding the calls' private working directories
    isolation: str = (
        "auto"  # "strict": refuse to start without full isolation; "auto": warn and degrade
    )
    max_attempts: int = 3  # a call whose executor or node dies is retried this many times in all

    # Central queue and send workers.
    batch_size: int = 64
    batch_window_ms: float = 2.0
    send_workers: int = 32
    # "stream": a node answers each call of a batch as it ends (a slow call holds no other);
    # "batch": a batch is answered when its slowest call ends (the relay benchmark's baseline)
    relay: str = "stream"
    # a worker node that sends no answer for this long while it holds calls is lost: its calls
    # go elsewhere (a node that keeps its connection open but stops answering held them for ever)
    node_silence_s: float = 300.0
    max_queue: int = 100_000

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            want = (int, float) if f.type == "float" else {"int": int, "str": str}.get(f.type)
            if want and (isinstance(v, bool) or not isinstance(v, want)):
                raise ValueError(f"sandbox config {f.name} must be {f.type}, got {v!r}")
        if self.isolation not in ("strict", "auto"):
            raise ValueError(f"isolation must be 'strict' or 'auto', not {self.isolation!r}")
        if self.relay not in ("stream", "batch"):
            raise ValueError(f"relay must be 'stream' or 'batch', not {self.relay!r}")
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v < 0:
                raise ValueError(f"sandbox config {f.name} must be >= 0, got {v}")
        self.warm_modules = tuple(self.warm_modules)
        self.warm_routes = tuple(set(self.warm_routes) | set(self.warm_modules))

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> SandboxConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown sandbox config keys: {sorted(unknown)}")
        return cls(**d)

    @classmethod
    def from_yaml(cls, path: str) -> SandboxConfig:
        import yaml

        with open(path) as f:
            data = yaml.safe_load(f) or {}
        if not isinstance(data, dict):
            raise ValueError(
                f"{path}: expected a mapping of sandbox settings, got {type(data).__name__}"
            )
        try:
            return cls.from_dict(data)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{path}: {e}") from None

    def clamp_timeout(self, timeout_s: float | None) -> float:
        if timeout_s is None or timeout_s <= 0:
            return self.timeout_s
        return min(float(timeout_s), self.max_timeout_s)
