"""The installed `rstar` command: the library's commands (rstar.cli) and the pipeline's, which
run the Prefect flows of this package:

    rstar pipeline run --config configs/tiny.yaml        # the whole recipe
    rstar pipeline plan --config configs/qwen3-14b.yaml  # each stage's engine and verl command
    rstar pipeline reevaluate --version rstar-tiny/5     # evaluate registered versions again
    rstar serve                                          # the deployments: Run button, nightly
    rstar bench-recipe                                   # the recipe's figures -> benchmarks
"""

from __future__ import annotations

import sys

import typer

from rstar.cli import app
from rstar.cli import main as run_app
from rstar.cli.common import overrides

pipeline_app = typer.Typer(
    help="The training pipeline as Prefect flows (see flows/).", no_args_is_help=True
)
app.add_typer(pipeline_app, name="pipeline")
# how a benchmark starts this command line in a fresh process of its own
RSTAR = [sys.executable, "-m", "flows.cli"]


@pipeline_app.command("run")
def pipeline_run(
    config: str = typer.Option("configs/tiny.yaml", help="The recipe (YAML)."),
    set_: list[str] = typer.Option(
        [],
        "--set",
        help="Override a recipe value: KEY=VALUE, e.g. rl1.steps=2 (an RL stage by its name, "
        "or by position: rl.0.steps) (repeatable).",
    ),
    report_json: str = typer.Option(
        None,
        help="Also write what the run measured (metrics, seconds, "
        "accuracy, verdict) to this JSON file.",
    ),
    until: str = typer.Option(
        None,
        help="Stop after this stage (base, problems, sft, an RL stage's name, mine, evaluate); "
        "a later run serves it from cache.",
    ),
) -> None:
    """Run the whole recipe: base, problems, SFT, RL stages, mining, evaluation."""
    import json

    from rstar.environment import PrefectHomeUnusable, check_prefect_home
    from rstar.pipeline.config import ConfigError, load_recipe
    from rstar.pipeline.layout import Layout
    from rstar.pipeline.stage_table import check_until
    from rstar.storage.lock import RootBusy, check_free
    from rstar.tracking.mlflow_log import TrackingUnreachable, absolute_uri, check_reachable

    values = overrides(set_)
    try:  # what cannot run fails here, in one line, before Prefect starts (the flow checks again)
        recipe = load_recipe(config, values)
        check_until(recipe, until)
        check_reachable(absolute_uri(recipe.tracking.tracking_uri))
        check_free(Layout(recipe.storage_root).root)
        check_prefect_home()
    except (ConfigError, TrackingUnreachable, RootBusy, PrefectHomeUnusable) as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(1) from None
    from flows.pipeline import pipeline
    from rstar.pipeline.report import pipeline_report
    from rstar.storage import atomic_write_text

    outs = pipeline(config, values, until=until)
    if report_json:
        report = pipeline_report(recipe, outs)
        atomic_write_text(report_json, json.dumps(report, indent=1, default=str))


@pipeline_app.command("plan")
def pipeline_plan(
    config: str = typer.Option("configs/tiny.yaml", help="The recipe (YAML)."),
    set_: list[str] = typer.Option(
        [], "--set", help="Override a recipe value: KEY=VALUE (repeatable)."
    ),
    as_json: bool = typer.Option(False, "--json", help='Print {"stages": [...]} as JSON.'),
) -> None:
    """Print each stage's engine, Ray job resources and (verl stages) the checked verl command; run
    nothing."""
    import json
    import shlex

    from rstar.pipeline.config import ConfigError, load_recipe
    from rstar.pipeline.plan import PLACEHOLDERS, PlanError, plan

    try:
        # a plan reads no data
        stages = plan(load_recipe(config, overrides(set_), check_inputs=False))
    except ConfigError as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(1) from None
    except PlanError as e:
        typer.echo(f"{config}: {e}", err=True)
        raise typer.Exit(1) from None
    if as_json:
        print(json.dumps({"stages": stages, "placeholders": PLACEHOLDERS}, indent=1))
        return
    if any(s["command"] for s in stages):
        print(f"verl commands below hold placeholders. {PLACEHOLDERS}")
    for s in stages:
        r = s["resources"]
        workers = r.get("verl_workers")
        print(
            f"{s['name']:<10} {s['engine']:<13} driver: cpus {r['cpus']:g}, gpus {r['gpus']:g}"
            + (
                f"; verl workers: {workers['nodes']} node(s) x {workers['gpus_per_node']:g} GPU(s)"
                if workers
                else ""
            )
            + (f"; {r['replicas']} engine replicas" if "replicas" in r else "")
        )
        for line in s["gpu_settings"]:
            print("    GPU settings: " + line)
        if s["command"]:
            print("    " + shlex.join(s["command"]))


