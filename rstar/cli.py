"""The `rstar` command line."""
from __future__ import annotations

import asyncio
import logging

import typer

from rstar.data.cli import app as data_app
from rstar.reward.cli import app as reward_app
from rstar.eval.cli import eval_command
from rstar.rollout.cli import bench_scheduler_command, rollout_command

app = typer.Typer(help="rstar: agentic RL for math reasoning, as a pipeline people can run.",
                  no_args_is_help=True, pretty_exceptions_enable=False)
_debug = {"on": False}  # `rstar --debug`, read by main() when a command fails


@app.callback()
def _options(debug: bool = typer.Option(False, "--debug", help="Show the traceback of an error in a file, "
                                                               "recipe or setting instead of one line.")) -> None:
    _debug["on"] = debug


sandbox_app = typer.Typer(help="The isolated Python sandbox that runs the model's tool calls.",
                          no_args_is_help=True)
app.add_typer(sandbox_app, name="sandbox")
app.add_typer(data_app, name="data")
app.add_typer(reward_app, name="reward")
app.command("rollout")(rollout_command)
app.command("bench-scheduler")(bench_scheduler_command)
app.command("eval")(eval_command)
pipeline_app = typer.Typer(help="The training pipeline as Prefect flows (see flows/).", no_args_is_help=True)
app.add_typer(pipeline_app, name="pipeline")


def _overrides(values: list[str]) -> dict:
    import yaml

    bad = [v for v in values if "=" not in v]
    if bad:
        raise typer.BadParameter(f"expected KEY=VALUE, got {bad}")
    return {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in values)}


@pipeline_app.command("run")
def pipeline_run(config: str = typer.Option("configs/tiny.yaml", help="The recipe (YAML)."),
                 set_: list[str] = typer.Option([], "--set", help="Override a recipe value: KEY=VALUE, e.g. "
                                                                   "rl.0.steps=2 (repeatable)."),
                 report_json: str = typer.Option(None, help="Also write what the run measured (metrics, seconds, "
                                                            "accuracy, verdict) to this JSON file.")) -> None:
    """Run the whole recipe: base, problems, SFT, RL stages, mining, evaluation."""
    import json

    from rstar.pipeline.config import ConfigError, load_recipe
    from rstar.pipeline.stages import Layout
    from rstar.storage.lock import RootBusy, check_free
    from rstar.tracking.mlflow_log import TrackingUnreachable, absolute_uri, check_reachable

    overrides = _overrides(set_)
    try:  # what cannot run fails here, in one line, before Prefect starts (the flow checks again)
        recipe = load_recipe(config, overrides)
        check_reachable(absolute_uri(recipe.tracking.tracking_uri))
        check_free(Layout(recipe.storage_root).root)
    except (ConfigError, TrackingUnreachable, RootBusy) as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(1) from None
    from flows.pipeline import pipeline
    from rstar.pipeline.bench import pipeline_report
    from rstar.storage import atomic_write_text

    outs = pipeline(config, overrides)
    if report_json:
        report = pipeline_report(recipe, outs)
        atomic_write_text(report_json, json.dumps(report, indent=1, default=str))


@pipeline_app.command("plan")
def pipeline_plan(config: str = typer.Option("configs/tiny.yaml", help="The recipe (YAML)."),
                  set_: list[str] = typer.Option([], "--set", help="Override a recipe value: KEY=VALUE (repeatable)."),
                  as_json: bool = typer.Option(False, "--json", help="Print {\"stages\": [...]} as JSON.")) -> None:
    """Print each stage's engine, Ray job resources and (verl stages) the checked verl command; run nothing."""
    import json
    import shlex

    from rstar.pipeline.config import ConfigError, load_recipe
    from rstar.pipeline.plan import PlanError, plan

    try:
        stages = plan(load_recipe(config, _overrides(set_), check_inputs=False))  # a plan reads no data
    except ConfigError as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(1) from None
    except PlanError as e:
        typer.echo(f"{config}: {e}", err=True)
        raise typer.Exit(1) from None
    if as_json:
        print(json.dumps({"stages": stages}, indent=1))
        return
    for s in stages:
        r = s["resources"]
        workers = r.get("verl_workers")
        print(f"{s['name']:<10} {s['engine']:<13} driver: cpus {r['cpus']:g}, gpus {r['gpus']:g}"
              + (f"; verl workers: {workers['nodes']} node(s) x {workers['gpus_per_node']:g} GPU(s)" if workers else "")
              + (f"; {r['replicas']} engine replicas" if "replicas" in r else ""))
        if s["command"]:
            print("    " + shlex.join(s["command"]))


@pipeline_app.command("reevaluate")
def pipeline_reevaluate(config: str = typer.Option("configs/tiny.yaml"),
                        version: list[str] = typer.Option([], help="NAME/VERSION or 'latest' (repeatable)."),
                        problems: str = typer.Option(None, help="Problems-schema Parquet (default: held-out set).")
                        ) -> None:
    """Evaluate registered model versions and attach the results to their lineage."""
    from flows.reevaluate import reevaluate

    reevaluate(config, version or None, problems)


