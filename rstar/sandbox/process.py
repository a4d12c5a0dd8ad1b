"""Run a sandbox service: in this process (`serve`) or as a managed local subprocess."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from urllib.parse import urlsplit

import uvicorn

from rstar.sandbox.config import SandboxConfig
from rstar.sandbox.server import create_app
from rstar.sandbox.service import SandboxService


def serve(
    host: str,
    port: int,
    cfg: SandboxConfig,
    *,
    local: bool = True,
    workers: list[str] = (),
    join: str | None = None,
    public_url: str | None = None,
    log_level: str = "warning",
) -> None:
    """`public_url`: where the head of `join` reaches this service (default: `advertised_url`)."""
    service = SandboxService(cfg, local=local, remotes=list(workers))
    me = public_url or advertised_url(host, port, join)
    app = create_app(service, join=join, public_url=me)
    uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=False)


def advertised_url(host: str, port: int, join: str | None = None) -> str:
    """The URL a head reaches this service at. Bound to one address, that address; bound to
    every interface (0.0.0.0 or ::), the local address of the route to the head: in a pod, the
    pod's IP (a head told "0.0.0.0" would call itself)."""
    if host in ("0.0.0.0", "::", "") and join:
        head = urlsplit(join)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((head.hostname, head.port or 80))  # UDP: picks the route, sends nothing
            host = s.getsockname()[0]
    return f"http://{host}:{port}"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class SandboxProcess:
    """`rstar sandbox serve` as a child process bound to loopback; a context manager.

    The child gets its own process group, so `kill()` takes down the service and its
    executors together (used by tests that kill a worker node mid-batch)."""

    def __init__(
        self,
        *args: str,
        port: int | None = None,
        host: str = "127.0.0.1",
        env: dict[str, str] | None = None,
        startup_timeout_s: float = 120.0,
    ) -> None:
        self.host, self.port = host, port or free_port(host)
        self.url = f"http://{self.host}:{self.port}"
        self.args, self.env, self.startup_timeout_s = list(args), env, startup_timeout_s
        self.proc: subprocess.Popen | None = None

    def start(self) -> SandboxProcess:
        cmd = [
            sys.executable,
            "-m",
            "rstar.cli",
            "sandbox",
            "serve",
            "--host",
            self.host,
            "--port",
            str(self.port),
            *self.args,
        ]
        self.proc = subprocess.Popen(
            cmd, env={**os.environ, **(self.env or {})}, start_new_session=True
        )
        # answering is enough: a head that only dispatches is down (503) until workers join
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"sandbox service exited with {self.proc.returncode} during start-up"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/ping", timeout=1.0):
                    return self
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"sandbox service on {self.url} not up after {self.startup_timeout_s}s")

    def kill(self) -> None:
        """SIGKILL the service process, as a crash would. Its executors see their channel close
        and kill their running calls before exiting."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        """Graceful: the service closes its executors, which kill their running calls."""
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def __enter__(self) -> SandboxProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
