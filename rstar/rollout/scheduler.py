"""Spreading generation over N engine replicas: the KV-aware balanced scheduler, and the
static equal split (the public release's behaviour) to compare with.

Balanced: every generation request (one assistant turn) reserves KV cache for its context
plus its max new tokens; a new rollout is dispatched from one shared queue to the replica
with the most free KV that can hold it, a later turn waits for room on the replica that
holds its prefix, so no replica is ever over-committed (no evictions, by construction).
The reservation is released when the turn ends, so a rollout waiting on a tool call holds
nothing and the replica keeps generating others. A replica that dies has
its requests re-queued to the others.

Both schedulers are engines themselves (`generate(request_id, prompt_ids, params)`), so the
agent loop runs on top of either unchanged.
"""
from __future__ import annotations

import asyncio
import collections
import itertools
import logging
from dataclasses import dataclass, field

from rstar.agent.loop import Generation

log = logging.getLogger(__name__)


def choose_replica(free: list[int], alive: list[bool], need: int, home: int | None = None,
                   held: set[int] = frozenset()) -> int | None:
    """The replica a request needing `need` KV tokens goes to now, or None (it waits).

    A request of a rollout in progress has a live `home`, where its prefix is cached: it waits
    for room there, as recomputing its context elsewhere costs more than the wait. A new
    rollout goes to the replica with the most free KV that fits, except `held` ones, where a
    rollout in progress is waiting for room that new work must not take."""
    if home is not None and alive[home]:
        return home if free[home] >= need else None
    fits = [i for i in range(len(free)) if alive[i] and i not in held and free[i] >= need]
    return max(fits, key=lambda i: free[i]) if fits else None


def rollout_of(request_id: str) -> str:
    """Requests of one rollout share the id before the last '/' (the agent loop adds /turn)."""
    return request_id.rsplit("/", 1)[0]


@dataclass
class _Request:
    request_id: str
    prompt_ids: list[int]
    params: dict
    need: int
    future: asyncio.Future
    attempts: int = 0


@dataclass
class ReplicaSlot:
    engine: object
    capacity: int          # KV cache tokens
    reserved: int = 0
    alive: bool = True
    served: int = 0
    inflight: set = field(default_factory=set)

    @property
    def free(self) -> int:
        return self.capacity - self.reserved


class ReplicaLost(Exception):
    pass


class BalancedScheduler:
    """`chunk_tokens`: generate a turn in requests of at most that many new tokens, each
    reserving only its own chunk and continuing from the tokens so far (token in, token out),
    so a replica reserves for what is being generated rather than for the whole budget; worth
    it with an engine whose prefix cache makes the continuation's prefill cheap (vLLM)."""

    def __init__(self, engines: list, capacity_tokens: int | list[int], *, max_attempts: int = 3,
                 chunk_tokens: int | None = None) -> None:
        caps = capacity_tokens if isinstance(capacity_tokens, list) else [capacity_tokens] * len(engines)
        self.replicas = [ReplicaSlot(e, c) for e, c in zip(engines, caps)]
        self.queue: collections.deque[_Request] = collections.deque()
        self.home: dict[str, int] = {}
        self.max_attempts = max_attempts
        self.chunk_tokens = chunk_tokens
        self.requeued = 0

    async def generate(self, request_id: str, prompt_ids: list[int], sampling_params: dict) -> Generation:
        budget = int(sampling_params["max_tokens"])
        if not self.chunk_tokens:
            return await self._generate(request_id, prompt_ids, sampling_params)
        out = Generation([], [], [])
        for k in itertools.count():
            n = min(self.chunk_tokens, budget - len(out.token_ids))
            gen = await self._generate(f"{request_id}.{k}", prompt_ids + out.token_ids,
                                       {**sampling_params, "max_tokens": n})
            out.token_ids += gen.token_ids
            out.log_probs += gen.log_probs
            out.entropies = out.entropies + gen.entropies if gen.entropies is not None else None
            out.stop_reason = gen.stop_reason
            if gen.stop_reason != "length" or len(out.token_ids) >= budget:
                return out

    async def _generate(self, request_id: str, prompt_ids: list[int], sampling_params: dict) -> Generation:
        need = len(prompt_ids) + int(sampling_params["max_tokens"])
        if need > max(r.capacity for r in self.replicas):
            raise ValueError(f"request {request_id} needs {need} KV tokens; the largest replica holds "
                             f"{max(r.capacity for r in self.replicas)}")
        req = _Request(request_id, list(prompt_ids), dict(sampling_params), need,
                       asyncio.get_running_loop().create_future())
        self.queue.append(req)
        self._dispatch()
        return await req.future

    def _dispatch(self) -> None:
        waiting = collections.deque()
        held: set[int] = set()
        while self.queue:  # in arrival order, each placed as soon as it fits (see choose_replica)
            req = self.queue.popleft()
            free = [r.free for r in self.replicas]
            alive = [r.alive for r in self.replicas]
            home = self.home.get(rollout_of(req.request_id))
            if home is not None and self.replicas[home].capacity < req.need:
                home = None  # it outgrew that replica altogether: waiting there would be forever
            i = choose_replica(free, alive, req.need, home, held)
            if i is None:
                waiting.append(req)
                if home is not None and alive[home]:
                    held.add(home)
                continue
            self._start(i, req)
        self.queue = waiting
        if self.queue and not any(r.alive for r in self.replicas):
            while self.queue:
                self.queue.popleft().future.set_exception(ReplicaLost("no replica is alive"))

    def _start(self, i: int, req: _Request) -> None:
        rep = self.replicas[i]
        rep.reserved += req.need
        rep.inflight.add(req.request_id)
        self.home[rollout_of(req.request_id)] = i
        asyncio.ensure_future(self._run(i, req))

    async def _run(self, i: int, req: _Request) -> None:
        rep = self.replicas[i]
        try:
            gen = await rep.engine.generate(req.request_id, req.prompt_ids, req.params)
        except Exception as e:  # noqa: BLE001 - a dead replica: its requests go elsewhere
            log.warning("replica %d failed (%r); re-queueing %s", i, e, req.request_id)
            rep.alive = False
            req.attempts += 1
            if req.attempts >= self.max_attempts:
                req.future.set_exception(ReplicaLost(f"{req.request_id}: {e!r}"))
            else:
                self.requeued += 1
                self.queue.appendleft(req)
        else:
            rep.served += 1
            req.future.set_result(gen)
        finally:
            rep.reserved -= req.need
            rep.inflight.discard(req.request_id)
            self._dispatch()


class StaticScheduler:
    """The baseline: rollouts split equally over replicas up front (round robin by rollout),
    every replica takes all it is given at once, whatever its KV cache holds."""

    def __init__(self, engines: list) -> None:
        self.engines = engines
        self.assigned: dict[str, int] = {}

    async def generate(self, request_id: str, prompt_ids: list[int], sampling_params: dict) -> Generation:
        rollout = rollout_of(request_id)
        i = self.assigned.setdefault(rollout, len(self.assigned) % len(self.engines))
        return await self.engines[i].generate(request_id, prompt_ids, sampling_params)