@pipeline_app.command("rehearse")
def pipeline_rehearse(
    config: str = typer.Option("configs/qwen3-14b.yaml", help="The GPU recipe (YAML)."),
    set_: list[str] = typer.Option(
        [], "--set", help="Override a recipe value: KEY=VALUE (repeatable)."
    ),
    workdir: str = typer.Option(
        ".rstar/rehearsal", help="Where the stand-in model, logs, MLflow and the shared volume go."
    ),
    as_json: bool = typer.Option(False, "--json", help='Print {"stages": [...]} as JSON.'),
) -> None:
    """Run a GPU recipe on this machine's CPU as its cluster would: two hosts (network
    namespaces, root needed), a random model of its architecture, verl's command lines as the
    plan's but for the keys the output lists; each stage's result, time and differences."""
    import json
    import os

    from rstar.pipeline.config import ConfigError, load_recipe
    from rstar.pipeline.rehearsal import run
    from rstar.pipeline.rehearsal_cluster import RehearsalError, check_memory

    values = overrides(set_)
    try:
        recipe = load_recipe(config, values, check_inputs=False)
        if recipe.engine != "verl" or not recipe.resources.gpus:
            raise ConfigError(f"{config}: a rehearsal is of a GPU recipe (engine verl, gpus)")
        if os.geteuid() != 0:
            raise ConfigError("a rehearsal makes network namespaces: run it as root")
        check_memory()
    except (ConfigError, RehearsalError) as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(1) from None
    try:
        result = run(
            config,
            values,
            os.path.abspath(workdir),
            echo=lambda line: typer.echo(line, err=as_json),
        )
    except RehearsalError as e:
        typer.echo(f"rehearsal: {e}", err=True)
        raise typer.Exit(1) from None
    if as_json:
        print(json.dumps(result, indent=1))
    else:
        for stage in result["stages"]:
            for key, (planned, rehearsed) in stage.get("differs", {}).items():
                mark = "  REFUSED" if key in stage["refused"] else ""
                print(f"{stage['name']:<10} {key}: {planned} -> {rehearsed}{mark}")
    bad = [s for s in result["stages"] if s["status"] != "finished" or s.get("refused")]
    raise typer.Exit(1 if bad else 0)


@pipeline_app.command("reevaluate")
def pipeline_reevaluate(
    config: str = typer.Option("configs/tiny.yaml"),
    version: list[str] = typer.Option([], help="NAME/VERSION or 'latest' (repeatable)."),
    problems: str = typer.Option(
        None, help="Problems-schema Parquet (default: the recorded held-out set)."
    ),
    recorded: bool = typer.Option(
        True,
        "--recorded-settings/--recipe-settings",
        help="The settings and held-out set of the first version's last evaluation, or the "
        "recipe's.",
    ),
) -> None:
    """Evaluate registered model versions again and attach the results to their lineage."""
    from flows.reevaluate import reevaluate

    reevaluate(config, version or None, problems, recorded=recorded)