@app.command("serve")
def serve_command(config: str = typer.Option("configs/tiny.yaml"), name: str = typer.Option("tiny"),
                  cron: str = typer.Option("0 3 * * *", help="Schedule of the nightly re-evaluation.")) -> None:
    """Register the pipeline and nightly re-evaluation deployments and serve their runs."""
    from flows.deploy import serve_all

    serve_all(config, name, cron)


@app.command("bench-recipe")
def bench_recipe_command(config: str = typer.Option("configs/tiny.yaml"),
                         out: str = typer.Option("docs/benchmarks.md"),
                         png: str = typer.Option("docs/tiny_ablation.png"),
                         seeds: int = typer.Option(3, min=1, help="Seeds of the RoC-vs-GRPO ablation (each runs "
                                                                  "stage 1 twice), or with --robustness of the whole recipe."),
                         robustness: bool = typer.Option(False, help="Instead: the whole recipe from the base per seed, "
                                                                     "kernel set and thread count (rstar.pipeline.robustness)."),
                         rebuild_base: bool = typer.Option(False, help="With --robustness: pretrain the base in every run "
                                                                       "(its seed moved too) instead of the shipped one."),
                         root: str = typer.Option("runs/robustness", help="With --robustness: storage of the runs.")) -> None:
    """The tiny recipe's time, accuracy per stage and RoC-vs-GRPO ablation -> docs/benchmarks.md."""
    if robustness:
        from rstar.pipeline.robustness import run_robustness

        run_robustness(config, out, seeds, rebuild_base, root)
        return
    from rstar.pipeline.bench import run_recipe_benchmark

    run_recipe_benchmark(config, out, png, seeds)


@app.command("bench-peers")
def bench_peers_command(config: str = typer.Option("configs/tiny.yaml"),
                        steps: int = typer.Option(20, min=2, help="RL steps each side trains per seed."),
                        seeds: int = typer.Option(2, min=1),
                        root: str = typer.Option(None, help="Storage root of a finished run of the recipe (default: "
                                                            "the recipe's): its SFT checkpoint and problems."),
                        code_judge: str = typer.Option(None, help="A code-judge checkout (github.com/0xWJ/code-judge) "
                                                                  "to measure the sandbox against; without it, "
                                                                  "only this project's sandbox is measured."),
                        out: str = typer.Option("docs/benchmarks.md"),
                        png: str = typer.Option("docs/peers.png")) -> None:
    """The local RL trainer against TRL's GRPOTrainer, and the sandbox against code-judge, on the same
    work -> docs/benchmarks.md."""
    from rstar.peers.bench import run_peer_benchmark

    run_peer_benchmark(config, steps, seeds, root, out, png, code_judge)


model_app = typer.Typer(help="The embedded default's base model.", no_args_is_help=True)
app.add_typer(model_app, name="model")


@model_app.command("build-base")
def build_base_command(config: str = typer.Option("configs/tiny.yaml", help="Recipe whose `base` section to build."),
                       out: str = typer.Option(None, help="Directory to write (default: the recipe's base.shipped)."),
                       threads: int = typer.Option(2, help="torch threads (the shipped base was built with 2)."),
                       set_: list[str] = typer.Option([], "--set", help="Override a recipe value: KEY=VALUE (repeatable).")
                       ) -> None:
    """Pretrain the tiny base of a recipe and write it with its manifest (digest, versions, CPU)."""
    import time

    import torch
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from rstar.eval.copying import copy_probe
    from rstar.model.shipped import pretrain_base, write_shipped
    from rstar.pipeline.config import load_recipe

    recipe = load_recipe(config, _overrides(set_), check_inputs=False)  # the base it writes need not exist yet
    out = out or recipe.base.shipped
    if not recipe.base.build_tiny or not out:
        raise typer.BadParameter("the recipe builds no tiny base, or no --out and no base.shipped to write to")
    torch.set_num_threads(threads)
    start = time.time()
    with Progress(TextColumn("pretraining"), BarColumn(), MofNCompleteColumn(), TextColumn("loss {task.fields[loss]}"),
                  TimeElapsedColumn()) as bar:
        job = bar.add_task("pretrain", total=recipe.base.pretrain_steps, loss="-")
        model, tok, history = pretrain_base(recipe.base, on_step=lambda s, m: bar.update(
            job, completed=s, loss=f"{m['loss']:.3f}"))
    seconds = time.time() - start
    metrics = {"pretrain_loss": history[-1]["loss"],
               **{f"copy_{k}": v for k, v in copy_probe(model, tok, chat=False).items()}}
    write_shipped(model, tok, recipe.base, out, seconds=seconds, metrics=metrics,
                  rebuild=f"rstar model build-base --config {config}" + (f" --out {out}" if out != recipe.base.shipped else ""))
    print(f"base written to {out} in {seconds:.0f} s: {metrics}")


