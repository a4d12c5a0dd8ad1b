"""Real engine replicas as Ray actors: a replica killed mid-run loses no request."""

import asyncio
import os

import pytest
import ray

from rstar.agent.sampling import Sampling


@pytest.fixture(scope="module")
def local_ray():
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    ray.init(
        num_cpus=2, object_store_memory=200 * 2**20, include_dashboard=False, log_to_driver=False
    )
    yield
    ray.shutdown()


async def test_killing_a_replica_actor_mid_run_loses_nothing(local_ray, tiny_dir):
    from rstar.rollout.ray_replica import RayReplica
    from rstar.rollout.scheduler import BalancedScheduler

    replicas = [RayReplica.start(tiny_dir, num_cpus=0.5, seed=s) for s in (0, 1)]
    sched = BalancedScheduler(replicas, 2048)
    prompts = {f"r{i}/1": [5 + i % 9] * (5 + i) for i in range(16)}
    params = {"max_tokens": 40, "temperature": 0}
    calls = asyncio.gather(*(sched.generate(rid, p, params) for rid, p in prompts.items()))
    await asyncio.sleep(1.5)  # let both replicas take work
    ray.kill(replicas[0].actor)
    results = await calls
    assert len(results) == 16 and all(len(g.token_ids) == 40 for g in results)
    assert not sched.replicas[0].alive and sched.replicas[1].alive
    assert sched.replicas[1].served == 16 - sched.replicas[0].served  # each request served once
    # greedy decoding: a re-queued request gives what it would have given anywhere
    again = await sched.generate("check/1", prompts["r3/1"], params)
    assert again.token_ids == results[3].token_ids


def test_evaluation_through_engine_replicas_behind_the_balanced_scheduler(local_ray, tiny_dir):
    """The cluster path of mining and evaluation (stages.serving), on the CPU: the model served
    by HF engine replicas as Ray actors, never loaded in the calling process."""
    from rstar.data import synth
    from rstar.eval.config import EvalConfig
    from rstar.eval.run import evaluate_model

    problems = synth.generate(3, seed=2, levels=(1,))
    records, summary = evaluate_model(
        tiny_dir,
        problems,
        EvalConfig(k=2, sampling=Sampling(max_response_tokens=16, max_turns=1)),
        replicas=2,
        kind="hf",
    )
    assert len(records) == 6 and {r["problem_id"] for r in records} == {p["id"] for p in problems}
    assert sum(m["samples"] for m in summary.values()) == 6


def test_evaluation_on_vllm_replicas(local_ray, tiny_dir):
    """The cluster's evaluation replicas: vLLM as Ray actors (here its CPU build; on a cluster
    one GPU each) behind the balanced scheduler generating in chunks (rstar.rollout.open)."""
    from rstar.data import synth
    from rstar.eval.config import EvalConfig
    from rstar.eval.run import evaluate_model

    problems = synth.generate(4, seed=2, levels=(1,))
    cfg = EvalConfig(k=2, sampling=Sampling(max_response_tokens=64, max_turns=2))
    records, _ = evaluate_model(tiny_dir, problems, cfg, replicas=2, kind="vllm")
    assert len(records) == 8 and all(r["response_len"] > 0 for r in records)
