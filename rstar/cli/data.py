"""`rstar data ...`: synthesise, curate and mine problem sets from the command line."""

from __future__ import annotations

import json
import os

import typer
from rich.console import Console

from rstar.cli.common import progress_bar

app = typer.Typer(
    help="Problem data: synthetic sets, curation, hard-sample mining.", no_args_is_help=True
)
console = Console()


@app.command()
def synth(
    out: str = typer.Option(..., help="Parquet file to write (problems schema)."),
    n: int = typer.Option(1000, help="How many problems."),
    seed: int = typer.Option(0),
    levels: str = typer.Option("1,2,3", help="Difficulty levels to cycle through."),
    families: str = typer.Option("", help="Comma-separated families (default: all)."),
) -> None:
    """Generate integer-answer problems where Python is the natural route."""
    from rstar.data.io import write_table
    from rstar.data.synth import FAMILIES, generate

    with progress_bar(console) as bar:
        task = bar.add_task("generating", total=n)
        rows = generate(
            n,
            seed=seed,
            levels=tuple(int(x) for x in levels.split(",")),
            families=[f for f in families.split(",") if f] or None,
        )
        bar.update(task, completed=n)
    write_table(rows, out, "problems")
    counts = {f.name: sum(r["source"] == f"synthetic/{f.name}" for r in rows) for f in FAMILIES}
    console.print(
        f"wrote {len(rows)} problems to {out}: "
        + ", ".join(f"{k} {v}" for k, v in counts.items() if v)
    )


@app.command()
def sft(
    out: str = typer.Option(..., help="Parquet file to write (sft schema)."),
    n: int = typer.Option(2000),
    seed: int = typer.Option(0),
    load: str = typer.Option(
        "", help="Instead of generating, convert this JSONL/Parquet of chat messages."
    ),
) -> None:
    """Non-reasoning SFT examples (format, tool calls, instruction following), or real ones
    converted."""
    from rstar.data.io import write_table
    from rstar.data.sft import generate, load_sft

    rows = load_sft(load) if load else generate(n, seed=seed)
    write_table(rows, out, "sft")
    tasks: dict[str, int] = {}
    for r in rows:
        tasks[r["task"]] = tasks.get(r["task"], 0) + 1
    console.print(f"wrote {len(rows)} SFT examples to {out}: {tasks}")


@app.command()
def curate(
    source: list[str] = typer.Option(
        ...,
        help="PATH[:preset] of a .parquet/.jsonl file or hub dataset "
        "(repeatable; presets: generic, dapo, openmathreasoning, project_euler, aops).",
    ),
    out: str = typer.Option(..., help="Parquet file of kept problems."),
    eval_set: list[str] = typer.Option([], help="Problems to decontaminate against (repeatable)."),
    max_answer_digits: int = typer.Option(30),
    ngram: int = typer.Option(8),
    consistency_model: str = typer.Option(
        "",
        help="Checkpoint whose sampled answers must agree with the "
        "label (the consistency filter; off when empty).",
    ),
    consistency_k: int = typer.Option(16, help="Answers sampled per problem."),
    consistency_min: int = typer.Option(2, help="Matching answers needed to keep a problem."),
    consistency_max_tokens: int = typer.Option(
        1024, help="Response budget of each sampled rollout."
    ),
) -> None:
    """Filter sources into one problem set; rejects and a report are written beside it."""
    from rstar.agent.sampling import Sampling
    from rstar.data.curate import CurationConfig, SourceSpec, write_report
    from rstar.data.curate import curate as run
    from rstar.data.sources import read_rows
    from rstar.rollout.runner import consistency_sampler

    eval_problems = []
    for path in eval_set:
        eval_problems += [
            r["problem"] for _, r in read_rows(path) if isinstance(r, dict) and "problem" in r
        ]
    stem = os.path.splitext(out)[0]
    with progress_bar(console) as bar:
        task = bar.add_task("curating", total=None)
        report = run(
            [SourceSpec.parse(s) for s in source],
            out,
            f"{stem}.rejects.parquet",
            eval_problems=eval_problems,
            cfg=CurationConfig(
                max_answer_digits=max_answer_digits, ngram=ngram, consistency_min=consistency_min
            ),
            sampler=consistency_sampler(
                consistency_model,
                consistency_k,
                Sampling(max_response_tokens=consistency_max_tokens),
            )
            if consistency_model
            else None,
            progress=lambda k: bar.advance(task, k),
        )
    write_report(report, f"{stem}.report.json")
    console.print(report.format())
    console.print(f"kept -> {out}; rejects -> {stem}.rejects.parquet; report -> {stem}.report.json")


@app.command("mine-hard")
def mine_hard(
    problems: str = typer.Option(..., help="Problems Parquet the rollouts were sampled from."),
    rollouts: str = typer.Option(
        ..., help="Parquet or JSONL of rollouts with problem_id and reward."
    ),
    out: str = typer.Option(..., help="Parquet file of hard problems."),
    k: int = typer.Option(8, help="Rollouts per problem; problems solved k/k are dropped."),
) -> None:
    """Keep the problems the policy does not solve every time (the stage-3 set)."""
    from rstar.data.io import read_table, write_json, write_table
    from rstar.data.mine import mine_hard as run
    from rstar.data.sources import read_rows

    records = [r for _, r in read_rows(rollouts) if isinstance(r, dict)]
    hard, report = run(read_table(problems, "problems").to_pylist(), records, k=k)
    write_table(hard, out, "hard_problems")
    write_json(report.to_dict(), f"{os.path.splitext(out)[0]}.report.json")
    console.print(report.format())
    console.print(json.dumps(report.to_dict()))
