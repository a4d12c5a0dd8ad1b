"""`rstar reward ...`: answer verification."""

from __future__ import annotations

import typer

app = typer.Typer(help="Answer verification.", no_args_is_help=True)


@app.command()
def bench(
    integer_items: int = typer.Option(20000),
    symbolic_items: int = typer.Option(300),
    out: str = typer.Option("docs/benchmarks.md"),
) -> None:
    """Integer and symbolic verification rates on this machine; writes docs/benchmarks.md."""
    from rstar.bench.reward import run_reward_benchmark

    run_reward_benchmark(integer_items, symbolic_items, out)