@app.command("lineage")
def lineage_command(version: str = typer.Argument(..., help="NAME/VERSION of a registered model, or VERSION."),
                    config: str = typer.Option("configs/tiny.yaml", help="Recipe naming the MLflow store and model."),
                    tracking_uri: str = typer.Option(None, help="MLflow tracking URI (default: the recipe's).")) -> None:
    """Print data -> SFT -> RL stages -> evaluation for a model version, from MLflow alone."""
    from rstar.pipeline.config import load_recipe
    from rstar.tracking.lineage import format_lineage, lineage

    recipe = load_recipe(config)
    print(format_lineage(lineage(tracking_uri or recipe.tracking.tracking_uri, version,
                                 recipe.tracking.registered_model)))


def _sandbox_config(executors: int | None, slots: int | None, uid_base: int | None, timeout_s: float | None,
                    batch_size: int | None = None, config: str | None = None):
    from rstar.sandbox.config import SandboxConfig

    cfg = SandboxConfig.from_yaml(config) if config else SandboxConfig()
    if batch_size is not None:
        cfg.batch_size = batch_size
    if executors is not None:
        cfg.lean_executors = cfg.warm_executors = executors
    if slots is not None:
        cfg.slots_per_executor = slots
    if uid_base is not None:
        cfg.uid_base = uid_base
    if timeout_s is not None:
        cfg.timeout_s = timeout_s
    return cfg


@sandbox_app.command()
def serve(
    host: str = typer.Option("127.0.0.1", help="Address to bind (keep loopback unless behind a firewall)."),
    port: int = typer.Option(8080),
    config: str = typer.Option(None, help="YAML file of sandbox settings (see configs/sandbox.yaml)."),
    executors: int = typer.Option(None, help="Executors per flavour (lean and warm); default: CPU count."),
    slots: int = typer.Option(None, help="Concurrent calls per executor."),
    uid_base: int = typer.Option(None, help="First uid for calls; give each node on one host its own range."),
    timeout_s: float = typer.Option(None, help="Default wall-clock limit per call."),
    batch_size: int = typer.Option(None, help="Calls per batch sent to a node."),
    worker: list[str] = typer.Option([], help="URL of a worker node to dispatch to (repeatable)."),
    join: str = typer.Option(None, help="URL of a head service to register with as a worker node."),
    local: bool = typer.Option(True, help="Run calls on this machine (--no-local: a head that only dispatches)."),
    log_level: str = typer.Option("warning"),
) -> None:
    """Serve the sandbox over HTTP: native, code-judge and SandboxFusion APIs."""
    from rstar.sandbox.process import serve as _serve

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    _serve(host, port, _sandbox_config(executors, slots, uid_base, timeout_s, batch_size, config), local=local, workers=worker,
           join=join, log_level=log_level)


@sandbox_app.command()
def bench(
    trivial_calls: int = typer.Option(4000, help="Calls of print(1+1) through the batch API."),
    sympy_calls: int = typer.Option(800, help="Calls of a sympy factorisation through the batch API."),
    baseline_calls: int = typer.Option(200, help="Calls for each subprocess-per-call baseline."),
    single_calls: int = typer.Option(300, help="Sequential single calls for the latency figure."),
    out: str = typer.Option("docs/benchmarks.md", help="Markdown file whose sandbox section is rewritten."),
) -> None:
    """Measure the service against a subprocess-per-call baseline; write docs/benchmarks.md."""
    from rstar.sandbox.bench import run_benchmarks

    run_benchmarks(trivial_calls, sympy_calls, baseline_calls, single_calls, out)


@sandbox_app.command()
def demo() -> None:
    """Run friendly and hostile snippets in the embedded sandbox and show what happened."""
    from rstar.sandbox.demo import run_demo

    asyncio.run(run_demo())


@sandbox_app.command("exec")
def exec_(code: str = typer.Argument(..., help="Python code; '-' reads standard input."),
          stdin: str = typer.Option("", help="Text given to the code on its standard input."),
          timeout_s: float = typer.Option(None)) -> None:
    """Run one snippet in the embedded sandbox and print its result as JSON."""
    import json
    import sys

    from rstar.sandbox.service import SandboxService

    if code == "-":
        code = sys.stdin.read()

    async def one():
        cfg = _sandbox_config(1, 2, None, None)
        async with SandboxService(cfg) as sb:
            return await sb.run(code, stdin, timeout_s=timeout_s)

    print(json.dumps(asyncio.run(one()).to_dict(), indent=2))


def main() -> None:
    """The `rstar` entry: an error no retry can fix (a bad recipe, file, row or setting:
    rstar.errors.NotRetryable) is one line naming what is wrong; `rstar --debug ...` shows its
    traceback."""
    import os
    import sys

    from rstar.errors import NotRetryable

    try:
        app()
    except NotRetryable as e:
        if _debug["on"] or os.environ.get("RSTAR_DEBUG"):
            raise
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
