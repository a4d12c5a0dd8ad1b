"""The balanced scheduler: never over-commits a replica's KV cache, re-queues what a dead
replica held (nothing lost, nothing duplicated), prefers the replica with the most room and
the one a rollout last ran on; the static split assigns rollouts round robin."""

import asyncio
import time

import pytest
import torch

from rstar.agent.loop import Generation
from rstar.agent.sampling import Sampling
from rstar.bench.simulate import ReplicaModel, Workload, lower_bound, simulate
from rstar.rollout.scheduler import (
    BalancedScheduler,
    ReplicaLost,
    StaticScheduler,
    plan_dispatch,
)


class FakeReplica:
    """Echoes a function of the prompt after a delay; checks the scheduler's KV accounting."""

    def __init__(self, name, capacity, die_after=None):
        self.name, self.capacity, self.die_after = name, capacity, die_after
        self.live_kv = 0
        self.peak = 0
        self.served = []

    async def generate(self, request_id, prompt_ids, params):
        need = len(prompt_ids) + params["max_tokens"]
        self.live_kv += need
        self.peak = max(self.peak, self.live_kv)
        try:
            if self.die_after is not None and len(self.served) >= self.die_after:
                await asyncio.sleep(0.01)
                raise ConnectionError(f"{self.name} died")
            await asyncio.sleep(0.005 + 0.001 * (len(prompt_ids) % 7))
            self.served.append(request_id)
            return Generation([sum(prompt_ids) % 1000, len(prompt_ids)], [0.0, 0.0])
        finally:
            self.live_kv -= need


def test_plan_dispatch():
    up = [True] * 3
    assert plan_dispatch([10, 50, 30], up, [], [20]) == ([], [1])  # a new rollout: the most free KV
    # never a dead replica
    assert plan_dispatch([10, 50, 30], [True, False, True], [], [20]) == ([], [2])
    assert plan_dispatch([10, 50, 30], up, [(20, 2)], []) == ([2], [])  # a later turn goes home...
    # ...or, home full, moves to room
    assert plan_dispatch([10, 50, 30], up, [(20, 0)], []) == ([1], [])
    # home dead: moves
    assert plan_dispatch([10, 50, 30], [True, False, True], [(20, 1)], []) == ([2], [])
    # a full home is held: nothing else takes its room, not a new rollout, not a moving request
    assert plan_dispatch([10, 25, 5], up, [(20, 0), (30, 1)], [20]) == ([None, None], [])
    # moves go before new rollouts
    assert plan_dispatch([30, 10], [True, True], [(20, 1)], [20]) == ([0], [])
    # first come, first served
    assert plan_dispatch([30, 40], [True, True], [], [50, 10]) == ([], [])
    free = [60, 40]
    assert plan_dispatch(free, [True, True], [], [50, 10, 10]) == ([], [0, 1, 1])
    assert free == [10, 20]  # placements are taken off the free KV


async def test_no_overcommit_and_nothing_lost_when_a_replica_dies():
    reps = [FakeReplica("a", 400, die_after=5), FakeReplica("b", 400), FakeReplica("c", 250)]
    sched = BalancedScheduler(reps, [400, 400, 250])
    prompts = {f"rollout{i}/1": list(range(i % 50 + 10)) for i in range(120)}
    results = await asyncio.gather(
        *(sched.generate(rid, p, {"max_tokens": 100}) for rid, p in prompts.items())
    )
    for (_rid, p), g in zip(prompts.items(), results):
        assert g.token_ids == [sum(p) % 1000, len(p)]  # each answer is its own request's
    served = reps[0].served + reps[1].served + reps[2].served
    assert sorted(served) == sorted(prompts)  # every request served exactly once
    assert not sched.replicas[0].alive and sched.requeued >= 1
    for rep, slot in zip(reps, sched.replicas):
        assert rep.peak <= rep.capacity  # zero over-commit, by construction
        assert slot.reserved == 0


async def test_a_rollout_that_outgrows_its_replica_moves_instead_of_waiting_forever():
    small, big = FakeReplica("small", 150), FakeReplica("big", 1000)
    sched = BalancedScheduler([small, big], [150, 1000])
    sched.home["r"] = 0  # its first turn ran on the small replica
    g = await asyncio.wait_for(sched.generate("r/2", list(range(100)), {"max_tokens": 100}), 5)
    assert g.token_ids == [sum(range(100)) % 1000, 100] and big.served == ["r/2"]


