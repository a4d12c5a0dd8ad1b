import os
import time

import pytest

from rstar.sandbox.config import SandboxConfig
from rstar.sandbox.service import SandboxService

UID_BASE = 300_000
SLOTS = 6


def small_config(**overrides) -> SandboxConfig:
    base = {
        "lean_executors": 1,
        "warm_executors": 1,
        "slots_per_executor": SLOTS,
        "timeout_s": 5.0,
        "cpu_time_s": 3,
        "uid_base": UID_BASE,
        "batch_window_ms": 1.0,
    }
    base.update(overrides)
    return SandboxConfig(**base)


def processes_of_uids(lo: int, hi: int) -> list[tuple[int, int, str]]:
    """(pid, uid, command) of live processes whose real uid is in [lo, hi)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            uid = int(fields["Uid"].split()[0])
            state = fields["State"].split()[0]
            if lo <= uid < hi and state != "Z":
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    found.append((int(entry), uid, f.read().replace(b"\0", b" ").decode()))
        except (OSError, KeyError, ValueError):
            continue
    return found


@pytest.fixture(scope="session")
async def sandbox():
    async with SandboxService(small_config()) as sb:
        yield sb


def wait_until_gone(lo: int, hi: int, grace_s: float = 3.0) -> list:
    """Processes SIGKILLed by a sweep take a moment to finish exiting; give them `grace_s`."""
    deadline = time.monotonic() + grace_s
    while (left := processes_of_uids(lo, hi)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


@pytest.fixture
def no_leftovers():
    """Asserts after the test that no process of the sandbox's call uids is alive."""
    yield
    assert wait_until_gone(UID_BASE, UID_BASE + 2 * SLOTS) == []
