"""The agent loop over a checkpoint and a sandbox, built the one way everything that samples
(mining, evaluation, curation's consistency filter, `rstar rollout`) builds it, and torn down
the same way when the body raises: replicas killed, engine closed, sandbox stopped.

- `replicas=0`: one engine in this process, the local HF engine (the embedded default) or
  vLLM (`kind="vllm"`: a GPU, or vLLM's CPU build);
- `replicas=N`: N engine replicas as Ray actors (vLLM on a GPU each where the cluster has
  them, else on the CPU; or the HF engine) behind a scheduler (`balanced`, by free KV cache,
  or the `static` split; rstar.rollout.scheduler), so a 14B model is served by the cluster's
  GPUs and never loaded in the caller's process. Every replica samples with the same seed, so
  where a request lands never changes what it samples;
- `sandbox_url`: the sandbox service; without it, an embedded one for this process.
"""

from __future__ import annotations

from contextlib import AsyncExitStack, asynccontextmanager

from rstar.agent.loop import AgentLoop
from rstar.agent.sampling import Sampling

VLLM_CHUNK_TOKENS = 2048


async def _replicas(
    stack: AsyncExitStack,
    model_dir: str,
    n: int,
    kind: str,
    scheduler: str,
    seed: int,
    max_batch: int,
    cpus: float,
):
    import ray

    from rstar.rollout.ray_replica import RayReplica
    from rstar.rollout.scheduler import BalancedScheduler, StaticScheduler

    engine_kw = {"max_batch": max_batch} if kind == "hf" else {}
    # vLLM takes a GPU each where the cluster has them; on a CPU-only Ray, vLLM's CPU build
    gpus = 1 if kind == "vllm" and ray.cluster_resources().get("GPU") else 0
    reps = [
        RayReplica.start(
            model_dir,
            kind=kind,
            num_cpus=cpus,
            num_gpus=gpus,
            seed=seed,
            **engine_kw,
        )
        for _ in range(n)
    ]
    stack.callback(lambda: [ray.kill(r.actor) for r in reps])
    if scheduler == "static":
        return StaticScheduler(reps)
    # vLLM: a turn in chunks, each reserving its context plus VLLM_CHUNK_TOKENS rather than the
    # whole budget (30K tokens in evaluation: a handful of requests would fill a replica); the
    # prefix cache makes each continuation's prefill cheap
    return BalancedScheduler(
        reps,
        [await r.kv_capacity_tokens() for r in reps],
        chunk_tokens=VLLM_CHUNK_TOKENS if kind == "vllm" else None,
    )


def _in_process(stack: AsyncExitStack, model_dir: str, kind: str, seed: int, max_batch: int):
    if kind == "vllm":
        from rstar.rollout.vllm_engine import VLLMEngine

        engine = VLLMEngine(model_dir, seed=seed)
    else:
        from rstar.rollout.hf_engine import HFEngine

        engine = HFEngine.from_pretrained(model_dir, seed=seed, max_batch=max_batch)
    stack.push_async_callback(engine.close)
    return engine


@asynccontextmanager
async def open_agent_loop(
    model_dir: str,
    sampling: Sampling,
    *,
    prompt_style: str = "paper",
    replicas: int = 0,
    kind: str = "hf",
    scheduler: str = "balanced",
    seed: int = 0,
    max_batch: int = 64,
    replica_cpus: float = 0,
    sandbox_url: str | None = None,
):
    """Yields an `AgentLoop`; its `engine` is the in-process engine or the scheduler.
    `replica_cpus`: CPUs each replica actor holds (0: it shares the caller's, as a stage's do)."""
    from transformers import AutoTokenizer

    from rstar.sandbox.client import SandboxClient
    from rstar.sandbox.service import embedded_sandbox

    async with AsyncExitStack() as stack:
        if replicas:
            engine = await _replicas(
                stack, model_dir, replicas, kind, scheduler, seed, max_batch, replica_cpus
            )
        else:
            engine = _in_process(stack, model_dir, kind, seed, max_batch)
        sandbox = await stack.enter_async_context(
            SandboxClient(sandbox_url) if sandbox_url else embedded_sandbox()
        )
        yield AgentLoop(
            engine, AutoTokenizer.from_pretrained(model_dir), sandbox, sampling, prompt_style
        )
