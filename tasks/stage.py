"""One Prefect task runs any pipeline stage: it opens the stage's MLflow child run, launches
the work as a Ray job, registers the stage's model, and leaves a markdown summary artifact.

Retries come from the recipe (`retries.count`, `retries.delay_s`); a retried RL stage resumes
from its checkpoint. The cache key is the stage's recipe section plus its inputs' content
digests, so re-running a finished pipeline serves every stage from cache.
"""
from __future__ import annotations

import time

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact

from rstar.pipeline.config import Recipe
from rstar.pipeline.launch import run_job
from rstar.pipeline.stages import Layout, outputs_exist, summary_markdown
from rstar.tracking import mlflow_log as ml


def _cache_key(ctx, params: dict) -> str:
    """The stage's recipe section and input digests; a stage whose outputs were deleted since
    gets a fresh key, so it runs again instead of returning URIs of missing files."""
    recipe, stage, inputs = params["recipe"], params["stage"], params["inputs"]
    key = recipe.cache_key(stage, inputs)
    return key if outputs_exist(recipe, stage, inputs) else f"{key}-missing-{time.time_ns()}"


@task(name="stage", task_run_name="{stage}", persist_result=True, cache_key_fn=_cache_key)
def run_stage(stage: str, recipe: Recipe, inputs: dict, parent_run_id: str) -> dict:
    log = get_run_logger()
    uri = ml.absolute_uri(recipe.tracking.tracking_uri)
    tags = {ml.STAGE: stage, ml.PIPELINE: parent_run_id}
    if inputs.get("input_model"):
        tags[ml.INPUT_MODEL] = inputs["input_model"]
    for name, version in inputs.get("versions", {}).items():
        tags[f"{ml.EVALUATES}.{version}"] = name
    run_id = ml.start_run(uri, recipe.tracking.experiment, stage, parent=parent_run_id,
                          params=recipe.section(stage), tags=tags)
    log.info("stage %s: MLflow run %s", stage, run_id)
    try:
        out = run_job(stage, recipe, inputs, uri, run_id)
    except BaseException:
        ml.end_run(uri, run_id, "FAILED")
        raise
    out["mlflow_run_id"] = run_id
    if "model" in out:
        out["model_version"] = ml.register(uri, recipe.tracking.registered_model, out["model"], run_id, stage,
                                           out["model_digest"], inputs.get("input_model"))
        ml.set_tags(uri, run_id, {"rstar.model_version": out["model_version"]})
    ml.end_run(uri, run_id)
    links = {"MLflow run": f"{uri} run {run_id}", "storage root": Layout(recipe.storage_root).root}
    links.update({k: out[k] for k in ("model", "model_version", "trajectories", "report", "problems", "train", "eval")
                  if k in out})
    create_markdown_artifact(summary_markdown(stage, out, links), key=f"{recipe.name}-{stage}".lower().replace("_", "-"),
                             description=f"{stage} summary")
    return out
