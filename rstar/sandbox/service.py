"""The sandbox service: one central queue, send workers that batch calls, and nodes that run them.

A node is either this machine's executors (`LocalNode`) or another sandbox service
reached over HTTP (`RemoteNode`): a head service can spread calls over many CPU machines.
A batch whose node dies is put back on the queue and runs elsewhere; no call is lost.

    async with SandboxService(SandboxConfig()) as sb:
        result = await sb.run("print(2**100)")
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

from rstar.sandbox.client import STREAM_LINE_BYTES, STREAM_PATH, read_answers
from rstar.sandbox.config import SandboxConfig
from rstar.sandbox.pool import ExecutorPool
from rstar.sandbox.result import (
    JSON_HEADERS,
    ExecRequest,
    ExecResult,
    ExecuteBody,
    Status,
    decode_results,
    encode_json,
)

log = logging.getLogger(__name__)


class NodeLost(Exception):
    pass


Deliver = Callable[[int, ExecResult], None]  # (index of the call in its batch, its result)


class LocalNode:
    def __init__(self, cfg: SandboxConfig) -> None:
        self.name = "local"
        self.pool = ExecutorPool(cfg)
        self.alive = False
        self.inflight = 0

    @property
    def capacity(self) -> int:
        return self.pool.capacity

    async def start(self) -> None:
        await self.pool.start()
        self.alive = True

    async def close(self) -> None:
        self.alive = False
        await self.pool.close()

    async def run_batch(self, reqs: list[ExecRequest]) -> list[ExecResult]:
        return await self.pool.run_many(reqs)

    async def run_stream(self, reqs: list[ExecRequest], deliver: Deliver) -> None:
        async def one(i: int, req: ExecRequest) -> None:
            deliver(i, await self.pool.run(req))

        await asyncio.gather(*(one(i, r) for i, r in enumerate(reqs)))

    def describe(self) -> dict:
        return {
            "name": self.name,
            "alive": self.alive,
            "capacity": self.capacity,
            "inflight": self.inflight,
            "executors": {f: sum(h.alive for h in hs) for f, hs in self.pool.executors.items()},
            "executor_restarts": sum(h.restarts for hs in self.pool.executors.values() for h in hs),
            "warnings": self.pool.warnings,
        }


class RemoteNode:
    """Another sandbox service; its own central queue and executors do the work."""

    def __init__(self, url: str, capacity: int = 256, silence_s: float = 300.0) -> None:
        self.name = self.url = url.rstrip("/")
        self.capacity = capacity
        self.silence_s = silence_s  # SandboxConfig.node_silence_s
        self.alive = True
        self.inflight = 0
        self.http: aiohttp.ClientSession | None = None

    def _session(self) -> aiohttp.ClientSession:
        if self.http is None:
            self.http = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, connect=5.0),
                read_bufsize=STREAM_LINE_BYTES,
            )
        return self.http

    async def start(self) -> None:
        await self.probe()

    async def close(self) -> None:
        if self.http:
            await self.http.close()

    async def probe(self) -> bool:
        try:
            async with self._session().get(
                f"{self.url}/health",
                timeout=aiohttp.ClientTimeout(total=5.0),
                raise_for_status=True,
            ) as r:
                self.capacity = max(1, int((await r.json()).get("capacity", self.capacity)))
            self.alive = True
        except (TimeoutError, aiohttp.ClientError, ValueError):
            self.alive = False
        return self.alive

    @contextlib.asynccontextmanager
    async def _post(self, path: str, reqs: list[ExecRequest]):
        """POST `reqs` to the node and yield its answer; a node that cannot be reached, answers
        5xx or sends nothing for `silence_s` while it holds the calls is lost (NodeLost)."""
        try:
            async with self._session().post(
                f"{self.url}{path}",
                data=encode_json(ExecuteBody(reqs)),
                headers=JSON_HEADERS,
                timeout=aiohttp.ClientTimeout(total=None, connect=5.0, sock_read=self.silence_s),
            ) as r:
                if r.status >= 500:
                    raise NodeLost(f"{self.url}: HTTP {r.status}")
                r.raise_for_status()
                yield r
        except (TimeoutError, aiohttp.ClientConnectionError) as e:
            raise NodeLost(f"{self.url}: {e!r}") from e

    async def run_batch(self, reqs: list[ExecRequest]) -> list[ExecResult]:
        async with self._post("/v1/execute", reqs) as r:
            return decode_results(await r.read()).results

    async def run_stream(self, reqs: list[ExecRequest], deliver: Deliver) -> None:
        """The node answers each call as it ends; those answered before the node is lost stay
        answered (the caller re-queues the rest)."""
        try:
            async with self._post(STREAM_PATH, reqs) as r:
                await read_answers(r, deliver)
        except aiohttp.ClientPayloadError as e:  # the answer cut off mid-stream
            raise NodeLost(f"{self.url}: {e!r}") from e

    def describe(self) -> dict:
        return {
            "name": self.name,
            "alive": self.alive,
            "capacity": self.capacity,
            "inflight": self.inflight,
        }


@dataclass
class _Item:
    req: ExecRequest
    future: asyncio.Future
    enqueued: float
    attempts: int = 0


@dataclass
class Stats:
    """Counters and a sliding window of recent calls for /stats."""

    window_s: float = 10.0
    total: int = 0
    by_status: collections.Counter = field(default_factory=collections.Counter)
    recent: collections.deque = field(default_factory=lambda: collections.deque(maxlen=100_000))
    started: float = field(default_factory=time.monotonic)

    def record(self, result: ExecResult, latency_s: float) -> None:
        self.total += 1
        self.by_status[result.status.value] += 1
        self.recent.append((time.monotonic(), latency_s))

    def snapshot(self) -> dict:
        now = time.monotonic()
        window = [lat for t, lat in self.recent if now - t <= self.window_s]
        span = min(self.window_s, now - self.started) or 1.0
        lat = sorted(window)

        def pct(q: float) -> float | None:
            return round(lat[min(len(lat) - 1, int(q * len(lat)))] * 1e3, 3) if lat else None

        return {
            "calls": self.total,
            "by_status": dict(self.by_status),
            "calls_per_s": round(len(window) / span, 1),
            "latency_ms": {"p50": pct(0.50), "p95": pct(0.95), "p99": pct(0.99)},
        }


def embedded_sandbox() -> SandboxService:
    """The in-process sandbox of the embedded default: one lean and one warm executor."""
    return SandboxService(SandboxConfig(lean_executors=1, warm_executors=1))


class SandboxService:
    """Central queue + send workers + nodes. `local=False` makes a head that only dispatches."""

    def __init__(
        self, cfg: SandboxConfig | None = None, *, local: bool = True, remotes: list[str] = ()
    ) -> None:
        self.cfg = cfg or SandboxConfig()
        self.nodes: list[LocalNode | RemoteNode] = [LocalNode(self.cfg)] if local else []
        self.nodes += [RemoteNode(url, silence_s=self.cfg.node_silence_s) for url in remotes]
        self.queue: asyncio.Queue[_Item] = asyncio.Queue()
        self._admission = asyncio.Semaphore(self.cfg.max_queue)  # calls queued or running, at most
        self.stats = Stats()
        self.requeued = 0
        self._node_ready = asyncio.Event()
        self._batches_inflight = 0
        self._tasks: list[asyncio.Task] = []

    async def __aenter__(self) -> SandboxService:
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def start(self) -> SandboxService:
        await asyncio.gather(*(n.start() for n in self.nodes))
        self._update_ready()
        self._tasks = [
            asyncio.create_task(self._send_worker()) for _ in range(self.cfg.send_workers)
        ]
        self._tasks.append(asyncio.create_task(self._watch_nodes()))
        return self

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(*(n.close() for n in self.nodes), return_exceptions=True)

    def add_remote(self, url: str) -> RemoteNode:
        url = url.rstrip("/")
        for node in self.nodes:
            if isinstance(node, RemoteNode) and node.url == url:
                return node
        node = RemoteNode(url, silence_s=self.cfg.node_silence_s)
        node.alive = False  # the watcher probes it before any call is sent there
        self.nodes.append(node)
        return node

    # -- calls ------------------------------------------------------------------------------
    async def run(
        self, code: str, stdin: str = "", *, timeout_s: float | None = None, notebook: bool = True
    ) -> ExecResult:
        return (await self.run_many([ExecRequest(code, stdin, timeout_s, notebook)]))[0]

    async def run_many(self, reqs: list[ExecRequest]) -> list[ExecResult]:
        return list(await asyncio.gather(*await self.submit(reqs)))

    async def submit(self, reqs: list[ExecRequest]) -> list[asyncio.Future]:
        """Queue `reqs`: a future for each call's result (cancelling one drops its result)."""
        loop = asyncio.get_running_loop()
        futures = []
        for req in reqs:
            # blocks while max_queue calls are outstanding: back-pressure
            await self._admission.acquire()
            item = _Item(req, loop.create_future(), time.monotonic())
            item.future.add_done_callback(lambda _: self._admission.release())
            self.queue.put_nowait(item)
            futures.append(item.future)
        return futures

    @property
    def queue_depth(self) -> int:
        return self.queue.qsize()

    def health(self) -> dict:
        alive = [n for n in self.nodes if n.alive]
        return {
            "status": "ok" if alive else "down",
            "capacity": sum(n.capacity for n in alive),
            "queue_depth": self.queue_depth,
            "nodes": [n.describe() for n in self.nodes],
            "warnings": sorted({w for n in self.nodes for w in n.describe().get("warnings", [])}),
        }

    def stats_snapshot(self) -> dict:
        return {
            **self.stats.snapshot(),
            "queue_depth": self.queue_depth,
            "inflight": sum(n.inflight for n in self.nodes),
            "requeued": self.requeued,
            "nodes_alive": sum(n.alive for n in self.nodes),
        }

    # -- dispatch ---------------------------------------------------------------------------
    async def _next_batch(self) -> list[_Item]:
        batch = [await self.queue.get()]
        deadline = time.monotonic() + self.cfg.batch_window_ms / 1000
        while len(batch) < self.cfg.batch_size:
            try:
                batch.append(self.queue.get_nowait())
                continue
            except asyncio.QueueEmpty:
                pass
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._batches_inflight == 0:
                break  # an idle service sends at once: the window only pays off under load
            try:
                batch.append(await asyncio.wait_for(self.queue.get(), remaining))
            except TimeoutError:
                break
        return batch

    async def _pick_node(self):
        while True:
            alive = [n for n in self.nodes if n.alive]
            if alive:
                return max(alive, key=lambda n: n.capacity - n.inflight)
            self._node_ready.clear()
            await self._node_ready.wait()

    def _update_ready(self) -> None:
        if any(n.alive for n in self.nodes):
            self._node_ready.set()

    async def _send_worker(self) -> None:
        while True:
            await self._dispatch(await self._next_batch())

    async def _dispatch(self, batch: list[_Item]) -> None:
        """Run `batch` on a node, each call answered as the node answers it (`relay`); what a
        lost node left unanswered goes back on the queue."""
        node = await self._pick_node()
        node.inflight += len(batch)
        self._batches_inflight += 1
        waiting = dict(enumerate(batch))  # by index in the batch: not answered yet

        def deliver(i: int, result: ExecResult) -> None:
            item = waiting.pop(i, None)
            if item is None:
                return
            node.inflight -= 1  # its slot is free for the next batch now
            result.attempts += item.attempts
            result.extra["node"] = node.name
            self.stats.record(result, time.monotonic() - item.enqueued)
            if not item.future.done():
                item.future.set_result(result)

        reqs = [i.req for i in batch]
        try:
            if self.cfg.relay == "stream":
                await node.run_stream(reqs, deliver)
            else:
                for i, result in enumerate(await node.run_batch(reqs)):
                    deliver(i, result)
            if waiting:
                raise NodeLost(f"{node.name}: answered {len(batch) - len(waiting)} of {len(batch)}")
        except NodeLost as e:
            log.warning("sandbox node lost, re-queueing %d calls: %s", len(waiting), e)
            node.alive = False
            self._requeue(list(waiting.values()), str(e))
        except Exception as e:
            log.exception("sandbox batch failed")
            for i in list(waiting):
                deliver(
                    i, ExecResult(status=Status.KILLED, reason=f"sandbox internal error: {e!r}")
                )
        finally:
            node.inflight -= len(waiting)
            self._batches_inflight -= 1

    def _requeue(self, batch: list[_Item], why: str) -> None:
        for item in batch:
            item.attempts += 1
            if item.attempts >= self.cfg.max_attempts:
                item.future.set_result(
                    ExecResult(
                        status=Status.KILLED,
                        attempts=item.attempts,
                        reason=f"lost {item.attempts} times with its node: {why}",
                    )
                )
            else:
                self.requeued += 1
                self.queue.put_nowait(item)

    async def _watch_nodes(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            for node in self.nodes:
                if isinstance(node, RemoteNode) and not node.alive and await node.probe():
                    log.info("sandbox node %s is back", node.url)
            self._update_ready()
