"""Spreading generation over N engine replicas: the KV-aware balanced scheduler, and the
static equal split (the public release's behaviour) to compare with.

Balanced: every generation request (one assistant turn) reserves KV cache for its context
plus its max new tokens; a new rollout is dispatched from one shared queue to the replica
with the most free KV that can hold it, a later turn goes to the replica that holds its
prefix, or, when that one is full, to one with room (see `plan_dispatch`), so no replica is
ever over-committed (no evictions, by construction).
The reservation is released when the turn ends, so a rollout waiting on a tool call holds
nothing and the replica keeps generating others. A replica that dies has
its requests re-queued to the others; so has one that stays alive but answers nothing for
`stall_timeout_s` while it holds requests (a wedged engine raises no error: without this the
stage would wait for ever).

Both schedulers are engines themselves (`generate(request_id, prompt_ids, params)`), so the
agent loop runs on top of either unchanged.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from rstar.agent.loop import Generation, rollout_id_of

log = logging.getLogger(__name__)


def plan_dispatch(
    free: list[int], alive: list[bool], resumed: list[tuple[int, int | None]], fresh: Iterable[int]
) -> tuple[list[int | None], list[int]]:
    """Where waiting requests go now. `resumed`: (KV tokens needed, home replica or None) of
    requests of rollouts in progress; `fresh`: KV tokens needed by new rollouts, in arrival
    order. Returns a replica or None (it keeps waiting) for each resumed request, and the
    replicas of the new rollouts placed, a prefix of `fresh`. Each placement is taken off `free`.

    1. A rollout in progress goes to its home, where its prefix is cached, if it fits there.
    2. If it does not, its home is held: no other work takes the room freed there. The request
       moves to the unheld replica with the most free KV that fits, recomputing its context
       there, which costs less than waiting on a full replica (and lets the end of a batch
       spread over the replicas that have run dry); if none fits, it waits at home.
    3. New rollouts, first come first served, go to the unheld replica with the most free KV."""
    placed: list[int | None] = [None] * len(resumed)
    held = set()
    for k, (need, home) in enumerate(resumed):
        if home is not None and alive[home]:
            if free[home] >= need:
                placed[k] = home
                free[home] -= need
            else:
                held.add(home)
    open_ = [i for i in range(len(free)) if alive[i] and i not in held]
    best = max(open_, key=free.__getitem__, default=None)

    def take(need: int) -> int | None:
        nonlocal best
        if best is None or free[best] < need:  # the roomiest open replica fits, or none does
            return None
        i = best
        free[i] -= need
        best = max(open_, key=free.__getitem__)
        return i

    for k, (need, _) in enumerate(resumed):
        if placed[k] is None:
            placed[k] = take(need)
    new = []
    for need in fresh:
        i = take(need)
        if i is None:
            break
        new.append(i)
    return placed, new


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
    capacity: int  # KV cache tokens
    reserved: int = 0
    alive: bool = True
    served: int = 0
    inflight: set = field(default_factory=set)
    last_progress: float = 0.0  # monotonic: its last answer, or when it last went from idle to busy

    @property
    def free(self) -> int:
        return self.capacity - self.reserved


class ReplicaLost(Exception):
    pass


class ReplicaStalled(Exception):
    pass


class BalancedScheduler:
    """`chunk_tokens`: generate a turn in requests of at most that many new tokens, each
    reserving only its own chunk and continuing from the tokens so far (token in, token out),
    so a replica reserves for what is being generated rather than for the whole budget; worth
    it with an engine whose prefix cache makes the continuation's prefill cheap (vLLM).

    `stall_timeout_s`: a replica holding requests that answers none of them for this long is
    treated as dead. The default is far above any one answer of a working replica (a chunk of
    2,048 tokens, or a tiny recipe's whole turn) and well below "the run looks hung"."""

    def __init__(
        self,
        engines: list,
        capacity_tokens: int | list[int],
        *,
        max_attempts: int = 3,
        chunk_tokens: int | None = None,
        stall_timeout_s: float = 600.0,
    ) -> None:
        caps = (
            capacity_tokens
            if isinstance(capacity_tokens, list)
            else [capacity_tokens] * len(engines)
        )
        self.replicas = [ReplicaSlot(e, c) for e, c in zip(engines, caps)]
        self.largest = max(caps)
        # Two queues, so an event costs the same however many new rollouts wait: `waiting` holds
        # the requests of rollouts in progress (scanned at every event; they are few, bounded by
        # the rollouts in progress), `fresh` the first requests of new rollouts, first come
        # first served (only its head is looked at).
        self.waiting: list[_Request] = []
        self.fresh: collections.deque[_Request] = collections.deque()
        self.home: dict[str, int] = {}  # rollout in progress -> the replica holding its prefix
        self.max_attempts = max_attempts
        self.chunk_tokens = chunk_tokens
        self.stall_timeout_s = stall_timeout_s
        self.requeued = 0

    @property
    def served(self) -> list[int]:
        """Requests answered, per replica."""
        return [r.served for r in self.replicas]

    async def generate(
        self, request_id: str, prompt_ids: list[int], sampling_params: dict
    ) -> Generation:
        budget = int(sampling_params["max_tokens"])
        if not self.chunk_tokens:
            return await self._generate(request_id, prompt_ids, sampling_params)
        out = Generation([], [], [])
        for k in itertools.count():
            n = min(self.chunk_tokens, budget - len(out.token_ids))
            gen = await self._generate(
                f"{request_id}.{k}",
                prompt_ids + out.token_ids,
                {**sampling_params, "max_tokens": n},
            )
            out.token_ids += gen.token_ids
            out.log_probs += gen.log_probs
            out.entropies = out.entropies + gen.entropies if gen.entropies is not None else None
            out.stop_reason = gen.stop_reason
            if gen.stop_reason != "length" or len(out.token_ids) >= budget:
                return out

    async def _generate(
        self, request_id: str, prompt_ids: list[int], sampling_params: dict
    ) -> Generation:
        need = len(prompt_ids) + int(sampling_params["max_tokens"])
        if need > self.largest:
            raise ValueError(
                f"request {request_id} needs {need} KV tokens; the largest replica holds "
                f"{self.largest}"
            )
        req = _Request(
            request_id,
            list(prompt_ids),
            dict(sampling_params),
            need,
            asyncio.get_running_loop().create_future(),
        )
        (self.waiting if rollout_id_of(request_id) in self.home else self.fresh).append(req)
        self._dispatch()
        return await req.future

    def finished(self, rollout: str) -> None:
        """The rollout has ended: forget its home (called by the agent loop), so a long run's
        memory does not grow with the rollouts it has served."""
        self.home.pop(rollout, None)

    def _dispatch(self) -> None:
        resumed = []
        for req in self.waiting:
            home = self.home.get(rollout_id_of(req.request_id))
            if home is not None and self.replicas[home].capacity < req.need:
                home = None  # it outgrew that replica altogether: waiting there would be forever
            resumed.append(home)
        homes, new = plan_dispatch(
            [r.free for r in self.replicas],
            [r.alive for r in self.replicas],
            [(req.need, home) for req, home in zip(self.waiting, resumed)],
            (req.need for req in self.fresh),  # consumed only as far as it places
        )
        placed = [(req, i) for req, i in zip(self.waiting, homes) if i is not None]
        self.waiting = [req for req, i in zip(self.waiting, homes) if i is None]
        placed += [(self.fresh.popleft(), i) for i in new]
        for req, i in placed:
            self._start(i, req)
        if (self.waiting or self.fresh) and not any(r.alive for r in self.replicas):
            for req in [*self.waiting, *self.fresh]:
                req.future.set_exception(ReplicaLost("no replica is alive"))
            self.waiting, self.fresh = [], collections.deque()

    def _start(self, i: int, req: _Request) -> None:
        rep = self.replicas[i]
        if not rep.inflight:
            rep.last_progress = time.monotonic()
        rep.reserved += req.need
        rep.inflight.add(req.request_id)
        self.home[rollout_id_of(req.request_id)] = i
        asyncio.ensure_future(self._run(i, req))

    async def _run(self, i: int, req: _Request) -> None:
        rep = self.replicas[i]
        try:
            gen = await self._answer(i, req)
        except Exception as e:  # noqa: BLE001 - a dead replica: its requests go elsewhere
            log.warning("replica %d failed (%r); re-queueing %s", i, e, req.request_id)
            rep.alive = False
            req.attempts += 1
            if req.attempts >= self.max_attempts:
                req.future.set_exception(ReplicaLost(f"{req.request_id}: {e!r}"))
            else:
                self.requeued += 1
                self.waiting.insert(0, req)
        else:
            rep.served += 1
            rep.last_progress = time.monotonic()
            req.future.set_result(gen)
        finally:
            rep.reserved -= req.need
            rep.inflight.discard(req.request_id)
            self._dispatch()

    async def _answer(self, i: int, req: _Request) -> Generation:
        """The replica's answer, or ReplicaStalled once it has answered nothing for
        `stall_timeout_s` (any answer of it, to this request or another, counts)."""
        rep = self.replicas[i]
        call = asyncio.ensure_future(
            rep.engine.generate(req.request_id, req.prompt_ids, req.params)
        )
        while True:
            silent = time.monotonic() - rep.last_progress
            done, _ = await asyncio.wait({call}, timeout=max(self.stall_timeout_s - silent, 0.0))
            if done:
                return call.result()
            if time.monotonic() - rep.last_progress >= self.stall_timeout_s:
                call.cancel()
                raise ReplicaStalled(
                    f"replica {i} ({type(rep.engine).__name__}) answered none of its "
                    f"{len(rep.inflight)} requests for {self.stall_timeout_s:.0f} s"
                )


class StaticScheduler:
    """The baseline: rollouts split equally over replicas up front (round robin by rollout),
    every replica takes all it is given at once, whatever its KV cache holds."""

    def __init__(self, engines: list) -> None:
        self.engines = engines
        self.assigned: dict[str, int] = {}
        self.served = [0] * len(engines)  # requests answered, per engine

    async def generate(
        self, request_id: str, prompt_ids: list[int], sampling_params: dict
    ) -> Generation:
        rollout = rollout_id_of(request_id)
        i = self.assigned.setdefault(rollout, len(self.assigned) % len(self.engines))
        gen = await self.engines[i].generate(request_id, prompt_ids, sampling_params)
        self.served[i] += 1
        return gen
