"""`rstar eval`: evaluate checkpoints on benchmarks with the paper's protocol."""

from __future__ import annotations

import json
import os
from dataclasses import replace

import typer
from rich.console import Console

from rstar.agent.sampling import EVAL_SAMPLING
from rstar.cli.common import progress_bar


def eval_command(
    model: list[str] = typer.Option(..., help="NAME=DIR of a checkpoint to evaluate (repeatable)."),
    bench: list[str] = typer.Option(
        ...,
        help="NAME[=FILE]: a benchmark (aime24, aime25, hmmt25, math500, "
        "gpqa_diamond) from its hub name or a local file, or problems=FILE for a problems-schema "
        "Parquet (repeatable).",
    ),
    out: str = typer.Option(
        ..., help="Directory for per-sample Parquet, summary JSON and the markdown table."
    ),
    k: int = typer.Option(16),
    temperature: float = typer.Option(EVAL_SAMPLING.temperature),
    max_response_tokens: int = typer.Option(EVAL_SAMPLING.max_response_tokens),
    max_turns: int = typer.Option(EVAL_SAMPLING.max_turns),
    limit: int = typer.Option(0, help="Only the first N questions of each benchmark (0: all)."),
    prompt_style: str = typer.Option(
        None,
        help="paper | compact. Default: the style each checkpoint was trained "
        "with (stored beside it by the pipeline), else paper.",
    ),
) -> None:
    """k samples per question; avg pass@1, pass@k, majority vote, lengths, tool use per
    benchmark."""
    from rstar.agent.format import saved_style
    from rstar.data.io import read_table, write_json, write_table
    from rstar.eval.benchmarks import load_benchmark
    from rstar.eval.config import EvalConfig
    from rstar.eval.groups import group_table
    from rstar.eval.metrics import question_accuracy
    from rstar.eval.report import write_report
    from rstar.eval.run import evaluate_model, markdown_table

    console = Console()
    for (
        spec
    ) in model:  # every model first, so a typo fails in a second, not after the benchmarks load
        name, _, path = spec.partition("=")
        if not name or not path:
            raise typer.BadParameter(f"{spec!r}: expected NAME=DIR", param_hint="--model")
        if not (os.path.isdir(path) and os.path.exists(os.path.join(path, "config.json"))):
            raise typer.BadParameter(
                f"{name}: {path} is not a model directory (no config.json there)",
                param_hint="--model",
            )
    problems = []
    for spec in bench:
        name, _, source = spec.partition("=")
        rows = (
            read_table(source, "problems").to_pylist()
            if name == "problems"
            else load_benchmark(name, source or None)
        )
        problems += rows[:limit] if limit else rows
    sampling = replace(
        EVAL_SAMPLING,
        temperature=temperature,
        max_response_tokens=max_response_tokens,
        max_turns=max_turns,
    )
    cfg = EvalConfig(k=k, sampling=sampling)
    summaries, questions = {}, {}
    for spec in model:
        name, _, path = spec.partition("=")
        with progress_bar(console, f"eval {name}") as bar:
            task = bar.add_task("", total=len(problems) * k)
            style = prompt_style or saved_style(path) or "paper"
            records, summaries[name] = evaluate_model(
                path,
                problems,
                cfg,
                prompt_style=style,
                name=name,
                progress=lambda n, task=task: bar.advance(task, n),
            )
        write_table(records, os.path.join(out, f"{name}.samples.parquet"), "trajectories")
        questions[name] = question_accuracy(records)
    write_json(summaries, os.path.join(out, "summary.json"))
    by_group = group_table(questions, problems)
    paths = write_report(summaries, k, out, by_group)
    console.print(markdown_table(summaries, k, by_group))
    console.print("report: " + ", ".join(paths))
    console.print(json.dumps(summaries, indent=2))
