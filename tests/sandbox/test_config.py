import os

import pytest

from rstar.sandbox.config import SandboxConfig


def test_shipped_yaml_loads_and_matches_defaults():
    cfg = SandboxConfig.from_yaml("configs/sandbox.yaml")
    defaults = SandboxConfig()
    for key in ("timeout_s", "memory_mb", "slots_per_executor", "batch_size", "uid_base"):
        assert getattr(cfg, key) == getattr(defaults, key)


@pytest.mark.parametrize(
    "text,message",
    [
        ("timeout_s: soon\n", "timeout_s must be float"),
        ("memroy_mb: 10\n", "unknown sandbox config keys: ['memroy_mb']"),
        ("- a list\n", "expected a mapping"),
        ("cpu_time_s: -1\n", "cpu_time_s must be >= 0"),
        ("isolation: maybe\n", "isolation must be 'strict' or 'auto'"),
    ],
)
def test_bad_yaml_names_the_file_and_the_key(tmp_path, text, message):
    path = tmp_path / "sb.yaml"
    path.write_text(text)
    with pytest.raises(ValueError) as err:
        SandboxConfig.from_yaml(str(path))
    assert str(path) in str(err.value) and message in str(err.value)


def test_public_api_names_resolve():
    import rstar.sandbox as sandbox

    for name in sandbox.__all__:
        assert getattr(sandbox, name).__name__ == name


_START = """
import asyncio, sys
from rstar.sandbox.config import SandboxConfig
from rstar.sandbox.service import SandboxService

async def main():
    cfg = SandboxConfig(isolation=sys.argv[1], lean_executors=1, warm_executors=1,
                        slots_per_executor=1, uid_base=430_000)
    async with SandboxService(cfg) as service:
        print("started; warnings:", service.health()["warnings"])

asyncio.run(main())
"""


def test_strict_isolation_refuses_a_degraded_executor_that_auto_accepts():
    """A service whose executors cannot enter their namespaces (CAP_SYS_ADMIN dropped from the
    capability bounding set: root, yet unshare fails) runs degraded under `auto`, with the
    warnings in its health, and refuses to start under `strict`, naming what is missing."""
    import subprocess
    import sys

    def start(mode: str) -> subprocess.CompletedProcess:
        command = ["setpriv", "--bounding-set", "-sys_admin", "--", sys.executable, "-c", _START]
        return subprocess.run(
            [*command, mode], capture_output=True, text=True, timeout=180, cwd=os.getcwd()
        )

    degraded = start("auto")
    assert degraded.returncode == 0, degraded.stderr[-2000:]
    assert "started; warnings:" in degraded.stdout and "namespaces unavailable" in degraded.stdout
    refused = start("strict")
    assert refused.returncode != 0 and "started" not in refused.stdout
    assert "IsolationRefused: sandbox isolation is 'strict'" in refused.stderr
    assert "namespaces unavailable" in refused.stderr.splitlines()[-1]


def test_executors_default_to_the_cpus_the_container_may_use(tmp_path):
    """A pod's CPU limit is a cgroup quota; os.cpu_count() would count the node's cores."""
    from rstar.sandbox.config import available_cpus

    mine = len(os.sched_getaffinity(0))
    quota = tmp_path / "cpu.max"
    quota.write_text("100000 100000\n")  # one CPU's worth
    assert available_cpus(str(quota)) == 1
    quota.write_text("max 100000\n")
    assert available_cpus(str(quota)) == mine
    assert available_cpus(str(tmp_path / "none")) == mine
    assert SandboxConfig().lean_executors == available_cpus()


def test_uid_leases_live_where_the_environment_says(tmp_path, monkeypatch):
    """Two containers on one node share its uids: both point RSTAR_SANDBOX_UID_LOCKS at one
    host directory, and the second lease takes the next block."""
    from rstar.sandbox.uids import LOCK_DIR_ENV, UidRange

    monkeypatch.setenv(LOCK_DIR_ENV, str(tmp_path))
    first = UidRange.lease(440_000, 16)
    second = UidRange.lease(440_000, 16)
    try:
        assert (first.start, second.start) == (440_000, 441_000)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["440000.lock", "441000.lock"]
    finally:
        first.release()
        second.release()
