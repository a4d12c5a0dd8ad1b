"""One Prefect task runs any pipeline stage: it opens the stage's MLflow child run, launches
the work as a Ray job, registers the stage's model, and leaves a markdown summary artifact.

Retries come from the recipe (`retries.count`, `retries.delay_s`); a retried RL stage resumes
from its checkpoint and continues its MLflow run (rstar.pipeline.stage_run). A failure another
attempt cannot fix (a recipe, a data file, a permission: `rstar.errors.retry_pointless`) is not
retried. The cache key is the stage's recipe section, its inputs' content digests and the code
version, so re-running a finished pipeline serves every stage from cache.
"""
from __future__ import annotations

import logging
import sys
from contextlib import contextmanager

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact

from rstar.errors import retry_pointless
from rstar.pipeline.config import Recipe
from rstar.pipeline.launch import run_job
from rstar.pipeline.plan import stage_names
from rstar.pipeline.progress import Bars
from rstar.pipeline.stage_run import open_stage_run
from rstar.pipeline.stages import Layout, outputs_exist, summary_markdown
from rstar.storage import dirs
from rstar.tracking import mlflow_log as ml


def worth_retrying(task, task_run, state) -> bool:
    return not retry_pointless(state.result(raise_on_failure=False))


@task(name="stage", task_run_name="{stage}", persist_result=True, retry_condition_fn=worth_retrying,
      cache_key_fn=lambda ctx, params: params["recipe"].cache_key(params["stage"], params["inputs"]))
def run_stage(stage: str, recipe: Recipe, inputs: dict, parent_run_id: str) -> dict:
    log = get_run_logger()
    uri = ml.absolute_uri(recipe.tracking.tracking_uri)
    tags = {ml.STAGE: stage, ml.PIPELINE: parent_run_id}
    if inputs.get("input_model"):
        tags[ml.INPUT_MODEL] = inputs["input_model"]
    for name, version in inputs.get("versions", {}).items():
        tags[f"{ml.EVALUATES}.{version}"] = name
    run_id, continued = open_stage_run(uri, recipe, stage, inputs, parent_run_id, tags)
    names = stage_names(recipe)
    where = f"stage {names.index(stage) + 1} of {len(names)} ({stage})" if stage in names else f"stage {stage}"
    log.info("%s: MLflow run %s%s", where, run_id, " (continued: it holds the earlier attempts' steps)"
             if continued else "")
    try:
        with _progress_bars() as on_progress:
            out = run_job(stage, recipe, inputs, uri, run_id, on_progress=on_progress)
    except BaseException:
        ml.end_run(uri, run_id, "FAILED")
        raise
    out["mlflow_run_id"] = run_id
    if "model" in out:
        # the version points at a copy later runs on this root cannot overwrite (models/<stage> is replaced)
        source = dirs.snapshot(out["model"], Layout(recipe.storage_root).registered(stage, out["model_digest"]))
        out["model_version"] = ml.register(uri, recipe.tracking.registered_model, source, run_id, stage,
                                           out["model_digest"], inputs.get("input_model"))
        ml.set_tags(uri, run_id, {"rstar.model_version": out["model_version"]})
    ml.end_run(uri, run_id)
    links = {"MLflow run": f"{uri} run {run_id}", "storage root": Layout(recipe.storage_root).root}
    links.update({k: out[k] for k in ("model", "model_version", "trajectories", "report", "problems", "train", "eval")
                  if k in out})
    create_markdown_artifact(summary_markdown(stage, out, links), key=artifact_key(recipe.name, stage),
                             description=f"{stage} summary")
    return out


class _LinesAbove:
    """Stands in for a Prefect console handler's rich console while bars are shown: its log
    lines are printed through the bars' console, so they land above the bars, not across them."""

    def __init__(self, console) -> None:
        self.console = console

    def print(self, message, **kwargs) -> None:
        from rich.text import Text

        self.console.print(Text(str(message)), **kwargs)


@contextmanager
def _progress_bars():
    """In a terminal, a progress bar per task of the stage, fed by its worker (rstar.pipeline.progress);
    piped, nothing (the worker prints plain lines)."""
    if not sys.stdout.isatty():
        yield None
        return
    from prefect.logging.handlers import PrefectConsoleHandler

    loggers = [logging.getLogger()] + [lg for lg in logging.root.manager.loggerDict.values()
                                       if isinstance(lg, logging.Logger)]
    handlers = [h for lg in loggers for h in lg.handlers if isinstance(h, PrefectConsoleHandler)]
    with Bars() as bars:
        saved = [(h, h.console) for h in handlers]
        for h in handlers:
            h.console = _LinesAbove(bars.progress.console)
        try:
            yield bars.update
        finally:
            for h, console in saved:
                h.console = console


def artifact_key(pipeline: str, stage: str) -> str:
    """The stage's Prefect artifact key (keys allow lowercase letters, digits and dashes)."""
    return f"{pipeline}-{stage}".lower().replace("_", "-")


def submit(stage: str, recipe: Recipe, inputs: dict, parent_run_id: str) -> dict:
    """Run a stage with the recipe's retries. A cached result is reused only while the
    stage's outputs are still in storage; otherwise the stage runs again and refreshes it."""
    task_ = run_stage.with_options(retries=recipe.retries.count, retry_delay_seconds=recipe.retries.delay_s,
                                   refresh_cache=not outputs_exist(recipe, stage, inputs))
    return task_(stage, recipe, inputs, parent_run_id)
