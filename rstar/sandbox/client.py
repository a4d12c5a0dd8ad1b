"""Async client of a sandbox service, with batching, back-pressure, retries and deadlines.

    async with SandboxClient("http://127.0.0.1:8080") as sb:
        r = await sb.run("print(sum(range(10)))")            # batched with concurrent calls
        rs = await sb.run_many([ExecRequest("1+1"), ExecRequest("input()", stdin="x")])

Concurrent `run` calls are sent together (up to `batch_size`, or after `batch_window_ms`), and
each is answered as soon as it ends (the service's streaming API), not with its batch's slowest.
At most `max_inflight` calls are outstanding; more wait (back-pressure). A batch that fails
in transit (connection refused or reset, 5xx) is retried with backoff (doubling, capped at
`max_backoff_s`) for as long as one of its calls still waits: until each call's `deadline_s`,
or for `retry_for_s` for calls without one (a restarted service is back in seconds; a fixed
number of tries gave up on calls that still had time). The service is idempotent per call, so
a call lost with a dead worker is run again.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable
from functools import partial

import aiohttp

from rstar.sandbox.result import (
    JSON_HEADERS,
    ExecRequest,
    ExecResult,
    ExecuteBody,
    Status,
    decode_answer,
    decode_results,
    encode_json,
)


class SandboxUnreachable(RuntimeError):
    """The sandbox service does not answer its health check."""


STREAM_PATH = "/v1/execute/stream"
# a line of the stream holds one result, whose output the sandbox caps well below this
STREAM_LINE_BYTES = 1 << 24


async def read_answers(resp: aiohttp.ClientResponse, deliver: Callable[[int, ExecResult], None]):
    """`deliver(index, result)` for each line of a streaming answer (STREAM_PATH), as it
    arrives; returns when the service ends the stream."""
    while line := await resp.content.readline():
        if line.strip():
            answer = decode_answer(line)
            deliver(answer.index, answer.result)


def check_health(url: str, timeout_s: float = 10.0) -> None:
    """Raise SandboxUnreachable, naming the URL, unless the service answers /health with 200."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/health", timeout=timeout_s) as resp:
            if resp.status == 200:
                return
            reason = f"HTTP {resp.status}"
    except urllib.error.HTTPError as e:  # it answers, but cannot run calls (503: no live node)
        try:
            state = json.loads(e.read())
            reason = (
                f"HTTP {e.code}: status {state['status']}, {len(state['nodes'])} node(s), "
                f"capacity {state['capacity']}"
            )
        except (ValueError, KeyError, TypeError):
            reason = f"HTTP {e.code}"
    except (urllib.error.URLError, OSError) as e:
        reason = str(getattr(e, "reason", e))
    raise SandboxUnreachable(
        f"sandbox service {url} does not answer its health check ({reason}): start it (rstar "
        "sandbox serve) or fix sandbox_url; an RL stage without it would train on error responses"
    )


def _settle(batch: list[tuple[ExecRequest, asyncio.Future]], attempt: int, i: int, res: ExecResult):
    """The answer to call `i` of a batch sent on retry number `attempt`."""
    res.attempts += attempt
    if not batch[i][1].done():
        batch[i][1].set_result(res)


