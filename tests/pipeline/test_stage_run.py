"""A stage that resumes from its checkpoints keeps one MLflow run across attempts."""

from rstar.pipeline.config import load_recipe
from rstar.pipeline.records import ModelRef, StageInputs, Stored
from rstar.pipeline.stage_run import open_stage_run
from rstar.tracking import mlflow_log as ml


def _recipe(tmp_path, **over):
    return load_recipe(
        "configs/tiny.yaml",
        {
            "storage_root": str(tmp_path / "root"),
            "tracking.tracking_uri": f"sqlite:///{tmp_path}/mlflow.db",
            **over,
        },
    )


def test_a_retried_rl_stage_continues_its_run_until_it_finishes(tmp_path):
    recipe = _recipe(tmp_path)
    uri, inputs = (
        recipe.tracking.tracking_uri,
        StageInputs(model=ModelRef("m"), problems=Stored("p")),
    )
    first_parent = ml.start_run(uri, recipe.tracking.experiment, "pipeline:tiny")
    run_id, continued = open_stage_run(uri, recipe, "rl1", inputs, first_parent, {ml.STAGE: "rl1"})
    assert not continued
    ml.client(uri).log_metric(run_id, "rl1/accuracy", 0.1, step=1)
    ml.end_run(uri, run_id, "FAILED")  # the attempt died after step 1

    second_parent = ml.start_run(uri, recipe.tracking.experiment, "pipeline:tiny")
    again, continued = open_stage_run(uri, recipe, "rl1", inputs, second_parent, {ml.STAGE: "rl1"})
    run = ml.client(uri).get_run(again)
    assert (again, continued, run.info.status) == (run_id, True, "RUNNING")
    assert run.data.tags["mlflow.parentRunId"] == second_parent
    assert (
        run.data.tags["rstar.earlier_pipelines"] == first_parent
        and run.data.tags["rstar.attempts"] == "2"
    )
    assert [m.step for m in ml.client(uri).get_metric_history(run_id, "rl1/accuracy")] == [1]
    ml.end_run(uri, run_id)

    # a finished stage is never reopened; other inputs are another working directory, another run
    assert open_stage_run(uri, recipe, "rl1", inputs, second_parent, {})[0] != run_id
    assert (
        open_stage_run(
            uri,
            recipe,
            "rl1",
            StageInputs(model=ModelRef("m2"), problems=Stored("p")),
            second_parent,
            {},
        )[1]
        is False
    )


def test_stages_that_start_over_get_a_new_run_each_attempt(tmp_path):
    recipe = _recipe(tmp_path)
    uri = recipe.tracking.tracking_uri
    parent = ml.start_run(uri, recipe.tracking.experiment, "pipeline:tiny")
    for stage in ("problems", "sft"):  # the local SFT does not resume; SFT on verl does
        first, _ = open_stage_run(uri, recipe, stage, StageInputs(), parent, {})
        ml.end_run(uri, first, "FAILED")
        second, continued = open_stage_run(uri, recipe, stage, StageInputs(), parent, {})
        assert second != first and not continued
    verl = _recipe(tmp_path, engine="verl")
    first, _ = open_stage_run(uri, verl, "sft", StageInputs(), parent, {})
    ml.end_run(uri, first, "FAILED")
    assert open_stage_run(uri, verl, "sft", StageInputs(), parent, {}) == (first, True)