async def test_a_later_turn_moves_off_a_full_replica_instead_of_waiting():
    a, b = FakeReplica("a", 400), FakeReplica("b", 400)
    sched = BalancedScheduler([a, b], 400)
    sched.home["r"] = 0
    sched.replicas[0].reserved = 400  # replica a is full with other rollouts
    g = await asyncio.wait_for(sched.generate("r/2", list(range(100)), {"max_tokens": 100}), 5)
    assert (
        g.token_ids == [sum(range(100)) % 1000, 100]
        and b.served == ["r/2"]
        and sched.home["r"] == 1
    )


async def test_requests_too_big_for_any_replica_are_refused():
    sched = BalancedScheduler([FakeReplica("a", 100)], 100)
    with pytest.raises(ValueError, match="needs 130 KV tokens"):
        await sched.generate("r/1", [1] * 30, {"max_tokens": 100})


class CountingReplica:
    """Continues the prompt 0, 1, 2, ... and ends the turn at `end`: a continuation from any
    prefix gives the same tokens as one long request."""

    def __init__(self, capacity, end):
        self.capacity, self.end, self.live_kv, self.peak, self.requests = capacity, end, 0, 0, 0

    async def generate(self, request_id, prompt_ids, params):
        need = len(prompt_ids) + params["max_tokens"]
        self.live_kv += need
        self.peak, self.requests = max(self.peak, self.live_kv), self.requests + 1
        await asyncio.sleep(0.001)
        self.live_kv -= need
        start = len(prompt_ids)
        out = list(range(start, min(start + params["max_tokens"], self.end)))
        return Generation(
            out,
            [0.0] * len(out),
            [0.5] * len(out),
            "stop" if start + len(out) >= self.end else "length",
        )


async def test_chunked_generation_continues_a_turn_within_small_reservations():
    rep = CountingReplica(capacity=120, end=100)
    sched = BalancedScheduler([rep], 120, chunk_tokens=16)
    gens = await asyncio.gather(
        *(sched.generate(f"r{i}/1", list(range(10)), {"max_tokens": 500}) for i in range(4))
    )
    for g in gens:  # the same tokens one unchunked request would give, ended by the engine
        assert (
            g.token_ids == list(range(10, 100))
            and g.stop_reason == "stop"
            and len(g.entropies) == 90
        )
    # 90 tokens in chunks of 16; never over-committed
    assert rep.peak <= 120 and rep.requests == 4 * 6
    short = await sched.generate("s/1", list(range(10)), {"max_tokens": 40})
    # the budget still binds
    assert short.token_ids == list(range(10, 50)) and short.stop_reason == "length"
    # unchunked, the whole budget is reserved
    with pytest.raises(ValueError, match="needs 510 KV tokens"):
        await BalancedScheduler([rep], 120).generate("u/1", list(range(10)), {"max_tokens": 500})


async def test_static_split_is_round_robin_by_rollout():
    reps = [FakeReplica("a", 10**6), FakeReplica("b", 10**6)]
    sched = StaticScheduler(reps)
    for rid in ["x/1", "y/1", "x/2", "z/1", "y/2"]:
        await sched.generate(rid, [1, 2], {"max_tokens": 4})
    assert reps[0].served == ["x/1", "x/2", "z/1"] and reps[1].served == ["y/1", "y/2"]
    assert sched.served == [3, 2]


async def test_agent_loop_over_two_real_replicas(tiny_dir, tokenizer, agent_sandbox):
    from transformers import AutoModelForCausalLM

    from rstar.agent.loop import AgentLoop
    from rstar.rollout.hf_engine import HFEngine

    engines = [
        HFEngine(AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32), seed=s)
        for s in (0, 1)
    ]
    sched = BalancedScheduler(engines, 4096)
    loop = AgentLoop(sched, tokenizer, agent_sandbox, Sampling(max_response_tokens=48, max_turns=2))
    trajs = await loop.run_many([(f"p{i}", f"What is {i} + {i}?") for i in range(6)])
    assert all(len(t.response_ids) <= 48 and t.finish_reason for t in trajs)
    assert all(s.served > 0 for s in sched.replicas) and all(
        s.reserved == 0 for s in sched.replicas
    )
    for e in engines:
        await e.close()