@app.command("serve")
def serve_command(
    config: str = typer.Option("configs/tiny.yaml"),
    name: str = typer.Option("tiny"),
    cron: str = typer.Option("0 3 * * *", help="Schedule of the nightly re-evaluation."),
) -> None:
    """Register the pipeline and nightly re-evaluation deployments and serve their runs."""
    from prefect import serve

    from flows.deploy import deployments, where_runs_write

    found = deployments(config, name, cron)
    typer.echo(where_runs_write(found))
    serve(*found)


@app.command("bench-recipe")
def bench_recipe_command(
    config: str = typer.Option("configs/tiny.yaml"),
    out: str = typer.Option("docs/benchmarks.md"),
    png: str = typer.Option("docs/tiny_ablation.png", help="Where the ablation's curves go."),
    seeds: int | None = typer.Option(
        None,
        min=1,
        show_default=False,
        help="Seeds of the RoC-vs-GRPO ablation (each runs stage 1 twice; default 5, the "
        "fewest its test can call significant), or with --robustness of the whole recipe "
        "(default 3).",
    ),
    ablation: str = typer.Option(
        "configs/roc-ablation.yaml",
        help="The RoC-vs-GRPO ablation's own recipe overrides (a YAML file of KEY: VALUE, "
        "applied over --set): it trains its own SFT, then stage 1 per mode and seed. '' "
        "ablates the recipe's own stage 1.",
    ),
    robustness: bool = typer.Option(
        False,
        help="Instead: the whole recipe from the base per seed, "
        "kernel set and thread count (rstar.bench.robustness).",
    ),
    rebuild_base: bool = typer.Option(
        False,
        help="With --robustness: pretrain the base in every run "
        "(its seed moved too) instead of the shipped one.",
    ),
    root: str = typer.Option("runs/robustness", help="With --robustness: storage of the runs."),
    ablation_only: bool = typer.Option(
        False,
        help="Only the RoC-vs-GRPO ablation: its recipe up to SFT, then stage 1 per mode and "
        "seed; its table printed, docs/benchmarks.md left as it is (give --png elsewhere).",
    ),
    set_: list[str] = typer.Option(
        [], "--set", help="Override a recipe value: KEY=VALUE (repeatable); not with --robustness."
    ),
) -> None:
    """The tiny recipe's time, accuracy per stage and RoC-vs-GRPO ablation -> docs/benchmarks.md;
    for a recipe on a real base (configs/smollm2.yaml), its figures per benchmark and stage."""
    if robustness:
        from rstar.bench.robustness import run_robustness

        run_robustness(config, out, seeds or 3, rebuild_base, root, RSTAR)
        return
    import time

    from flows.pipeline import pipeline
    from rstar.bench.recipe import (
        ablation_recipe,
        run_ablation,
        write_real_model_benchmark,
        write_recipe_benchmark,
    )
    from rstar.pipeline.config import load_recipe

    values = overrides(set_)
    recipe = load_recipe(config, values)
    if ablation_only or recipe.base.build_tiny:  # a real base has no tiny-scale ablation
        ablated, ablated_values = ablation_recipe(config, ablation, values)
    what = f"`{ablation}`'s overrides" if ablation else "the recipe's own stage 1"

    def run_the_ablation(sft_outs):
        return run_ablation(ablated, sft_outs["sft"].model.uri, seeds or 5, png, what)

    start = time.monotonic()
    if ablation_only:
        result = run_the_ablation(pipeline(config, ablated_values, until="sft"))
        verdict = f"target {'met' if result.met else 'NOT met'}; curves: {png}"
        typer.echo("\n".join([*result.table, verdict]))
        return
    outs = pipeline(config, values)
    wall = time.monotonic() - start
    if recipe.base.build_tiny:
        sft = pipeline(config, ablated_values, until="sft") if ablation else outs
        write_recipe_benchmark(config, outs, wall, run_the_ablation(sft), out, values)
    else:  # a real base: no tiny-scale ablation, figures per benchmark
        write_real_model_benchmark(config, outs, wall, out, values)


def main() -> None:
    run_app(app)


if __name__ == "__main__":
    main()
