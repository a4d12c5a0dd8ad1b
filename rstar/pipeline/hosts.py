"""Hosts on one machine, for a rehearsal of a cluster: network namespaces, each with its own
address on a bridge, where this machine (the bridge's address) serves what a cluster reaches
over the network (S3, MLflow). Names resolve in each host as in the cluster (`names`, written
to /etc/netns/<host>/hosts, which `ip netns exec` puts in place of /etc/hosts).

Needs root and iproute2. Everything made is removed on exit, and the processes started in the
hosts are stopped by their process groups (only those this object started).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field

NETNS_ETC = "/etc/netns"


class HostsError(RuntimeError):
    """A host could not be made (no root, no iproute2) or a process in it did not start."""


def _ip(*args: str, netns: str | None = None) -> None:
    prefix = ["ip", "netns", "exec", netns] if netns else []
    run = subprocess.run([*prefix, "ip", *args], capture_output=True, text=True, timeout=30)
    if run.returncode:
        raise HostsError(f"ip {' '.join(args)}: {run.stderr.strip()}")


@dataclass
class Hosts:
    """`count` hosts named `<prefix><net>-0`, `<prefix><net>-1`... on the subnet
    10.251.`net`.0/24: this machine is .1, host i is .(i + 2)."""

    count: int
    net: int = field(default_factory=lambda: os.getpid() % 200 + 20)
    prefix: str = "rstar-host"
    names: dict[str, int] = field(default_factory=dict)  # name -> host index (-1: this machine)
    _procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def bridge(self) -> str:
        return f"rstbr{self.net}"

    @property
    def here(self) -> str:
        """This machine's address on the bridge."""
        return f"10.251.{self.net}.1"

    def address(self, i: int) -> str:
        return self.here if i < 0 else f"10.251.{self.net}.{i + 2}"

    def netns(self, i: int) -> str:
        return f"{self.prefix}{self.net}-{i}"

    def __enter__(self) -> Hosts:
        if shutil.which("ip") is None:
            raise HostsError("no `ip` command: hosts need iproute2 (apt-get install iproute2)")
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.here}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for i in range(self.count):
                ns, here, there = self.netns(i), f"rst{self.net}h{i}", f"rst{self.net}n{i}"
                _ip("netns", "add", ns)
                _ip("link", "add", here, "type", "veth", "peer", "name", there)
                _ip("link", "set", here, "master", self.bridge)
                _ip("link", "set", here, "up")
                _ip("link", "set", there, "netns", ns)
                _ip("addr", "add", f"{self.address(i)}/24", "dev", there, netns=ns)
                _ip("link", "set", there, "up", netns=ns)
                _ip("link", "set", "lo", "up", netns=ns)
                os.makedirs(os.path.join(NETNS_ETC, ns), exist_ok=True)
                with open(os.path.join(NETNS_ETC, ns, "hosts"), "w") as f:
                    # the machine's name is the host's own address there, as a pod's is: gloo
                    # (torch.distributed on CPUs) advertises what the name resolves to
                    machine = socket.gethostname()
                    f.write(f"127.0.0.1 localhost\n{self.address(i)} {ns} {machine}\n")
                    f.writelines(f"{self.address(j)} {name}\n" for name, j in self.names.items())
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def start(self, i: int, command: list[str], env: dict | None = None, log: str | None = None):
        """Start `command` in host `i` (-1: on this machine), in its own process group, output to
        `log`; the Popen. It is stopped on exit."""
        out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115 - the child holds it
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.netns(i), *command] if i >= 0 else command,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._procs.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen, grace_s: float = 10) -> None:
        """Stop a process this object started, with its group: SIGTERM, SIGKILL after `grace_s`."""
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 30)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                try:  # the group outlives its leader while any child is left
                    os.killpg(proc.pid, 0)
                except ProcessLookupError:
                    proc.poll()
                    return
                proc.poll()
                time.sleep(0.2)

    def __exit__(self, *exc) -> None:
        for proc in reversed(self._procs):
            self.stop(proc)
        for i in range(self.count):
            subprocess.run(["ip", "link", "del", f"rst{self.net}h{i}"], capture_output=True)
            subprocess.run(["ip", "netns", "del", self.netns(i)], capture_output=True)
            shutil.rmtree(os.path.join(NETNS_ETC, self.netns(i)), ignore_errors=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