@pytest.mark.parametrize(
    "seed,replicas,capacity,tight",
    [(1, 4, 60_000, False), (2, 3, 20_000, True), (3, 8, 150_000, False)],
)
def test_simulation_invariants(seed, replicas, capacity, tight):
    work = Workload.long_tail(16 * replicas, seed=seed)
    model = ReplicaModel(a=0.02, c=0.001, prefill_s_per_token=1e-5, capacity=capacity)
    static = simulate(work, model, replicas, "static")
    balanced = simulate(work, model, replicas, "balanced", gen_chunk=256)
    bound = lower_bound(work, model, replicas)
    assert balanced.evictions == 0 and balanced.max_kv_use <= 1.0
    # where the caches fill, later turns move off full replicas and recompute their context
    assert (balanced.moved > 0 and balanced.recomputed_tokens > 0) == tight
    # a valid bound
    assert static.makespan_s >= bound * 0.999 and balanced.makespan_s >= bound * 0.999
    assert 0 <= balanced.idle_fraction < 1 and 0 <= static.idle_fraction < 1
    assert simulate(work, model, replicas, "balanced", gen_chunk=256) == balanced  # deterministic


class WedgedReplica:
    """Alive (it raises nothing) and never answers, as an engine stuck in a collective."""

    def __init__(self):
        self.cancelled = 0

    async def generate(self, request_id, prompt_ids, params):
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise


class OneAtATimeReplica(FakeReplica):
    """Serves its requests one after another: a busy replica whose last request waits long,
    though it answers something every 0.1 s."""

    def __init__(self, name, capacity):
        super().__init__(name, capacity)
        self.lock = asyncio.Lock()

    async def generate(self, request_id, prompt_ids, params):
        async with self.lock:
            await asyncio.sleep(0.1)
            self.served.append(request_id)
            return Generation([1], [0.0])


async def test_a_replica_that_answers_nothing_loses_its_requests_to_the_others():
    wedged, good = WedgedReplica(), FakeReplica("good", 1000)
    sched = BalancedScheduler([wedged, good], [1000, 1000], stall_timeout_s=0.3)
    gens = await asyncio.wait_for(
        asyncio.gather(*(sched.generate(f"r{i}/1", [1, 2], {"max_tokens": 4}) for i in range(6))),
        timeout=10,
    )
    assert len(gens) == 6 and sorted(good.served) == sorted(f"r{i}/1" for i in range(6))
    assert wedged.cancelled > 0 and sched.requeued == wedged.cancelled
    assert not sched.replicas[0].alive


async def test_a_stage_on_wedged_replicas_ends_in_an_error_naming_the_stall():
    sched = BalancedScheduler([WedgedReplica()], 1000, stall_timeout_s=0.2, max_attempts=1)
    with pytest.raises(ReplicaLost, match="replica 0 .WedgedReplica. answered none of its 1"):
        await asyncio.wait_for(sched.generate("r/1", [1], {"max_tokens": 4}), timeout=10)


async def test_a_silent_replica_is_declared_dead_on_time_while_requests_keep_coming():
    """Its silence is counted from when it went from idle to busy, not from its latest request:
    a wedged replica handed a request every 0.1 s is dead 0.3 s after its first, not only once
    requests stop."""
    sched = BalancedScheduler([WedgedReplica()], 1000, stall_timeout_s=0.3, max_attempts=1)
    start = time.monotonic()
    first = asyncio.ensure_future(sched.generate("r0/1", [1], {"max_tokens": 4}))
    later = []
    while not first.done() and time.monotonic() - start < 3:
        rid = f"r{len(later) + 1}/1"
        later.append(asyncio.ensure_future(sched.generate(rid, [1], {"max_tokens": 4})))
        await asyncio.sleep(0.1)
    assert first.done() and time.monotonic() - start < 1.0, len(later)
    with pytest.raises(ReplicaLost, match="answered none"):
        first.result()
    outcomes = await asyncio.wait_for(asyncio.gather(*later, return_exceptions=True), timeout=5)
    assert all(isinstance(o, ReplicaLost) for o in outcomes)


async def test_a_busy_replica_that_keeps_answering_is_not_a_stalled_one():
    rep = OneAtATimeReplica("busy", 1000)
    sched = BalancedScheduler([rep], 1000, stall_timeout_s=0.35)
    # 8 requests, answered 0.1 s apart: the last waits 0.8 s, more than the timeout
    await asyncio.gather(*(sched.generate(f"r{i}/1", [1], {"max_tokens": 4}) for i in range(8)))
    assert len(rep.served) == 8 and sched.requeued == 0 and sched.replicas[0].alive
