"""One Prefect task runs any pipeline stage: it opens the stage's MLflow child run, launches
the work as a Ray job, registers the stage's model, and leaves a markdown summary artifact.

Retries come from the recipe (`retries.count`, `retries.delay_s`); a retried RL stage resumes
from its checkpoint and continues its MLflow run (rstar.pipeline.stage_run). A failure another
attempt cannot fix (a recipe, a data file, a permission: `rstar.errors.retry_pointless`) is not
retried. The cache key is the stage's recipe section, its inputs' content digests and the code
version, so re-running a finished pipeline serves every stage from cache.
"""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.runtime import flow_run

from rstar.errors import retry_pointless
from rstar.pipeline.cache import key, outputs_exist
from rstar.pipeline.config import Recipe
from rstar.pipeline.launch import run_job
from rstar.pipeline.layout import Layout
from rstar.pipeline.records import StageInputs, StageOutput
from rstar.pipeline.stage_run import open_stage_run
from rstar.pipeline.stage_table import stage_names
from rstar.storage import dirs
from rstar.tracking import mlflow_log as ml
from tasks.progress import stage_progress
from tasks.summary import artifact_key, summary_markdown


def worth_retrying(task, task_run, state) -> bool:
    return not retry_pointless(state.result(raise_on_failure=False))


def _tags(stage: str, inputs: StageInputs, parent_run_id: str) -> dict:
    """The stage run's lineage tags: its pipeline, the model version it starts from, and for an
    evaluation each version it evaluates (under the name it has in the evaluation)."""
    tags = {ml.STAGE: stage, ml.PIPELINE: parent_run_id}
    if inputs.model and inputs.model.version:
        tags[ml.INPUT_MODEL] = inputs.model.version
    for name, model in inputs.models.items():
        if model.version:
            tags[f"{ml.EVALUATES}.{model.version}"] = name
    return tags


@task(
    name="stage",
    task_run_name="{stage}",
    persist_result=True,
    retry_condition_fn=worth_retrying,
    cache_key_fn=lambda ctx, params: key(params["recipe"], params["stage"], params["inputs"]),
)
def run_stage(stage: str, recipe: Recipe, inputs: StageInputs, parent_run_id: str) -> StageOutput:
    log = get_run_logger()
    uri = ml.absolute_uri(recipe.tracking.tracking_uri)
    run_id, continued = open_stage_run(
        uri, recipe, stage, inputs, parent_run_id, _tags(stage, inputs, parent_run_id)
    )
    names = stage_names(recipe)
    where = (  # a re-evaluation runs stages of the recipe, not the recipe
        f"stage {names.index(stage) + 1} of {len(names)} ({stage})"
        if flow_run.get_flow_name() == "rstar-pipeline"
        else f"stage {stage}"
    )
    log.info(
        "%s: MLflow run %s%s",
        where,
        run_id,
        " (continued: it holds the earlier attempts' steps)" if continued else "",
    )
    layout = Layout(recipe.storage_root)
    with ml.closing(uri, run_id):
        with stage_progress(recipe.name, stage) as on_progress:
            out = run_job(stage, recipe, inputs, uri, run_id, on_progress=on_progress)
        out.mlflow_run_id = run_id
        if out.model:
            # the version points at a copy later runs on this root cannot overwrite (models/<stage>
            # is replaced)
            source = dirs.snapshot(out.model.uri, layout.registered(stage, out.model.digest))
            version = ml.register(
                uri,
                recipe.tracking.registered_model,
                source,
                run_id,
                stage,
                out.model.digest,
                inputs.model.version if inputs.model else None,
            )
            out.model = out.model.registered(version)
            ml.set_tags(uri, run_id, {"rstar.model_version": version})
    if out.evaluation:  # each evaluated version shows its score and the run that scored it
        for name, accuracy in out.evaluation.accuracy().items():
            model = inputs.models[name]
            if model.version:
                ml.tag_version(
                    uri,
                    model.version,
                    f"{ml.EVALUATED}.{inputs.report_name}",
                    f"held-out accuracy {accuracy:.3f} as {name}, run {run_id}",
                )
    links = {"MLflow": ml.where(uri, run_id), "storage root": layout.root, **out.links()}
    create_markdown_artifact(
        summary_markdown(out, links),
        key=artifact_key(recipe.name, stage),
        description=f"{stage} summary",
    )
    return out


def submit(stage: str, recipe: Recipe, inputs: StageInputs, parent_run_id: str) -> StageOutput:
    """Run a stage with the recipe's retries. A cached result is reused only while the
    stage's outputs are still in storage; otherwise the stage runs again and refreshes it."""
    task_ = run_stage.with_options(
        retries=recipe.retries.count,
        retry_delay_seconds=recipe.retries.delay_s,
        refresh_cache=not outputs_exist(recipe, stage, inputs),
    )
    return task_(stage, recipe, inputs, parent_run_id)
