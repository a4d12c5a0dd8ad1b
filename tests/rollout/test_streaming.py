"""Rollouts at the recipe's scale: the balanced scheduler's cost per event does not grow with
its queue, the driver holds only what is in flight, and mining's Parquet parts resume."""

import asyncio

import pytest
import torch

from rstar.agent.loop import AgentLoop, Generation
from rstar.agent.sampling import Sampling
from rstar.reward.score import BatchScorer
from rstar.rollout import scheduler as scheduler_mod
from rstar.rollout.runner import as_finished, read_parts, rollout_parts, sample
from rstar.rollout.scheduler import BalancedScheduler
from tests.conftest import product_problems


class Instant:
    async def generate(self, request_id, prompt_ids, params):
        await asyncio.sleep(0)
        return Generation([1], [0.0])


@pytest.mark.parametrize("queued", [200, 3_000])
async def test_an_event_looks_at_the_rollouts_in_progress_never_the_whole_queue(
    queued, monkeypatch
):
    """Counted in requests examined, not seconds: the old scheduler re-read its whole queue at
    every event (quadratic: 336K requests of mining took hours of bookkeeping)."""
    examined = 0
    rollout_id_of = scheduler_mod.rollout_id_of

    def counting(request_id):
        nonlocal examined
        examined += 1
        return rollout_id_of(request_id)

    monkeypatch.setattr(scheduler_mod, "rollout_id_of", counting)
    sched = BalancedScheduler([Instant() for _ in range(4)], 10 * 100)  # 10 running per replica
    await asyncio.gather(
        *(sched.generate(f"r{i}/1", [1] * 36, {"max_tokens": 64}) for i in range(queued))
    )
    assert sum(sched.served) == queued
    assert examined <= 4 * queued  # a few looks per request, whatever the queue holds


async def test_as_finished_bounds_what_runs_and_draws_items_as_room_frees():
    running = peak = drawn = 0

    async def work(i):
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.001 * (i % 5))
        running -= 1
        return i

    def items():
        nonlocal drawn
        for i in range(100):
            drawn += 1
            yield i

    got = []
    async for i in as_finished(work, items(), 7):
        assert drawn - len(got) <= 7  # the iterable is never read ahead of the room
        got.append(i)
    assert sorted(got) == list(range(100)) and peak == 7


async def test_as_finished_stops_everything_on_the_first_error():
    started, cancelled = [], []

    async def work(i):
        started.append(i)
        try:
            if i == 2:
                raise RuntimeError("replica gone")
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.append(i)
            raise

    with pytest.raises(RuntimeError, match="replica gone"):
        async for _ in as_finished(work, range(50), 5):
            pass
    await asyncio.sleep(0)
    assert len(started) == 5 and sorted(cancelled) == [0, 1, 3, 4]


class Dies:
    """An engine that fails after `after` requests, as a replica lost mid-run."""

    def __init__(self, engine, after):
        self.engine, self.after, self.calls = engine, after, 0

    async def generate(self, request_id, prompt_ids, params):
        self.calls += 1
        if self.calls > self.after:
            raise ConnectionError("replica lost")
        return await self.engine.generate(request_id, prompt_ids, params)


@pytest.fixture
def engine(tiny_dir):
    from transformers import AutoModelForCausalLM

    from rstar.rollout.hf_engine import HFEngine

    return HFEngine(AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32), seed=0)


async def test_mining_parts_resume_after_a_crash_and_match_an_uninterrupted_run(
    engine, tokenizer, agent_sandbox, tmp_path
):
    problems = product_problems(10, seed=5)
    cfg = Sampling(max_response_tokens=24, max_turns=2, temperature=1.0)
    steady = AgentLoop(engine, tokenizer, agent_sandbox, cfg)
    with BatchScorer() as scorer:
        whole = await sample(steady, problems, 2, stage="mine")
        assert len(whole) == 20
        crashing = AgentLoop(Dies(engine, after=9), tokenizer, agent_sandbox, cfg)
        out = str(tmp_path / "parts")
        kw = {"scorer": scorer, "in_flight": 2, "part_rollouts": 4, "stage": "mine"}
        with pytest.raises(ConnectionError):
            await rollout_parts(crashing, problems, 2, out, **kw)
        before = list(read_parts(out, ["problem_id"]))
        # whole groups only, in parts written whole; the crash lost what was in flight
        assert 0 < len(before) < 20 and len(before) % 2 == 0
        sampled = await rollout_parts(steady, problems, 2, out, **kw)
    await engine.close()
    assert sampled == 10 - len(before) // 2  # only what the crash had not written
    rows = list(read_parts(out, ["group_id", "sample_index", "response_ids"]))
    assert sorted((r["group_id"], r["sample_index"]) for r in rows) == sorted(
        (f"mine/0/{p['id']}", i) for p, i, _ in whole
    )
    # each request seeds its own sampling: the resumed run's tokens are the uninterrupted run's
    by_key = {(r["group_id"], r["sample_index"]): r["response_ids"] for r in rows}
    assert all(by_key[(f"mine/0/{p['id']}", i)] == t.response_ids for p, i, t in whole)


async def test_a_finished_rollout_leaves_nothing_in_the_scheduler(tokenizer, agent_sandbox):
    sched = BalancedScheduler([Instant(), Instant()], 4096)
    loop = AgentLoop(sched, tokenizer, agent_sandbox, Sampling(max_response_tokens=8))
    await loop.run_many([(f"p{i}", "What is 2 + 2?") for i in range(20)])
    assert sum(sched.served) >= 20 and not sched.home


def test_the_overhead_benchmark_prints_and_writes_its_figure(tmp_path):
    from typer.testing import CliRunner

    from rstar.cli import app

    out = tmp_path / "benchmarks.md"
    args = ["bench-scheduler", "--queue", "3000", "--replicas", "8", "--fake"]
    result = CliRunner().invoke(app, [*args, "--in-flight", "256", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "scheduling overhead: " in result.output and " s for 3000 requests" in result.output
    text = out.read_text()
    assert "<!-- scheduler-overhead:start -->" in text and "| streamed, 256 in flight |" in text


@pytest.mark.parametrize("kind,chunk", [("vllm", 2048), ("hf", None)])
async def test_vllm_replicas_reserve_a_chunk_not_the_whole_budget(kind, chunk, monkeypatch):
    """Evaluation's 30K-token budget reserved whole would let a handful of requests fill a
    replica; behind vLLM (prefix cache) a turn is generated in chunks instead."""
    from contextlib import AsyncExitStack

    from rstar.rollout import open as open_mod
    from rstar.rollout.ray_replica import RayReplica

    class Fake:
        actor = None

        async def kv_capacity_tokens(self):
            return 100_000

    monkeypatch.setattr(RayReplica, "start", staticmethod(lambda *a, **kw: Fake()))
    async with AsyncExitStack() as stack:
        monkeypatch.setattr("ray.kill", lambda actor: None)
        monkeypatch.setattr("ray.cluster_resources", dict)  # a CPU-only Ray
        sched = await open_mod._replicas(stack, "model", 2, kind, "balanced", 0, 64, 0)
    assert sched.chunk_tokens == chunk and [r.capacity for r in sched.replicas] == [100_000] * 2
