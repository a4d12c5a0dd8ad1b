"""The Ray this process works on: the cluster named by `RAY_ADDRESS`, or a local one capped
to this machine (loopback only, a bounded object store), started on first use."""

from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager


def ensure_ray(cpus: float, object_store_mb: int = 256) -> None:
    """Join `RAY_ADDRESS`, or start a local Ray with `cpus` CPUs; nothing if Ray is up."""
    import ray

    if ray.is_initialized():
        return
    with _sigterm_kept():
        address = os.environ.get("RAY_ADDRESS")
        if address:
            ray.init(address=address, log_to_driver=True)
            return
        # a local Ray binds to loopback only
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        ray.init(
            num_cpus=max(1, int(cpus)),
            object_store_memory=object_store_mb * 1024 * 1024,
            include_dashboard=False,
            log_to_driver=True,
        )


@contextmanager
def _sigterm_kept():
    """`ray.init` replaces the SIGTERM handler of the main thread with its own (exit at once, a
    local node's processes killed). The handler that was there stays: in a flow run it is
    Prefect's, which turns a cancel into a Cancelled run, and without it a cancelled run showed
    Crashed and its process aborted (exit code -6). Ray's atexit hook still stops a local Ray."""
    main = threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGTERM) if main else None
    try:
        yield
    finally:
        if callable(before):  # not the default action: that one would leave Ray's processes
            signal.signal(signal.SIGTERM, before)


@contextmanager
def ray_session(cpus: float):
    """Ray up for the body (`ensure_ray`); a local Ray this call started is shut down after it,
    one that was already up (a caller's, the cluster's) is left as it was."""
    import ray

    ours = not ray.is_initialized()
    ensure_ray(cpus)
    try:
        yield
    finally:
        if ours:
            ray.shutdown()
