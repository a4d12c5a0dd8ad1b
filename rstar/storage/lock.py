"""One pipeline run per storage root at a time.

Two runs on one root overwrite each other's models, checkpoints and cache markers (a double
click on the UI's Run button did exactly that). A run takes the root's lock before its first
stage and a second run exits at once with `RootBusy`, naming the holder, rather than waiting
(a queued duplicate is rarely what the person who clicked twice wanted).

- Local root: an OS lock (`fcntl.flock`) on `<root>/.rstar-lock`; a killed holder releases it
  with its process, so nothing goes stale.
- s3:// root: a lease object `<root>/.rstar-lock`, created only if absent (S3 conditional
  write, `If-None-Match`), holding its owner and expiry; renewed by a thread while held and
  deleted on release. A lease past its expiry (its holder died) is broken by the next run.
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


def owner_info(run: str) -> dict:
    return {"run": run, "host": socket.gethostname(), "pid": os.getpid(),
            "since": time.strftime("%Y-%m-%d %H:%M:%S %Z")}


def _busy(root: str, holder: dict) -> RootBusy:
    who = ", ".join(f"{k} {v}" for k, v in holder.items() if k != "expires")
    return RootBusy(f"storage root {root} is in use by another run ({who}); wait for it to end, or give this "
                    "run its own storage_root")


@contextmanager
def hold_root(root: str, run: str, lease_s: float = 300.0):
    """Hold `root` for the body; raises RootBusy at once if another run holds it."""
    with (_hold_remote(root, run, lease_s) if is_remote(root) else _hold_local(root, run)):
        yield


@contextmanager
def _hold_local(root: str, run: str):
    import fcntl

    os.makedirs(root, exist_ok=True)
    path = os.path.join(root, LOCK)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            with open(path) as f:
                text = f.read()
            raise _busy(root, json.loads(text) if text.strip() else {"run": "unknown"}) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(owner_info(run)).encode(), 0)
        yield
    finally:
        os.close(fd)  # closing releases the lock


@contextmanager
def _hold_remote(root: str, run: str, lease_s: float):
    fs, base = filesystem(root)
    path = f"{base.rstrip('/')}/{LOCK}"
    me = owner_info(run)

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
    else:
        raise _busy(root, {"run": "another run taking it at the same moment"})
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(lease_s / 3):
            write("wb")

    renewer = threading.Thread(target=renew, daemon=True, name="rstar-root-lease")
    renewer.start()
    try:
        yield
    finally:
        stop.set()
        renewer.join()
        fs.rm(path)
