"""`rstar rollout`: sample k rollouts per problem from a checkpoint and write them as Parquet."""
from __future__ import annotations

import asyncio
import json
import time

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


def rollout_command(
    model: str = typer.Option(..., help="Checkpoint directory (Hugging Face format, with its tokenizer)."),
    problems: str = typer.Option(..., help="Problems Parquet (problems schema)."),
    out: str = typer.Option(..., help="Trajectories Parquet to write."),
    k: int = typer.Option(8, help="Rollouts per problem."),
    limit: int = typer.Option(0, help="Use only the first N problems (0: all)."),
    max_turns: int = typer.Option(10), max_response_tokens: int = typer.Option(1024),
    temperature: float = typer.Option(1.0), max_batch: int = typer.Option(64),
    sandbox: str = typer.Option("", help="URL of a sandbox service (default: executors in this process)."),
    seed: int = typer.Option(0),
    engine: str = typer.Option("hf", help="hf (transformers, CPU or one GPU) or vllm (one GPU per replica)."),
    replicas: int = typer.Option(1, help="Engine replicas. Above 1, each is a Ray actor (a local Ray, or the "
                                         "cluster at RAY_ADDRESS) and --scheduler spreads the rollouts."),
    scheduler: str = typer.Option("balanced", help="balanced (one queue, by free KV cache) or static (equal split)."),
) -> None:
    """Sample rollouts through the agent loop and the local engine; print a summary."""
    from transformers import AutoTokenizer

    from rstar.agent.loop import AgentLoop, LoopConfig
    from rstar.data.io import read_table, write_table
    from rstar.rollout.runner import rollout, summarize
    from rstar.sandbox.client import SandboxClient
    from rstar.sandbox.service import embedded_sandbox

    if engine not in ("hf", "vllm"):
        raise typer.BadParameter(f"--engine must be hf or vllm, not {engine!r}")
    if scheduler not in ("balanced", "static"):
        raise typer.BadParameter(f"--scheduler must be balanced or static, not {scheduler!r}")
    if replicas < 1:
        raise typer.BadParameter(f"--replicas must be at least 1, not {replicas}")
    console = Console()
    rows = read_table(problems, "problems").to_pylist()
    rows = rows[:limit] if limit else rows
    tok = AutoTokenizer.from_pretrained(model)
    cfg = LoopConfig(max_turns=max_turns, max_response_tokens=max_response_tokens, temperature=temperature)
    engine_kw = {"max_batch": max_batch} if engine == "hf" else {}

    async def main():
        gen, close = await _engine(model, engine, replicas, scheduler, seed, engine_kw)
        box = SandboxClient(sandbox) if sandbox else embedded_sandbox()
        try:
            async with box as sb:
                with Progress(TextColumn("rollouts"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                              console=console) as bar:
                    task = bar.add_task("", total=len(rows) * k)
                    records = await rollout(AgentLoop(gen, tok, sb, cfg), rows, k,
                                            progress=lambda n: bar.advance(task, n))
        finally:
            await close()
        if replicas > 1:
            console.print(f"{scheduler} scheduler, requests served per replica: {gen.served}")
        return records

    start = time.monotonic()
    records = asyncio.run(main())
    write_table(records, out, "trajectories")
    console.print(json.dumps(summarize(records, time.monotonic() - start), indent=2))
    console.print(f"wrote {len(records)} trajectories to {out}")


async def _engine(model: str, kind: str, replicas: int, scheduler: str, seed: int, engine_kw: dict):
    """(the engine the agent loop talks to, an async close): one engine in this process, or
    `replicas` Ray actors behind a scheduler."""
    if replicas == 1:
        if kind == "vllm":
            from rstar.rollout.vllm_engine import VLLMEngine

            one = VLLMEngine(model, seed=seed)
        else:
            from rstar.rollout.hf_engine import HFEngine

            one = HFEngine.from_pretrained(model, seed=seed, **engine_kw)
        return one, one.close

    import ray

    from rstar.pipeline.launch import ensure_ray
    from rstar.rollout.ray_replica import RayReplica
    from rstar.rollout.scheduler import BalancedScheduler, StaticScheduler

    ours = not ray.is_initialized()
    ensure_ray(replicas)
    gpus = 1 if kind == "vllm" else 0
    reps = [RayReplica.start(model, kind=kind, num_cpus=1, num_gpus=gpus, seed=seed + i, **engine_kw)
            for i in range(replicas)]

    async def close() -> None:
        for r in reps:
            ray.kill(r.actor)
        if ours:
            ray.shutdown()

    if scheduler == "static":
        return StaticScheduler(reps), close
    capacities = list(await asyncio.gather(*(r.kv_capacity_tokens() for r in reps)))
    return BalancedScheduler(reps, capacities), close


def bench_scheduler_command(
    model: str = typer.Option(..., help="Tiny model directory (HF format) to calibrate and run replicas."),
    out: str = typer.Option("docs/benchmarks.md"),
    rollouts_per_replica: int = typer.Option(256, help="the paper: 512 prompts x 32 samples on 64 GPUs"),
    real_rollouts: int = typer.Option(24),
) -> None:
    """Static split vs KV-aware balanced scheduling: calibrated simulation and a real 2-replica run."""
    from rstar.rollout.bench import run_scheduler_benchmark

    run_scheduler_benchmark(model, out, rollouts_per_replica, real_rollouts)
