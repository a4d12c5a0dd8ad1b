"""A fork server for untrusted snippets, started through `rstar.sandbox.isolation`.

One process per flavour: "lean" imports next to nothing, so forking it costs about a
millisecond; "warm" has numpy and sympy imported (on huge pages), so snippets using them
skip a second of imports. Per call: compile here (a syntax error needs no process) ->
fork -> confine (session, rlimits, own uid) -> run -> reap -> sweep the uid -> read output.

The process speaks length-prefixed marshal frames with the pool on socket FD; the first
frame it receives is its config. It is single-threaded on purpose: `sweep` switches the
process's uid for a moment. Every import here is paid by every fork: keep them few.
"""

from __future__ import annotations

import collections
import gc
import heapq
import marshal
import os
import resource
import select
import signal
import struct
import sys
import time

from rstar.sandbox import runner

HEADER = struct.Struct("!I")
# Cheap standard modules snippets use all the time; importing them once here saves every call.
PRELOAD = ("math", "itertools", "functools", "fractions", "heapq", "bisect")
WORK_ROOT = "/tmp/rstar-calls"  # inside the executor's private tmpfs (see isolation.py)
SETUP_FAILED = 125


def frame(obj) -> bytes:
    data = marshal.dumps(obj)
    return HEADER.pack(len(data)) + data


