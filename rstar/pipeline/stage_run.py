"""A stage's MLflow run, one for the stage's whole history.

A stage that resumes from its checkpoints (an RL stage, SFT on verl) after a Prefect retry or
after its whole pipeline was killed continues the MLflow run that holds its earlier steps,
instead of leaving them in an orphan: the run's id is kept in the stage's working directory,
beside the checkpoints it belongs to. A fresh working directory (another recipe, other inputs)
gets a fresh run.
"""

from __future__ import annotations

from rstar.pipeline.cache import resumes, work_uri
from rstar.pipeline.config import Recipe
from rstar.pipeline.records import StageInputs
from rstar.pipeline.stage_table import section
from rstar.storage import atomic_write_text, filesystem
from rstar.tracking import mlflow_log as ml

RUN_ID = "mlflow_run_id"


def open_stage_run(
    tracking_uri: str, recipe: Recipe, stage: str, inputs: StageInputs, parent: str, tags: dict
) -> tuple[str, bool]:
    """(run id, whether it continues an earlier attempt's run) for `stage` under the pipeline run
    `parent`."""
    marker = f"{work_uri(recipe, stage, inputs)}/{RUN_ID}" if resumes(recipe, stage) else None
    if marker:
        fs, path = filesystem(marker)
        earlier = fs.cat_file(path).decode().strip() if fs.exists(path) else ""
        if earlier and ml.reopen_run(tracking_uri, earlier, parent=parent, tags=tags):
            return earlier, True
    run_id = ml.start_run(
        tracking_uri,
        recipe.tracking.experiment,
        stage,
        parent=parent,
        params=section(recipe, stage),
        tags=tags,
    )
    if marker:
        atomic_write_text(marker, run_id)
    return run_id, False
