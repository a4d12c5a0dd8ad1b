"""The executors of one node, seen from the service's event loop.

`ExecutorPool.run` routes a call to a lean or warm executor by what the snippet
imports, bounds in-flight calls by the executors' slots, and retries calls whose
executor died (the executor is restarted) up to `max_attempts`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import socket
import sys
from dataclasses import dataclass, field

from rstar.errors import NotRetryable
from rstar.sandbox.config import SandboxConfig
from rstar.sandbox.executor import FrameReader, frame
from rstar.sandbox.result import ExecRequest, ExecResult, Status
from rstar.sandbox.uids import UidRange

log = logging.getLogger(__name__)
_IMPORT = re.compile(
    r"^[ \t]*(?:from[ \t]+([A-Za-z_]\w*)|import[ \t]+([A-Za-z_][\w \t,.]*))", re.MULTILINE
)
_PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def imported_modules(code: str) -> set[str]:
    """Top-level module names a snippet imports (a cheap scan; routing only, never security)."""
    names = set()
    for frm, imp in _IMPORT.findall(code):
        if frm:
            names.add(frm)
        else:
            names.update(part.split()[0].split(".")[0] for part in imp.split(",") if part.strip())
    return names


def flavour_for(code: str, cfg: SandboxConfig) -> str:
    return "warm" if imported_modules(code) & set(cfg.warm_routes) else "lean"


def validate(req: ExecRequest, cfg: SandboxConfig) -> str | None:
    """Why a request cannot run, or None."""
    if not isinstance(req.code, str):
        return f"code must be a string, not {type(req.code).__name__}"
    if not isinstance(req.stdin, str):
        return f"stdin must be a string, not {type(req.stdin).__name__}"
    size = len(req.code.encode("utf-8", "surrogatepass"))
    if size > cfg.max_code_bytes:
        return f"code is {size} bytes; the limit is {cfg.max_code_bytes}"
    if len(req.stdin.encode("utf-8", "surrogatepass")) > cfg.max_stdin_bytes:
        return f"stdin is over the limit of {cfg.max_stdin_bytes} bytes"
    return None


def executor_env(flavour: str) -> dict[str, str]:
    """A scrubbed environment: the service's secrets never reach an executor or a call."""
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "PYTHONIOENCODING": "utf-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        # compiling model code warns about its escapes on the executor's stderr, i.e. the service's
        # log
        "PYTHONWARNINGS": "ignore::SyntaxWarning",
        "PYTHONPATH": _PROJECT_ROOT,
        "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        # A call's working directory is its cwd; relative paths resolve there for every call.
        "HOME": ".",
        "TMPDIR": ".",
    }
    # glibc malloc on transparent huge pages: fork copies far fewer page tables
    if flavour == "warm":
        env.update(PYTHONMALLOC="malloc", GLIBC_TUNABLES="glibc.malloc.hugetlb=1")
    return env


class ExecutorLost(Exception):
    pass


@dataclass
class ExecutorHandle:
    flavour: str
    index: int
    uid_start: int
    cfg: SandboxConfig
    proc: asyncio.subprocess.Process | None = None
    writer: asyncio.StreamWriter | None = None
    hello: dict = field(default_factory=dict)
    inflight: dict[int, asyncio.Future] = field(default_factory=dict)
    alive: bool = False
    restarts: int = 0

    async def start(self, on_lost) -> None:
        mine, theirs = socket.socketpair()
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-S",
            "-m",
            "rstar.sandbox.isolation",
            str(self.cfg.workdir_mb),
            self.flavour,
            str(self.uid_start),
            str(theirs.fileno()),
            pass_fds=[theirs.fileno()],
            env=executor_env(self.flavour),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            cwd="/",
        )
        theirs.close()
        reader, self.writer = await asyncio.open_connection(sock=mine, limit=1 << 24)
        self.writer.write(frame(self.cfg.to_dict()))
        frames = FrameReader()
        try:
            self.hello = await asyncio.wait_for(self._next_frame(reader, frames), 120)
        except Exception as e:
            self.proc.kill()
            raise RuntimeError(
                f"{self.flavour} executor {self.index} failed to start (exit code "
                f"{await self.proc.wait()}): {e!r}"
            ) from e
        warnings = self.hello.get("warnings", [])
        if warnings and self.cfg.isolation == "strict":
            self.proc.kill()
            await self.proc.wait()
            raise IsolationRefused(
                f"sandbox isolation is 'strict' and the {self.flavour} executor is not fully "
                f"isolated: {'; '.join(warnings)} (run the service as root on a kernel that "
                "allows mount and network namespaces, or set isolation: auto to run degraded)"
            )
        for w in warnings:
            log.warning("sandbox %s executor: %s", self.flavour, w)
        self.alive = True
        asyncio.create_task(self._read_loop(reader, frames, on_lost))

    @staticmethod
    async def _next_frame(reader: asyncio.StreamReader, frames: FrameReader):
        while True:
            for first in frames.feed(await reader.read(1 << 16) or _eof()):
                return first

    async def _read_loop(self, reader, frames, on_lost) -> None:
        try:
            while True:
                data = await reader.read(1 << 20)
                if not data:
                    break
                for res in frames.feed(data):
                    fut = self.inflight.pop(res.pop("id"), None)
                    if fut is not None and not fut.done():
                        fut.set_result(res)
        finally:
            self.alive = False
            lost, self.inflight = self.inflight, {}
            for fut in lost.values():
                if not fut.done():
                    fut.set_exception(ExecutorLost(f"{self.flavour} executor {self.index} died"))
            await on_lost(self)

    def submit(self, call_id: int, req: dict) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        self.inflight[call_id] = fut
        self.writer.write(frame(req))
        return fut

    async def stop(self) -> None:
        self.alive = False
        if self.writer:
            self.writer.close()
        if self.proc and self.proc.returncode is None:
            try:
                await asyncio.wait_for(self.proc.wait(), 5)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()


