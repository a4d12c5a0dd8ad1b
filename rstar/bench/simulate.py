"""A discrete-event model of rollout generation on N replicas, to compare the static equal
split with the KV-aware balanced scheduler at scales this machine cannot run.

A replica decodes in steps: one token for each active request per step, a step taking
`a + c * batch` seconds (calibrated from real timings of the local engine), plus prefill
at `prefill_s_per_token`. Its KV cache holds `capacity` tokens. Static: each replica takes
its equal contiguous share of rollouts at once (whole prompt groups, as in verl); when
their contexts outgrow the cache the newest request is evicted and must recompute its
context later (what vLLM does under over-commit). Balanced: `scheduler.plan_dispatch`
places each request from one shared queue with a worst-case reservation, so there are no
evictions; tool waits hold no reservation. Under both policies a later turn of a rollout
finds its prefix cached on its replica (vLLM's prefix cache; optimistic for static, whose
over-commit would often have reused those blocks) unless it was evicted, or moved to
another replica, where it is recomputed.
Tokens advance in chunks of `chunk` per event to keep the model fast.
"""

from __future__ import annotations

import collections
import heapq
import math
import random
from dataclasses import dataclass, field

from rstar.rollout.scheduler import plan_dispatch


@dataclass
class Workload:
    # per rollout: [(tokens generated this turn, tool wait after it)]
    turns: list[list[tuple[int, float]]]
    prompt_tokens: int = 300
    tool_tokens: int = 120  # tokens of each tool response
    max_response: int = 12_288

    @classmethod
    def long_tail(
        cls,
        rollouts: int,
        seed: int = 0,
        lo: int = 1024,
        hi: int = 12_288,
        group: int = 32,
        prompt_sigma: float = 0.6,
        sample_sigma: float = 0.45,
    ) -> Workload:
        """Rollouts in groups of `group` samples of one prompt (the paper samples 32 and keeps 16),
        stored contiguously as verl stores them (`repeat(interleave=True)`). Length depends on the
        problem: each prompt draws a median length (log-normal around 2.5K), its samples vary around
        it; clipped to lo-hi."""
        rng = random.Random(seed)
        turns = []
        for i in range(rollouts):
            if i % group == 0:
                median = rng.lognormvariate(math.log(2500), prompt_sigma)
            total = int(min(hi, max(lo, rng.lognormvariate(math.log(median), sample_sigma))))
            k = rng.randint(1, 6)
            cuts = sorted(rng.sample(range(1, total), k - 1)) if k > 1 else []
            sizes = [b - a for a, b in zip([0] + cuts, cuts + [total])]
            turns.append(
                [(s, rng.uniform(0.05, 2.0) if j < k - 1 else 0.0) for j, s in enumerate(sizes)]
            )
        return cls(turns)

    @property
    def total_tokens(self) -> int:
        return sum(n for r in self.turns for n, _ in r)


@dataclass
class ReplicaModel:
    a: float  # seconds per decode step, fixed part
    c: float  # seconds per decode step per sequence in the batch
    prefill_s_per_token: float
    capacity: int  # KV cache tokens

    def step(self, batch: int) -> float:
        return self.a + self.c * batch


@dataclass(eq=False)
class _Req:
    rollout: int
    turn: int
    context: int  # tokens in its context (grows as it decodes)
    remaining: int  # tokens still to generate this turn
    need: int  # balanced: KV tokens reserved (context + the most this request may generate)
    quota: int  # tokens this request may still generate (a generation chunk, or the budget)
    cached: bool = False  # its context is in the KV cache (False: prefill, or recompute)
    recompute: bool = False  # its cached context was lost (evicted, or the rollout moved replica)


@dataclass
class _Replica:
    active: list = field(default_factory=list)
    # static: its share, not admitted yet (or evicted)
    waiting: collections.deque = field(default_factory=collections.deque)
    reserved: int = 0
    busy_time: float = 0.0
    running: bool = False

    def used(self) -> int:
        return sum(r.context for r in self.active)


@dataclass
class Result:
    policy: str
    replicas: int
    makespan_s: float
    idle_fraction: float
    evictions: int
    recomputed_tokens: int
    max_kv_use: float  # peak KV in use / capacity
    moved: int = 0  # requests of rollouts in progress moved off a full replica


