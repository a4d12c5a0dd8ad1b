"""One pipeline run per storage root at a time.

Two runs on one root overwrite each other's models, checkpoints and cache markers (a double
click on the UI's Run button did exactly that). A run takes the root's lock before its first
stage and a second run exits at once with `RootBusy`, naming the holder, rather than waiting
(a queued duplicate is rarely what the person who clicked twice wanted).

- Local root: an OS lock (`fcntl.flock`) on `<root>/.rstar-lock`; a killed holder releases it
  with its process, so nothing goes stale. The file names its holder and is emptied on release,
  so a name still in it when the next run takes the lock is a holder that was killed.
- s3:// root: a lease object `<root>/.rstar-lock`, created only if absent (S3 conditional
  write, `If-None-Match`), holding its owner and expiry; renewed by a thread while held and
  deleted on release. A lease past its expiry (its holder died) is broken by the next run.

`hold_root` yields the owner a killed holder left behind (or None), so the next run can mark
what that holder left RUNNING (its Prefect flow run, its MLflow runs) as crashed.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from contextlib import contextmanager

from rstar.errors import NotRetryable
from rstar.storage import filesystem, is_remote

LOCK = ".rstar-lock"


class RootBusy(NotRetryable, RuntimeError):
    """Another run holds the storage root."""


def owner_info(run: str, **ids) -> dict:
    return {
        "run": run,
        **ids,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "since": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def _busy(root: str, holder: dict) -> RootBusy:
    who = ", ".join(f"{k} {v}" for k, v in holder.items() if k != "expires")
    return RootBusy(
        f"storage root {root} is in use by another run ({who}); wait for it to end, or give this "
        "run its own storage_root"
    )


def check_free(root: str) -> None:
    """Raise RootBusy now if a run holds `root` (a check before starting anything); the lock and
    a killed holder's record are left as they are, for the run that takes the root to read."""
    if is_remote(root):
        fs, base = filesystem(root)
        try:
            holder = json.loads(fs.cat_file(f"{base.rstrip('/')}/{LOCK}"))
        except FileNotFoundError:
            return
        if holder.get("expires", 0) > time.time():
            raise _busy(root, holder)
        return
    import fcntl

    path = os.path.join(root, LOCK)
    if not os.path.exists(path):
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise _busy(root, _record(path)) from None
    finally:
        os.close(fd)


def _record(path: str) -> dict:
    with open(path) as f:
        text = f.read()
    return json.loads(text) if text.strip() else {"run": "unknown"}


@contextmanager
def hold_root(root: str, run: str, lease_s: float = 300.0, **ids):
    """Hold `root` for the body (`ids`, e.g. a flow run id, are recorded with the holder);
    raises RootBusy at once if another run holds it. Yields the owner record of a previous
    holder that was killed while holding it, else None."""
    me = owner_info(run, **ids)
    with _hold_remote(root, me, lease_s) if is_remote(root) else _hold_local(root, me) as killed:
        yield killed


@contextmanager
def _hold_local(root: str, me: dict):
    import fcntl

    os.makedirs(root, exist_ok=True)
    path = os.path.join(root, LOCK)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _busy(root, _record(path)) from None
        left = os.pread(fd, 1 << 16, 0)  # a killed holder's record (a clean one empties the file)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me).encode(), 0)
        try:
            yield json.loads(left) if left.strip() else None
        finally:
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # closing releases the lock


@contextmanager
def _hold_remote(root: str, me: dict, lease_s: float):
    fs, base = filesystem(root)
    path = f"{base.rstrip('/')}/{LOCK}"
    killed = None

    def write(mode: str) -> None:
        with fs.open(path, mode) as f:
            f.write(json.dumps({**me, "expires": time.time() + lease_s}).encode())

    for _ in range(2):
        try:
            write("xb")  # only if absent
            break
        except FileExistsError:
            try:
                holder = json.loads(fs.cat_file(path))
            except FileNotFoundError:
                continue  # released meanwhile: try again
            if holder.get("expires", 0) > time.time():
                raise _busy(root, holder) from None
            fs.rm(path)  # an expired lease: its holder died
            killed = holder
    else:
        raise _busy(root, {"run": "another run taking it at the same moment"})
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(lease_s / 3):
            write("wb")

    renewer = threading.Thread(target=renew, daemon=True, name="rstar-root-lease")
    renewer.start()
    try:
        yield killed
    finally:
        stop.set()
        renewer.join()
        fs.rm(path)