class FrameReader:
    """Accumulates bytes from a stream and yields complete frames."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def feed(self, data: bytes):
        self.buf += data
        while len(self.buf) >= HEADER.size:
            (n,) = HEADER.unpack_from(self.buf)
            if len(self.buf) < HEADER.size + n:
                return
            payload = bytes(self.buf[HEADER.size : HEADER.size + n])
            del self.buf[: HEADER.size + n]
            yield marshal.loads(payload)


def confine(uid: int | None, limits: list[tuple[int, int]]) -> None:
    """In the call process: hard limits, then the call's own uid. Afterwards the process can
    neither raise its limits nor signal anything but processes of its own uid. Raw os calls
    only: each Python object touched here is a page copied from the parent."""
    fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
    os.write(fd, b"1000")  # under memory pressure the kernel kills calls, not the service
    os.close(fd)
    for res, soft, hard in limits:
        resource.setrlimit(res, (soft, hard))
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)


def sweep(uid: int) -> None:
    """SIGKILL every process running as `uid`, including ones that detached with setsid:
    kill(-1) as that uid reaches exactly its processes; the saved uid 0 lets us switch back."""
    os.setresuid(uid, uid, 0)
    try:
        os.kill(-1, signal.SIGKILL)
    except ProcessLookupError:
        pass
    finally:
        os.setresuid(0, 0, 0)


class Slot:
    """A reusable place for one concurrent call: its uid, memfds and working directory."""

    def __init__(self, index: int, uid: int | None) -> None:
        self.uid = uid
        self.stdin, self.out, self.err, self.meta = (
            os.memfd_create(n) for n in ("in", "out", "err", "meta")
        )
        self.workdir = f"{WORK_ROOT}/{index}"

    def reset(self, stdin: str) -> None:
        for fd in (self.stdin, self.out, self.err, self.meta):
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
        if stdin:
            os.pwrite(self.stdin, stdin.encode(), 0)

    def clean(self) -> None:
        try:
            os.rmdir(self.workdir)
        except FileNotFoundError:
            pass
        except OSError:  # the call left files: walk them (fd-based, safe against symlinks)
            import shutil

            shutil.rmtree(self.workdir, ignore_errors=True)


class Call:
    __slots__ = ("req", "slot", "pid", "pidfd", "feed", "start", "timed_out", "done")

    def __init__(self, req: dict | None, slot: Slot) -> None:
        self.req = req  # None while the process is a waiting spare
        self.slot = slot
        self.pid = 0
        self.pidfd = -1  # readable when the process exits
        self.feed = -1  # the pipe its code and stdin are written to (a spare's)
        self.start = 0.0  # when its call started (monotonic)
        self.timed_out = False
        self.done = False


def _read_capped(fd: int, cap: int) -> tuple[str, bool]:
    size = os.fstat(fd).st_size
    text = os.pread(fd, min(size, cap), 0).decode("utf-8", "replace")
    if size > cap:
        return text + f"\n... [output truncated: {size - cap} more bytes]", True
    return text, False


class Executor:
    def __init__(self, flavour: str, uid_start: int, fd: int) -> None:
        self.fd = fd
        self.flavour = flavour
        self.reader = FrameReader()
        self.cfg = self._first_frame()
        self.warnings = [w for w in os.environ.pop("RSTAR_SANDBOX_WARNINGS", "").split("\n") if w]
        self.privileged = os.geteuid() == 0 and not any(
            "namespaces unavailable" in w for w in self.warnings
        )
        if not self.privileged:
            self.warnings.append(
                "not root: calls run under the service's own uid, so a process that detaches with "
                "setsid can outlive its call"
            )
        self.huge_pages = 0
        for name in PRELOAD + (tuple(self.cfg["warm_modules"]) if flavour == "warm" else ()):
            __import__(name)
        if flavour == "warm":
            from rstar.sandbox import isolation

            self.huge_pages = isolation.collapse_to_huge_pages()
        os.makedirs(WORK_ROOT, mode=0o711, exist_ok=True)
        with open("/proc/self/status") as f:
            vm_size = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
        cpu = self.cfg["cpu_time_s"]
        self.limits = [
            (
                resource.RLIMIT_CPU,
                cpu,
                cpu + 1,
            ),  # SIGXCPU at the soft limit, SIGKILL a second later
            (
                resource.RLIMIT_AS,
                vm_size + self.cfg["memory_mb"] * 2**20,
                vm_size + self.cfg["memory_mb"] * 2**20,
            ),
            (
                resource.RLIMIT_FSIZE,
                self.cfg["file_size_mb"] * 2**20,
                self.cfg["file_size_mb"] * 2**20,
            ),
            (resource.RLIMIT_NOFILE, self.cfg["max_open_files"], self.cfg["max_open_files"]),
            (resource.RLIMIT_CORE, 0, 0),
        ]
        if self.privileged:  # otherwise NPROC would count the service's own processes
            self.limits.append(
                (resource.RLIMIT_NPROC, self.cfg["max_processes"], self.cfg["max_processes"])
            )
        self.slots = [
            Slot(i, uid_start + i if self.privileged else None)
            for i in range(self.cfg["slots_per_executor"])
        ]
        self.free = list(reversed(self.slots))
        for slot in self.slots:  # leftovers of a previous executor that had these uids and died
            if slot.uid is not None:
                sweep(slot.uid)
        self.pending: collections.deque[dict] = collections.deque()
        self.running: dict[int, Call] = {}
        self.spares: list[Call] = []
        self.deadlines: list[tuple[float, int, Call]] = []
        self.seq = 0
        self.outbox: list[bytes] = []
        self.poller = select.poll()
        sys.stdout.reconfigure(line_buffering=True)  # a killed call keeps what it printed
        gc.freeze()  # children must not walk (and so copy) the parent's objects

    def _first_frame(self) -> dict:
        while True:
            data = os.read(self.fd, 1 << 16)
            if not data:
                raise SystemExit("pool closed the channel before sending the config")
            for cfg in self.reader.feed(data):
                return cfg

    def send(self, obj) -> None:
        """Queue a frame for the pool; `flush` writes all queued frames in one go."""
        self.outbox.append(frame(obj))

    def flush(self) -> None:
        data = b"".join(self.outbox)
        self.outbox.clear()
        while data:
            data = data[os.write(self.fd, data) :]

    # -- call lifecycle -------------------------------------------------------------------
    # A call runs in a process forked for it on demand, or, when the executor is idle, in a
    # "spare" forked and confined ahead of time that waits on a pipe for its snippet: the
    # fork then is off the critical path of the next call (lower latency, same total work).
    # Under load, calls start in bursts: compile every startable snippet first, then fork
    # back to back, then do the bookkeeping. Each fork write-protects all of this process's
    # pages, so every page written between two forks is copied once per fork; in a burst
    # that is only the loop's own few pages.
    def start_pending(self) -> None:
        todo = self._compile_pending()
        n_spare = min(len(todo), len(self.spares))
        started = [self._start_in_spare(req, snippet) for req, snippet in todo[:n_spare]]
        started += self._fork_burst(todo[n_spare:])
        now = time.monotonic()
        for call, req in started:
            call.req = req
            call.start = now
            self.seq += 1
            heapq.heappush(self.deadlines, (now + req["timeout"], self.seq, call))

    def _compile_pending(self) -> list[tuple[dict, tuple]]:
        """(request, snippet) for as many pending calls as there is room for; a snippet that
        does not compile is answered at once (it needs no process)."""
        todo = []
        while self.pending and len(todo) < len(self.free) + len(self.spares):
            req = self.pending.popleft()
            try:
                body, last = runner.prepare(req["code"], req["notebook"])
            except Exception as e:  # noqa: BLE001 - SyntaxError, null bytes, too deeply nested...
                message, reason = runner.compile_error(e)
                self.send(
                    {
                        "id": req["id"],
                        "status": "error",
                        "stderr": message,
                        "exit_code": 1,
                        "reason": reason,
                    }
                )
                continue
            todo.append((req, (req["code"], body, last)))
        return todo

    def _start_in_spare(self, req: dict, snippet: tuple) -> tuple[Call, dict]:
        call = self.spares.pop()
        call.slot.reset(req["stdin"])
        data = frame(snippet)
        while data:
            data = data[os.write(call.feed, data) :]
        os.close(call.feed)
        return call, req

    def _fork_burst(self, todo: list[tuple[dict, tuple]]) -> list[tuple[Call, dict]]:
        slots = [self.free.pop() for _ in todo]
        for slot, (req, _) in zip(slots, todo):
            slot.reset(req["stdin"])
        pids = []
        for slot, (_, snippet) in zip(slots, todo):  # nothing else between the forks (see above)
            pid = os.fork()
            if pid == 0:
                self._child(slot, snippet, -1)
            pids.append(pid)
        return [(self._track(pid, slot), req) for pid, slot, (req, _) in zip(pids, slots, todo)]

    def _fork_spare(self, slot: Slot) -> Call:
        """A process for `slot` that confines itself once it has read its snippet from a pipe."""
        feed_r, feed_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            self._child(slot, None, feed_r)
        os.close(feed_r)
        call = self._track(pid, slot)
        call.feed = feed_w
        return call

    def _track(self, pid: int, slot: Slot) -> Call:
        call = Call(None, slot)
        call.pid = pid
        call.pidfd = os.pidfd_open(pid)  # readable when the call exits: no SIGCHLD handler needed
        self.poller.register(call.pidfd, select.POLLIN)
        self.running[pid] = call
        return call

    def _child(self, slot: Slot, snippet, feed_r: int) -> None:
        code = SETUP_FAILED
        try:
            os.setsid()
            os.mkdir(slot.workdir, 0o700)
            if slot.uid is not None:
                os.chown(slot.workdir, slot.uid, slot.uid)
            os.chdir(slot.workdir)
            for fd, target in (
                (slot.stdin, 0),
                (slot.out, 1),
                (slot.err, 2),
                (slot.meta, 3),
                (feed_r, 4),
            ):
                if fd >= 0:
                    os.dup2(fd, target)
            os.closerange(5 if feed_r >= 0 else 4, 1 << 20)
            if snippet is None:  # a spare: wait for the snippet, or for the executor to go away
                reader = FrameReader()
                while snippet is None:
                    data = os.read(4, 1 << 20)
                    if not data:
                        os._exit(0)
                    snippet = next(reader.feed(data), None)
                os.close(4)
            # only now: a process has a call uid only while it runs a call
            confine(slot.uid, self.limits)
            source, body, last = snippet
            code = runner.run(source, body, last, 3, self.cfg["max_output_bytes"])
        except BaseException as e:  # noqa: BLE001 - report, never fall back into the server loop
            os.write(2, f"sandbox setup failed: {e!r}\n".encode())
        os._exit(code)

    def refill_spares(self) -> None:
        if not self.pending and self.free and len(self.spares) < self.cfg["spares_per_executor"]:
            self.spares.append(self._fork_spare(self.free.pop()))

    def expire(self) -> None:
        now = time.monotonic()
        while self.deadlines and self.deadlines[0][0] <= now:
            _, _, call = heapq.heappop(self.deadlines)
            if not call.done:
                call.timed_out = True
                self._kill(call)

    def _kill(self, call: Call) -> None:
        try:
            os.killpg(call.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if call.slot.uid is not None:
            sweep(call.slot.uid)

    def reap(self) -> None:
        while True:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            call = self.running.pop(pid, None)
            if call is not None:  # else: an orphan a sweep killed, re-parented to us
                self.finish(call, status, usage.ru_utime + usage.ru_stime)

    def finish(self, call: Call, status: int, cpu_s: float) -> None:
        call.done = True
        wall = time.monotonic() - call.start
        self.poller.unregister(call.pidfd)
        os.close(call.pidfd)
        slot = call.slot
        self._kill(call)  # whatever the call started dies before we read its output
        cap = self.cfg["max_output_bytes"]
        stdout, cut_out = _read_capped(slot.out, cap)
        stderr, cut_err = _read_capped(slot.err, cap)
        meta = os.pread(slot.meta, cap + 2048, 0).decode("utf-8", "replace")
        slot.clean()
        self.free.append(slot)
        # a spare that died unused (killed at shutdown, say): nothing to report
        if call.req is None:
            if call in self.spares:
                self.spares.remove(call)
                os.close(call.feed)
            return
        result = {
            "id": call.req["id"],
            "stdout": stdout,
            "stderr": stderr,
            "truncated": cut_out or cut_err,
            "wall_s": wall,
            "cpu_s": cpu_s,
        }
        result.update(self.classify(call, status, meta, cpu_s))
        self.send(result)

    def classify(self, call: Call, status: int, meta: str, cpu_s: float) -> dict:
        if os.WIFEXITED(status):
            code = os.WEXITSTATUS(status)
            if code == 0:
                return {
                    "exit_code": 0,
                    "status": "ok",
                    "value": meta[1:] if meta.startswith("V") else None,
                }
            if code == SETUP_FAILED and not meta:
                return {
                    "exit_code": code,
                    "status": "killed",
                    "reason": "the sandbox could not set up the call",
                }
            reason = meta[1:] if meta.startswith("E") else f"exit code {code}"
            if reason.startswith("MemoryError"):
                reason = f"MemoryError: memory limit of {self.cfg['memory_mb']} MiB exceeded"
            # EFBIG: Python ignores SIGXFSZ, so the write raised instead
            elif "[Errno 27]" in reason:
                return {
                    "exit_code": code,
                    "status": "killed",
                    "reason": f"output or file size limit of {self.cfg['file_size_mb']} MiB "
                    "exceeded",
                }
            return {"exit_code": code, "status": "error", "reason": reason}
        sig = os.WTERMSIG(status)
        if call.timed_out:
            return {
                "signal": sig,
                "status": "timeout",
                "reason": f"wall-clock limit of {call.req['timeout']:g}s exceeded",
            }
        if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu_s >= self.cfg["cpu_time_s"]):
            return {
                "signal": sig,
                "status": "timeout",
                "reason": f"CPU time limit of {self.cfg['cpu_time_s']}s exceeded",
            }
        if sig == signal.SIGXFSZ:
            return {
                "signal": sig,
                "status": "killed",
                "reason": f"output or file size limit of {self.cfg['file_size_mb']} MiB exceeded",
            }
        return {
            "signal": sig,
            "status": "killed",
            "reason": f"terminated by {signal.Signals(sig).name}",
        }

    # -- main loop ------------------------------------------------------------------------
    def serve(self) -> None:
        self.poller.register(self.fd, select.POLLIN)
        self.send(
            {
                "hello": os.getpid(),
                "flavour": self.flavour,
                "warnings": self.warnings,
                "privileged": self.privileged,
                "huge_pages": self.huge_pages,
            }
        )
        self.flush()
        while True:
            timeout = (
                max(0.0, self.deadlines[0][0] - time.monotonic()) * 1000 if self.deadlines else None
            )
            for fd, _ in self.poller.poll(timeout):
                if fd == self.fd:
                    try:
                        data = os.read(self.fd, 1 << 20)
                    except ConnectionResetError:  # the pool closed with our results unread
                        data = b""
                    if not data:
                        return self.shutdown()
                    self.pending.extend(self.reader.feed(data))
            self.reap()
            self.expire()
            self.flush()  # results first: they are what callers wait on
            self.start_pending()
            self.flush()
            self.refill_spares()

    def shutdown(self) -> None:
        for call in list(self.running.values()):
            self._kill(call)
        os._exit(0)


if __name__ == "__main__":
    flavour, uid_start, fd = sys.argv[1:]
    Executor(flavour, int(uid_start), int(fd)).serve()