class IsolationRefused(NotRetryable, RuntimeError):
    """`isolation: strict` and an executor reported a weaker isolation than it should have."""


def _eof():
    raise ConnectionError("executor closed its channel")


class ExecutorPool:
    """All executors of this node. Use as `async with ExecutorPool(cfg) as pool`."""

    def __init__(self, cfg: SandboxConfig | None = None) -> None:
        self.cfg = cfg or SandboxConfig()
        self.executors: dict[str, list[ExecutorHandle]] = {"lean": [], "warm": []}
        self._slots: dict[str, asyncio.Semaphore] = {}
        self._alive: dict[str, asyncio.Event] = {}
        self._ids = 0
        self._closing = False
        self._uids: UidRange | None = None
        self.retried = 0

    @property
    def capacity(self) -> int:
        return sum(
            self.cfg.slots_per_executor for hs in self.executors.values() for h in hs if h.alive
        )

    @property
    def inflight(self) -> int:
        return sum(len(h.inflight) for hs in self.executors.values() for h in hs)

    @property
    def warnings(self) -> list[str]:
        return sorted(
            {w for hs in self.executors.values() for h in hs for w in h.hello.get("warnings", [])}
        )

    async def start(self) -> ExecutorPool:
        executors = max(1, self.cfg.lean_executors) + max(1, self.cfg.warm_executors)
        self._uids = UidRange.lease(self.cfg.uid_base, executors * self.cfg.slots_per_executor)
        uid = self._uids.start
        for flavour, count in (
            ("lean", self.cfg.lean_executors),
            ("warm", self.cfg.warm_executors),
        ):
            for i in range(max(1, count)):
                self.executors[flavour].append(ExecutorHandle(flavour, i, uid, self.cfg))
                uid += self.cfg.slots_per_executor
            self._slots[flavour] = asyncio.Semaphore(
                len(self.executors[flavour]) * self.cfg.slots_per_executor
            )
            self._alive[flavour] = asyncio.Event()
        try:
            await asyncio.gather(
                *(h.start(self._on_lost) for hs in self.executors.values() for h in hs)
            )
        except BaseException:
            await self.close()  # the executors that did start, and the uid lease
            raise
        for flavour in self.executors:
            self._alive[flavour].set()
        return self

    async def __aenter__(self) -> ExecutorPool:
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        self._closing = True
        await asyncio.gather(*(h.stop() for hs in self.executors.values() for h in hs))
        if self._uids:
            self._uids.release()  # after the executors (and their calls) are gone

    async def _on_lost(self, handle: ExecutorHandle) -> None:
        if self._closing:
            return
        log.warning("sandbox %s executor %d died; restarting", handle.flavour, handle.index)
        if not any(h.alive for h in self.executors[handle.flavour]):
            self._alive[handle.flavour].clear()
        handle.restarts += 1
        while not self._closing:
            try:
                await handle.start(self._on_lost)
                self._alive[handle.flavour].set()
                return
            except Exception as e:  # noqa: BLE001 - keep trying; calls wait on _alive meanwhile
                log.error("restart of %s executor %d failed: %r", handle.flavour, handle.index, e)
                await asyncio.sleep(1.0)

    async def run(self, req: ExecRequest) -> ExecResult:
        problem = validate(req, self.cfg)
        if problem:
            return ExecResult.rejected(problem)
        flavour = flavour_for(req.code, self.cfg)
        timeout = self.cfg.clamp_timeout(req.timeout_s)
        payload = {
            "code": req.code,
            "stdin": req.stdin,
            "timeout": timeout,
            "notebook": req.notebook,
        }
        async with self._slots[flavour]:
            for attempt in range(1, self.cfg.max_attempts + 1):
                await self._alive[flavour].wait()
                # least loaded; ties go round robin, so an idle executor has time to fork its spare
                # again
                group = self.executors[flavour]
                turn = self._ids % len(group)
                handle = min(
                    (h for h in group[turn:] + group[:turn] if h.alive),
                    key=lambda h: len(h.inflight),
                    default=None,
                )
                if handle is None:
                    continue
                self._ids += 1
                payload["id"] = self._ids
                try:
                    res = await handle.submit(self._ids, payload)
                except ExecutorLost:
                    self.retried += 1
                    continue
                res["status"] = Status(res["status"])
                return ExecResult(attempts=attempt, **res)
        return ExecResult(
            status=Status.KILLED,
            reason=f"executor lost {self.cfg.max_attempts} times",
            attempts=self.cfg.max_attempts,
        )

    async def run_many(self, reqs: list[ExecRequest]) -> list[ExecResult]:
        # no task hop for a lone call: it is latency, not throughput, that counts
        if len(reqs) == 1:
            return [await self.run(reqs[0])]
        return list(await asyncio.gather(*(self.run(r) for r in reqs)))
