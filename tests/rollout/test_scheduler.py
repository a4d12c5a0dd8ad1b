"""The balanced scheduler: never over-commits a replica's KV cache, re-queues what a dead
replica held (nothing lost, nothing duplicated), prefers the replica with the most room and
the one a rollout last ran on; the static split assigns rollouts round robin."""
import asyncio

import pytest
import torch

from rstar.agent.loop import Generation
from rstar.rollout.scheduler import BalancedScheduler, StaticScheduler, choose_replica
from rstar.rollout.simulate import ReplicaModel, Workload, lower_bound, simulate


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


def test_choose_replica():
    assert choose_replica([10, 50, 30], [True] * 3, 20) == 1
    assert choose_replica([10, 50, 30], [True, False, True], 20) == 2
    assert choose_replica([10, 50, 30], [True] * 3, 20, home=2) == 2  # a later turn goes home...
    assert choose_replica([10, 50, 30], [True] * 3, 20, home=0) is None  # ...and waits there for room
    assert choose_replica([10, 50, 30], [True, False, True], 20, home=1) == 2  # unless home is dead
    assert choose_replica([10, 50, 30], [True] * 3, 20, held={1}) == 2  # a held replica takes no new rollout
    assert choose_replica([10, 5], [True, True], 20) is None


async def test_no_overcommit_and_nothing_lost_when_a_replica_dies():
    reps = [FakeReplica("a", 400, die_after=5), FakeReplica("b", 400), FakeReplica("c", 250)]
    sched = BalancedScheduler(reps, [400, 400, 250])
    prompts = {f"rollout{i}/1": list(range(i % 50 + 10)) for i in range(120)}
    results = await asyncio.gather(*(sched.generate(rid, p, {"max_tokens": 100}) for rid, p in prompts.items()))
    for (rid, p), g in zip(prompts.items(), results):
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
        return Generation(out, [0.0] * len(out), [0.5] * len(out), "stop" if start + len(out) >= self.end else "length")


async def test_chunked_generation_continues_a_turn_within_small_reservations():
    rep = CountingReplica(capacity=120, end=100)
    sched = BalancedScheduler([rep], 120, chunk_tokens=16)
    gens = await asyncio.gather(*(sched.generate(f"r{i}/1", list(range(10)), {"max_tokens": 500}) for i in range(4)))
    for g in gens:  # the same tokens one unchunked request would give, ended by the engine
        assert g.token_ids == list(range(10, 100)) and g.stop_reason == "stop" and len(g.entropies) == 90
    assert rep.peak <= 120 and rep.requests == 4 * 6  # 90 tokens in chunks of 16; never over-committed
    short = await sched.generate("s/1", list(range(10)), {"max_tokens": 40})
    assert short.token_ids == list(range(10, 50)) and short.stop_reason == "length"  # the budget still binds
    with pytest.raises(ValueError, match="needs 510 KV tokens"):  # unchunked, the whole budget is reserved
        await BalancedScheduler([rep], 120).generate("u/1", list(range(10)), {"max_tokens": 500})


async def test_static_split_is_round_robin_by_rollout():
    reps = [FakeReplica("a", 10**6), FakeReplica("b", 10**6)]
    sched = StaticScheduler(reps)
    for rid in ["x/1", "y/1", "x/2", "z/1", "y/2"]:
        await sched.generate(rid, [1, 2], {"max_tokens": 4})
    assert reps[0].served == ["x/1", "x/2", "z/1"] and reps[1].served == ["y/1", "y/2"]


async def test_agent_loop_over_two_real_replicas(tiny_dir, tokenizer, agent_sandbox):
    from transformers import AutoModelForCausalLM

    from rstar.agent.loop import AgentLoop, LoopConfig
    from rstar.rollout.hf_engine import HFEngine

    engines = [HFEngine(AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32), seed=s) for s in (0, 1)]
    sched = BalancedScheduler(engines, 4096)
    loop = AgentLoop(sched, tokenizer, agent_sandbox, LoopConfig(max_response_tokens=48, max_turns=2))
    trajs = await loop.run_many([(f"p{i}", f"What is {i} + {i}?") for i in range(6)])
    assert all(len(t.response_ids) <= 48 and t.finish_reason for t in trajs)
    assert all(s.served > 0 for s in sched.replicas) and all(s.reserved == 0 for s in sched.replicas)
    for e in engines:
        await e.close()


def test_simulation_invariants():
    work = Workload.long_tail(64, seed=1)
    model = ReplicaModel(a=0.02, c=0.001, prefill_s_per_token=1e-5, capacity=60_000)
    static, balanced = simulate(work, model, 4, "static"), simulate(work, model, 4, "balanced", gen_chunk=1024)
    bound = lower_bound(work, model, 4)
    assert balanced.evictions == 0 and balanced.max_kv_use <= 1.0
    assert static.makespan_s >= bound * 0.999 and balanced.makespan_s >= bound * 0.999
    assert 0 <= balanced.idle_fraction < 1 and 0 <= static.idle_fraction < 1
    assert simulate(work, model, 4, "balanced", gen_chunk=1024) == balanced  # deterministic
