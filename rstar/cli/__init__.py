"""The `rstar` command line of the library: the sandbox, data, reward, rollouts, evaluation,
the tiny base, lineage and the library's benchmarks.

The pipeline's commands (`rstar pipeline run|plan|reevaluate`, `rstar serve`, `rstar
bench-recipe`) run Prefect flows, which sit above this library; flows/cli.py adds them to this
`app`, and the installed `rstar` command is that whole command line.
"""

from __future__ import annotations

import typer

from rstar.cli import bench, data, evaluation, model, reward, rollout, sandbox

app = typer.Typer(
    help="rstar: agentic RL for math reasoning, as a pipeline people can run.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
_debug = {"on": False}  # `rstar --debug`, set by the callback, read by main() when a command fails


@app.callback()
def _global_options(
    debug: bool = typer.Option(
        False,
        "--debug",
        help="Show the traceback of an error in a file, recipe or setting instead of one line.",
    ),
    log_level: str = typer.Option(
        "INFO",
        "--log-level",
        help="rstar's log lines at this level and above (DEBUG, INFO, WARNING).",
    ),
) -> None:
    from rstar.logs import configure

    _debug["on"] = debug
    configure(log_level)


app.add_typer(sandbox.app, name="sandbox")
app.add_typer(data.app, name="data")
app.add_typer(reward.app, name="reward")
app.add_typer(model.app, name="model")
app.command("rollout")(rollout.rollout_command)
app.command("eval")(evaluation.eval_command)
app.command("lineage")(model.lineage_command)
app.command("bench-scheduler")(bench.bench_scheduler_command)
app.command("bench-peers")(bench.bench_peers_command)
app.command("bench-engines")(bench.bench_engines_command)
app.command("bench-lora")(bench.bench_lora_command)


def main(command: typer.Typer = app) -> None:
    """Run `command` (this app, or one extended with more commands) as the `rstar` entry point.
    The environment defaults are set first, before anything loads Prefect or Ray
    (rstar.environment). An error no retry can fix (a bad recipe, file, row or setting:
    rstar.errors.NotRetryable) is one line naming what is wrong; `rstar --debug ...` shows its
    traceback."""
    import os
    import sys

    from rstar.environment import apply_defaults
    from rstar.errors import NotRetryable

    apply_defaults()
    try:
        command()
    except NotRetryable as e:
        if _debug["on"] or os.environ.get("RSTAR_DEBUG"):
            raise
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
