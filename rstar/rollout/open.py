"""The agent loop over a checkpoint and a sandbox, built the one way every stage that samples
(mining, evaluation, curation's consistency filter) builds it.

- `replicas=0`: the local HF engine in this process (the embedded default);
- `replicas=N`: N engine replicas as Ray actors (vLLM on a GPU each, or the HF engine on the
  CPU) behind the balanced scheduler (rstar.rollout.scheduler), so a 14B model is served by
  the cluster's GPUs and never loaded in the stage's own process;
- `sandbox_url`: the sandbox service; without it, an embedded one for this process.
"""
from __future__ import annotations

from contextlib import AsyncExitStack, asynccontextmanager

from rstar.agent.loop import AgentLoop, LoopConfig


@asynccontextmanager
async def open_agent_loop(model_dir: str, cfg: LoopConfig, *, replicas: int = 0, kind: str = "hf", seed: int = 0,
                          max_batch: int = 64, sandbox_url: str | None = None):
    from transformers import AutoTokenizer

    from rstar.sandbox.client import SandboxClient
    from rstar.sandbox.service import embedded_sandbox

    async with AsyncExitStack() as stack:
        if replicas:
            import ray

            from rstar.rollout.ray_replica import RayReplica
            from rstar.rollout.scheduler import BalancedScheduler

            # a GPU each for vLLM; HF replicas share the CPUs the stage already holds
            reps = [RayReplica.start(model_dir, kind=kind, num_cpus=0, num_gpus=1 if kind == "vllm" else 0, seed=seed)
                    for _ in range(replicas)]
            stack.callback(lambda: [ray.kill(r.actor) for r in reps])
            engine = BalancedScheduler(reps, [await r.kv_capacity_tokens() for r in reps])
        else:
            from rstar.rollout.hf_engine import HFEngine

            engine = HFEngine.from_pretrained(model_dir, seed=seed, max_batch=max_batch)
            stack.push_async_callback(engine.close)
        sandbox = await stack.enter_async_context(SandboxClient(sandbox_url) if sandbox_url else embedded_sandbox())
        yield AgentLoop(engine, AutoTokenizer.from_pretrained(model_dir), sandbox, cfg)