class SandboxClient:
    def __init__(
        self,
        url: str,
        *,
        batch_size: int = 64,
        batch_window_ms: float = 2.0,
        max_inflight: int = 4096,
        retry_for_s: float = 60.0,
        backoff_s: float = 0.2,
        max_backoff_s: float = 2.0,
        request_timeout_s: float = 900.0,
        stream: bool = True,
    ) -> None:
        self.url = url.rstrip("/")
        # each call of a batch answered as it ends (STREAM_PATH), or the batch when all have
        self.stream = stream
        self.batch_size, self.window = batch_size, batch_window_ms / 1000
        self.retry_for_s, self.backoff_s, self.max_backoff_s = retry_for_s, backoff_s, max_backoff_s
        self._inflight = asyncio.Semaphore(max_inflight)
        self._queue: asyncio.Queue[tuple[ExecRequest, asyncio.Future]] = asyncio.Queue()
        self._timeout = aiohttp.ClientTimeout(total=request_timeout_s, connect=5.0)
        self._http: aiohttp.ClientSession | None = None
        self._batcher: asyncio.Task | None = None
        self._sending: set[asyncio.Task] = set()
        self.batches_sent = 0

    async def __aenter__(self) -> SandboxClient:
        self._http = aiohttp.ClientSession(
            timeout=self._timeout,
            connector=aiohttp.TCPConnector(limit=64),
            read_bufsize=STREAM_LINE_BYTES,
        )
        self._batcher = asyncio.create_task(self._batch_loop())
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        if self._batcher:
            self._batcher.cancel()
        for t in list(self._sending):
            t.cancel()
        await asyncio.gather(*self._sending, return_exceptions=True)
        if self._http:
            await self._http.close()

    async def run(
        self,
        code: str,
        stdin: str = "",
        *,
        timeout_s: float | None = None,
        notebook: bool = True,
        deadline_s: float | None = None,
    ) -> ExecResult:
        return await self._one(ExecRequest(code, stdin, timeout_s, notebook), deadline_s)

    async def run_many(
        self, reqs: list[ExecRequest], *, deadline_s: float | None = None
    ) -> list[ExecResult]:
        return list(await asyncio.gather(*(self._one(r, deadline_s) for r in reqs)))

    async def _one(self, req: ExecRequest, deadline_s: float | None) -> ExecResult:
        async with self._inflight:
            fut = asyncio.get_running_loop().create_future()
            if self.batch_size == 1:  # nothing to batch: send now, skipping the batcher's task hops
                self._spawn_send([(req, fut)])
            else:
                self._queue.put_nowait((req, fut))
            if deadline_s is None:
                return await fut
            try:
                return await asyncio.wait_for(asyncio.shield(fut), deadline_s)
            except TimeoutError:
                fut.cancel()  # nobody waits for it now: the sender stops retrying it
                return ExecResult(
                    status=Status.TIMEOUT, reason=f"client deadline of {deadline_s:g}s exceeded"
                )

    async def health(self) -> dict:
        """The service's state; its /health answers 503 with it while no node can run calls."""
        async with self._http.get(f"{self.url}/health") as resp:
            if resp.status not in (200, 503):
                resp.raise_for_status()
            return await resp.json()

    async def stats(self) -> dict:
        async with self._http.get(f"{self.url}/stats", raise_for_status=True) as resp:
            return await resp.json()

    async def _batch_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self._queue.get()]
            deadline = loop.time() + self.window
            while len(batch) < self.batch_size:
                remaining = deadline - loop.time()
                try:
                    batch.append(
                        self._queue.get_nowait()
                        if remaining <= 0 or not self._queue.empty()
                        else await asyncio.wait_for(self._queue.get(), remaining)
                    )
                except (TimeoutError, asyncio.QueueEmpty):
                    break
            self.batches_sent += 1
            self._spawn_send(batch)

    def _spawn_send(self, batch: list[tuple[ExecRequest, asyncio.Future]]) -> None:
        task = asyncio.ensure_future(self._send(batch))
        self._sending.add(task)  # keep a reference until done, and cancel it on close()
        task.add_done_callback(self._sending.discard)

    async def _send(self, batch: list[tuple[ExecRequest, asyncio.Future]]) -> None:
        loop = asyncio.get_running_loop()
        give_up, error, attempt = loop.time() + self.retry_for_s, "", 0
        while True:
            # a call past its deadline is cancelled
            waiting = [(r, fut) for r, fut in batch if not fut.done()]
            if not waiting:
                return
            deliver = partial(_settle, waiting, attempt)
            try:
                body = encode_json(ExecuteBody([r for r, _ in waiting]))
                path = STREAM_PATH if self.stream else "/v1/execute"
                async with self._http.post(
                    f"{self.url}{path}", data=body, headers=JSON_HEADERS
                ) as resp:
                    if 400 <= resp.status < 500:
                        detail = (await resp.json()).get("detail")
                        for i in range(len(waiting)):
                            deliver(i, ExecResult.rejected(f"HTTP {resp.status}: {detail}"))
                        return
                    if resp.status < 400 and self.stream:
                        await read_answers(resp, deliver)
                        if all(fut.done() for _, fut in waiting):
                            return
                        error = "the service ended its answer early"
                    elif resp.status < 400:
                        for i, res in enumerate(decode_results(await resp.read()).results):
                            deliver(i, res)
                        return
                    else:
                        error = f"HTTP {resp.status}"
            except (TimeoutError, aiohttp.ClientError) as e:
                error = repr(e)
            attempt += 1
            if loop.time() >= give_up:
                break
            delay = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1)) * (
                0.5 + random.random()
            )
            await asyncio.sleep(min(delay, max(0.0, give_up - loop.time())))
        for _, fut in batch:
            if not fut.done():
                fut.set_result(
                    ExecResult.rejected(
                        f"sandbox unreachable for {self.retry_for_s:g}s ({attempt} tries): {error}"
                    )
                )