def simulate(
    work: Workload,
    model: ReplicaModel,
    replicas: int,
    policy: str,
    chunk: int = 64,
    gen_chunk: int = 0,
) -> Result:
    """`gen_chunk` > 0 (balanced only): a turn is generated in requests of at most that many
    tokens, each reserving only its own chunk (BalancedScheduler's `chunk_tokens`)."""
    if policy not in ("static", "balanced"):
        raise ValueError(f"policy must be 'static' or 'balanced', not {policy!r}")
    reps = [_Replica() for _ in range(replicas)]
    events: list = []
    counter = 0
    # balanced, the shared queue: new rollouts (all alike, first come first served), and requests of
    # rollouts in progress, which go back to the replica holding their prefix, or move when it is
    # full
    fresh: collections.deque[_Req] = collections.deque()
    resumed: list[_Req] = []
    home: dict[int, int] = {}
    stats = {"evictions": 0, "recomputed": 0, "moved": 0, "peak": 0.0, "done_at": 0.0}

    def push(t: float, kind: str, payload) -> None:
        nonlocal counter
        counter += 1
        heapq.heappush(events, (t, counter, kind, payload))

    def request(r: int, turn: int, context: int, remaining: int | None = None) -> _Req:
        remaining = work.turns[r][turn][0] if remaining is None else remaining
        # the workload's turns fit the budget; tool tokens aside, so never below what is left
        budget = max(remaining, work.max_response - (context - work.prompt_tokens))
        quota = min(gen_chunk, budget) if gen_chunk and policy == "balanced" else budget
        # a later request of a rollout finds its prefix in its replica's prefix cache
        return _Req(
            r, turn, context, remaining, context + quota, quota, cached=context > work.prompt_tokens
        )

    def kick(i: int, now: float) -> None:
        if (reps[i].active or reps[i].waiting) and not reps[i].running:
            reps[i].running = True
            push(now, "step", i)

    alive = [True] * replicas

    def place(i: int, req: _Req, now: float) -> None:
        # moved off a full replica: recompute its context here
        if home.setdefault(req.rollout, i) != i:
            home[req.rollout] = i
            req.cached, req.recompute = False, True
            stats["moved"] += 1
        reps[i].reserved += req.need
        reps[i].active.append(req)
        kick(i, now)

    def dispatch(now: float) -> None:
        free = [model.capacity - r.reserved for r in reps]
        homes, new = plan_dispatch(
            free,
            alive,
            [(req.need, home[req.rollout]) for req in resumed],
            (req.need for req in fresh),
        )
        waiting = []
        for req, i in zip(resumed, homes):
            if i is None:
                waiting.append(req)
            else:
                place(i, req, now)
        resumed[:] = waiting
        for i in new:
            place(i, fresh.popleft(), now)

    def submit(req: _Req, now: float) -> None:
        if policy == "static":
            # contiguous equal chunks, as verl's AgentLoopManager splits a batch (DataProto.chunk)
            i = home.setdefault(req.rollout, req.rollout * replicas // len(work.turns))
            reps[i].waiting.append(req)
            kick(i, now)
        else:
            (resumed if req.rollout in home else fresh).append(req)
            dispatch(now)

    for r in range(len(work.turns)):
        submit(request(r, 0, work.prompt_tokens), 0.0)

    while events:
        now, _, kind, payload = heapq.heappop(events)
        if kind == "tool_done":
            submit(request(*payload), now)
            continue
        rep = reps[payload]
        used = rep.used()
        if policy == "static":  # like vLLM: admit while the *current* contexts fit
            while rep.waiting and used + rep.waiting[0].context <= model.capacity:
                rep.active.append(rep.waiting.popleft())
                used += rep.active[-1].context
        if not rep.active:
            rep.running = False
            continue
        n = min(chunk, min(min(req.remaining, req.quota) for req in rep.active))
        if policy == "static":  # growth past the cache evicts the newest; it recomputes later
            while used + n * len(rep.active) > model.capacity and len(rep.active) > 1:
                victim = rep.active.pop()
                used -= victim.context
                victim.cached, victim.recompute = False, True
                rep.waiting.appendleft(victim)
                stats["evictions"] += 1
        prefill = 0
        for req in rep.active:
            if not req.cached:
                prefill += req.context
                stats["recomputed"] += req.context if req.recompute else 0
                req.cached, req.recompute = True, False
        stats["peak"] = max(stats["peak"], (used + n * len(rep.active)) / model.capacity)
        dt = n * model.step(len(rep.active)) + prefill * model.prefill_s_per_token
        rep.busy_time += dt
        end = now + dt
        for req in list(rep.active):
            req.remaining -= n
            req.quota -= n
            req.context += n
            if req.remaining and req.quota:
                continue
            rep.active.remove(req)
            rep.reserved -= req.need if policy == "balanced" else 0
            if req.remaining:  # a generation chunk ended mid-turn: the rest is a new request
                # a rollout in progress goes before new ones: its prefix is cached
                resumed.insert(0, request(req.rollout, req.turn, req.context, req.remaining))
                continue
            turns = work.turns[req.rollout]
            if req.turn + 1 < len(turns):
                push(
                    end + turns[req.turn][1],
                    "tool_done",
                    (req.rollout, req.turn + 1, req.context + work.tool_tokens),
                )
            else:
                stats["done_at"] = max(stats["done_at"], end)
        if policy == "balanced":
            dispatch(end)
        push(end, "step", payload)
    done_at = stats["done_at"]
    idle = 1 - sum(r.busy_time for r in reps) / (done_at * replicas) if done_at else 0.0
    return Result(
        policy,
        replicas,
        done_at,
        idle,
        stats["evictions"],
        stats["recomputed"],
        stats["peak"],
        stats["moved"],
    )


def lower_bound(work: Workload, model: ReplicaModel, replicas: int) -> float:
    """No schedule beats this. Generating a token holds its context's KV for one decode step,
    and a step holds at most `capacity` KV tokens: so the steps of all replicas together number
    at least the summed contexts of all tokens over `capacity`. All replicas' busy time is then
    at least a * steps + c * tokens + the prompts' prefill, spread evenly at best. Nor does any
    rollout finish faster than its own tokens at batch 1 plus its tool waits."""
    kv_demand = 0  # sum over generated tokens of the context each is generated from
    for rollout in work.turns:
        context = work.prompt_tokens
        for n, _ in rollout:
            kv_demand += n * context + n * (n - 1) // 2
            context += n + work.tool_tokens
    busy = (
        model.a * kv_demand / model.capacity
        + model.c * work.total_tokens
        + len(work.turns) * work.prompt_tokens * model.prefill_s_per_token
    )
    critical = max(sum(n for n, _ in r) * model.step(1) + sum(w for _, w in r) for r in work.turns)
    return max(busy / replicas, critical)
