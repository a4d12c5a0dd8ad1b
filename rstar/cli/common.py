"""What more than one command uses: `--set` overrides and a progress bar."""

from __future__ import annotations

import typer


def overrides(values: list[str]) -> dict:
    """`--set KEY=VALUE` options as recipe overrides ({"rl1.steps": 2}); values are YAML."""
    import yaml

    bad = [v for v in values if "=" not in v]
    if bad:
        raise typer.BadParameter(f"expected KEY=VALUE, got {bad}")
    return {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in values)}


def progress_bar(console, label: str = "{task.description}"):
    """A rich bar: the label, the bar, done/total, time elapsed."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console
    )
