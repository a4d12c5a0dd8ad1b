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
) -> None:
    """Sample rollouts through the agent loop and the local engine; print a summary."""
    from transformers import AutoTokenizer

    from rstar.agent.loop import AgentLoop, LoopConfig
    from rstar.data.io import read_table, write_table
    from rstar.rollout.hf_engine import HFEngine
    from rstar.rollout.runner import rollout, summarize
    from rstar.sandbox.client import SandboxClient
    from rstar.sandbox.service import embedded_sandbox

    console = Console()
    rows = read_table(problems, "problems").to_pylist()
    rows = rows[:limit] if limit else rows
    tok = AutoTokenizer.from_pretrained(model)
    cfg = LoopConfig(max_turns=max_turns, max_response_tokens=max_response_tokens, temperature=temperature)

    async def main():
        engine = HFEngine.from_pretrained(model, max_batch=max_batch, seed=seed)
        box = SandboxClient(sandbox) if sandbox else embedded_sandbox()
        async with box as sb:
            with Progress(TextColumn("rollouts"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                          console=console) as bar:
                task = bar.add_task("", total=len(rows) * k)
                records = await rollout(AgentLoop(engine, tok, sb, cfg), rows, k,
                                        progress=lambda n: bar.advance(task, n))
        await engine.close()
        return records

    start = time.monotonic()
    records = asyncio.run(main())
    write_table(records, out, "trajectories")
    console.print(json.dumps(summarize(records, time.monotonic() - start), indent=2))
    console.print(f"wrote {len(records)} trajectories to {out}")


def bench_scheduler_command(
    model: str = typer.Option(..., help="Tiny model directory (HF format) to calibrate and run replicas."),
    out: str = typer.Option("docs/benchmarks.md"),
    rollouts_per_replica: int = typer.Option(256, help="the paper: 512 prompts x 32 samples on 64 GPUs"),
    real_rollouts: int = typer.Option(24),
) -> None:
    """Static split vs KV-aware balanced scheduling: calibrated simulation and a real 2-replica run."""
    from rstar.rollout.bench import run_scheduler_benchmark

    run_scheduler_benchmark(model, out, rollouts_per_replica, real_rollouts)
