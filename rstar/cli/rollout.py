"""`rstar rollout`: sample k rollouts per problem from a checkpoint and write them as Parquet."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import typer
from rich.console import Console

from rstar.agent.sampling import Sampling
from rstar.cli.common import progress_bar


def rollout_command(
    model: str = typer.Option(
        ..., help="Checkpoint directory (Hugging Face format, with its tokenizer)."
    ),
    problems: str = typer.Option(..., help="Problems Parquet (problems schema)."),
    out: str = typer.Option(..., help="Trajectories Parquet to write."),
    k: int = typer.Option(8, help="Rollouts per problem."),
    limit: int = typer.Option(0, help="Use only the first N problems (0: all)."),
    max_turns: int = typer.Option(Sampling.max_turns),
    max_response_tokens: int = typer.Option(Sampling.max_response_tokens),
    temperature: float = typer.Option(Sampling.temperature),
    max_batch: int = typer.Option(64),
    sandbox: str = typer.Option(
        "", help="URL of a sandbox service (default: executors in this process)."
    ),
    seed: int = typer.Option(0),
    engine: str = typer.Option(
        "hf", help="hf (transformers, CPU or one GPU) or vllm (one GPU per replica)."
    ),
    replicas: int = typer.Option(
        1,
        help="Engine replicas. Above 1, each is a Ray actor (a local Ray, or the "
        "cluster at RAY_ADDRESS) and --scheduler spreads the rollouts.",
    ),
    scheduler: str = typer.Option(
        "balanced", help="balanced (one queue, by free KV cache) or static (equal split)."
    ),
) -> None:
    """Sample rollouts through the agent loop and the local engine; print a summary."""
    from rstar.cluster import ray_session
    from rstar.data.io import read_table, write_table
    from rstar.rollout.open import open_agent_loop
    from rstar.rollout.runner import rollout, summarize

    if engine not in ("hf", "vllm"):
        raise typer.BadParameter(f"--engine must be hf or vllm, not {engine!r}")
    if scheduler not in ("balanced", "static"):
        raise typer.BadParameter(f"--scheduler must be balanced or static, not {scheduler!r}")
    if replicas < 1:
        raise typer.BadParameter(f"--replicas must be at least 1, not {replicas}")
    console = Console()
    rows = read_table(problems, "problems").to_pylist()
    rows = rows[:limit] if limit else rows
    sampling = Sampling(
        max_turns=max_turns, max_response_tokens=max_response_tokens, temperature=temperature
    )
    actors = replicas if replicas > 1 else 0  # one engine runs in this process

    async def main():
        async with open_agent_loop(
            model,
            sampling,
            replicas=actors,
            kind=engine,
            scheduler=scheduler,
            seed=seed,
            max_batch=max_batch,
            replica_cpus=1,
            sandbox_url=sandbox or None,
        ) as loop:
            with progress_bar(console, "rollouts") as bar:
                task = bar.add_task("", total=len(rows) * k)
                records = await rollout(loop, rows, k, progress=lambda n: bar.advance(task, n))
            if actors:
                console.print(
                    f"{scheduler} scheduler, requests served per replica: {loop.engine.served}"
                )
        return records

    start = time.monotonic()
    with ray_session(actors) if actors else contextlib.nullcontext():
        records = asyncio.run(main())
    write_table(records, out, "trajectories")
    console.print(json.dumps(summarize(records, time.monotonic() - start), indent=2))
    console.print(f"wrote {len(records)} trajectories to {out}")
