"""Benchmarks of the library with a command of their own: `rstar bench-scheduler` (the static
split against the KV-aware balanced scheduler), `rstar bench-engines` (the embedded HF engine
against vLLM's CPU build), `rstar bench-lora` (full fine-tuning against LoRA) and `rstar
bench-peers` (the project against what people would pick instead, on the same work). Each
writes its section of docs/benchmarks.md."""

from __future__ import annotations

import typer


def bench_lora_command(
    model: str = typer.Option(..., help="A Hugging Face model directory (a run's models/base)."),
    rows: int = typer.Option(4, min=1, help="Rows per micro-batch (configs/smollm2.yaml: 4)."),
    tokens: int = typer.Option(512, min=8, help="Tokens per row."),
    rounds: int = typer.Option(3, min=1, help="Timed steps of each variant, alternating."),
    lora_rank: int = typer.Option(16, min=1),
    out: str = typer.Option("docs/benchmarks.md"),
) -> None:
    """A training step of a real model on this CPU, full fine-tuning against LoRA (peft):
    seconds a step and trainable state -> docs/benchmarks.md."""
    from rstar.bench.lora import run

    run(model, rows, tokens, rounds, lora_rank, out)


def bench_peers_command(
    config: str = typer.Option("configs/tiny.yaml"),
    steps: int = typer.Option(20, min=2, help="RL steps each side trains per seed."),
    seeds: int = typer.Option(2, min=1),
    root: str = typer.Option(
        None,
        help="Storage root of a finished run of the recipe (default: "
        "the recipe's): its SFT checkpoint and problems.",
    ),
    code_judge: str = typer.Option(
        None,
        help="A code-judge checkout (github.com/0xWJ/code-judge) "
        "to measure the sandbox against; without it, only this project's sandbox is measured.",
    ),
    out: str = typer.Option("docs/benchmarks.md"),
    png: str = typer.Option("docs/peers.png"),
) -> None:
    """The local RL trainer against TRL's GRPOTrainer, and the sandbox against code-judge, on the
    same work -> docs/benchmarks.md."""
    from rstar.bench.peers.bench import run_peer_benchmark

    run_peer_benchmark(config, steps, seeds, root, out, png, code_judge)


def bench_engines_command(
    config: str = typer.Option("configs/tiny.yaml"),
    steps: int = typer.Option(6, min=2, help="Steps of RL stage 1's rollouts per engine."),
    root: str = typer.Option(
        None,
        help="Storage root of a finished run of the recipe (default: the recipe's): its SFT "
        "checkpoint and problems.",
    ),
    out: str = typer.Option("docs/benchmarks.md"),
) -> None:
    """The embedded HF engine against vLLM's CPU build on the recipe's stage-1 rollouts, side by
    side -> docs/benchmarks.md."""
    from rstar.bench.peers.engines import run_engine_benchmark

    run_engine_benchmark(config, steps, root, out)


def bench_scheduler_command(
    model: str = typer.Option(
        None, help="Tiny model directory (HF format) to calibrate and run replicas."
    ),
    out: str = typer.Option("docs/benchmarks.md"),
    rollouts_per_replica: int = typer.Option(
        256, help="the paper: 512 prompts x 32 samples on 64 GPUs"
    ),
    real_rollouts: int = typer.Option(24),
    fake: bool = typer.Option(
        False,
        "--fake",
        help="Measure the scheduler's own cost instead: one turn of --queue requests over "
        "--replicas replicas that answer at once.",
    ),
    queue: int = typer.Option(336_000, min=1, help="--fake: requests in the turn"),
    replicas: int = typer.Option(64, min=1, help="--fake: replicas"),
    in_flight: int = typer.Option(8_192, min=1, help="--fake: requests in flight when streamed"),
) -> None:
    """Static split vs KV-aware balanced scheduling: calibrated simulation and a real 2-replica
    run (--model); or, with --fake, the balanced scheduler's overhead at the recipe's scale."""
    if fake:
        from rstar.bench.overhead import run_overhead_benchmark

        run_overhead_benchmark(queue, replicas, in_flight, out)
        return
    if not model:
        raise typer.BadParameter("give --model (a tiny model directory), or --fake")
    from rstar.bench.scheduler import run_scheduler_benchmark

    run_scheduler_benchmark(model, out, rollouts_per_replica, real_rollouts)
