"""Each sandbox service on a host gets its own range of call uids.

A call runs as its own uid and its clean-up kills every process of that uid, so two services
on one host (two pipelines, a pipeline and a test run) that share a range kill each other's
calls. A service leases the first free block at or above its `uid_base`: an OS lock on
`/tmp/rstar-sandbox-uids/<first uid>.lock`, held for the service's life and released with its
process, however it ends. Containers on one host each have their own /tmp but share the host's
uids: there the lock directory is a host directory mounted into each (RSTAR_SANDBOX_UID_LOCKS,
set by infra/cluster/sandbox.yaml)."""

from __future__ import annotations

import fcntl
import os

LOCK_DIR = "/tmp/rstar-sandbox-uids"
LOCK_DIR_ENV = "RSTAR_SANDBOX_UID_LOCKS"
BLOCK = 1000  # uids per lease unit
MAX_BLOCKS = 200  # how far above uid_base to look


class UidRange:
    def __init__(self, start: int, fd: int) -> None:
        self.start, self._fd = start, fd

    @classmethod
    def lease(cls, uid_base: int, needed: int) -> UidRange:
        """The first free range of `needed` uids at or above `uid_base` (in whole blocks)."""
        lock_dir = os.environ.get(LOCK_DIR_ENV) or LOCK_DIR
        os.makedirs(lock_dir, mode=0o755, exist_ok=True)
        size = -(-needed // BLOCK) * BLOCK
        for j in range(MAX_BLOCKS):
            start = uid_base + j * size
            fd = os.open(os.path.join(lock_dir, f"{start}.lock"), os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            return cls(start, fd)
        raise RuntimeError(
            f"no free range of {needed} call uids in {MAX_BLOCKS} blocks above {uid_base} (every "
            f"lock in {lock_dir} is held)"
        )

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
