"""`rstar model build-base` (the embedded default's base model) and `rstar lineage`."""

from __future__ import annotations

import typer

from rstar.cli.common import overrides

app = typer.Typer(help="The embedded default's base model.", no_args_is_help=True)


@app.command("build-base")
def build_base_command(
    config: str = typer.Option("configs/tiny.yaml", help="Recipe whose `base` section to build."),
    out: str = typer.Option(None, help="Directory to write (default: the recipe's base.shipped)."),
    threads: int = typer.Option(2, help="torch threads (the shipped base was built with 2)."),
    set_: list[str] = typer.Option(
        [], "--set", help="Override a recipe value: KEY=VALUE (repeatable)."
    ),
) -> None:
    """Pretrain the tiny base of a recipe and write it with its manifest (digest, versions, CPU)."""
    import time

    import torch
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from rstar.eval.copying import copy_probe
    from rstar.model.shipped import pretrain_base, write_shipped
    from rstar.pipeline.config import load_recipe

    # the base it writes need not exist yet
    recipe = load_recipe(config, overrides(set_), check_inputs=False)
    out = out or recipe.base.shipped
    if not recipe.base.build_tiny or not out:
        raise typer.BadParameter(
            "the recipe builds no tiny base, or no --out and no base.shipped to write to"
        )
    torch.set_num_threads(threads)
    start = time.time()
    with Progress(
        TextColumn("pretraining"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}"),
        TimeElapsedColumn(),
    ) as bar:
        job = bar.add_task("pretrain", total=recipe.base.pretrain_steps, loss="-")
        model, tok, history = pretrain_base(
            recipe.base, on_step=lambda s, m: bar.update(job, completed=s, loss=f"{m['loss']:.3f}")
        )
    seconds = time.time() - start
    metrics = {
        "pretrain_loss": history[-1]["loss"],
        **{f"copy_{k}": v for k, v in copy_probe(model, tok, chat=False).items()},
    }
    write_shipped(
        model,
        tok,
        recipe.base,
        out,
        seconds=seconds,
        metrics=metrics,
        rebuild=f"rstar model build-base --config {config}"
        + (f" --out {out}" if out != recipe.base.shipped else ""),
    )
    print(f"base written to {out} in {seconds:.0f} s: {metrics}")


def lineage_command(
    version: str = typer.Argument(..., help="NAME/VERSION of a registered model, or VERSION."),
    config: str = typer.Option(
        "configs/tiny.yaml", help="Recipe naming the MLflow store and model."
    ),
    tracking_uri: str = typer.Option(None, help="MLflow tracking URI (default: the recipe's)."),
) -> None:
    """Print data -> SFT -> RL stages -> evaluation for a model version, from MLflow alone."""
    from rstar.pipeline.config import load_recipe
    from rstar.tracking.lineage import format_lineage, lineage

    recipe = load_recipe(config)
    print(
        format_lineage(
            lineage(
                tracking_uri or recipe.tracking.tracking_uri,
                version,
                recipe.tracking.registered_model,
            )
        )
    )
