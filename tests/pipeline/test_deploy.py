"""What `rstar serve` registers: deployments whose Run form explains itself and whose paths do
not depend on where the UI's user thinks the server started."""

import os

from flows.deploy import deployments, where_runs_write


def test_deployments_hold_absolute_paths_and_a_stated_timezone():
    run, nightly = deployments("configs/tiny.yaml", "t", "0 3 * * *")
    store = f"sqlite:///{os.path.abspath('mlruns.db')}"
    assert run.parameters == {
        "config": os.path.abspath("configs/tiny.yaml"),
        "storage_root": os.path.abspath("runs/tiny"),
        "overrides": {"tracking.tracking_uri": store},
    }
    assert nightly.parameters["versions"] == ["@latest-evaluated"]
    assert nightly.parameters["overrides"] == {
        "storage_root": os.path.abspath("runs/tiny"),
        "tracking.tracking_uri": store,
    }
    # what `rstar serve` prints first
    assert where_runs_write([run, nightly]).splitlines() == [
        f"recipe {os.path.abspath('configs/tiny.yaml')}",
        f"runs write under {os.path.abspath('runs/tiny')}",
        f"MLflow store {store} (see it: mlflow ui --backend-store-uri {store})",
    ]
    (schedule,) = nightly.schedules
    assert schedule.schedule.cron == "0 3 * * *" and schedule.schedule.timezone == "UTC"


def test_the_run_form_describes_every_field():
    from prefect.utilities.callables import parameter_schema

    from flows.pipeline import pipeline

    # the schema Prefect registers with the deployment and draws the Run form from
    fields = parameter_schema(pipeline).properties
    assert set(fields) == {"config", "overrides", "storage_root", "rl_steps", "seed", "until"}
    assert all(f.get("description") for f in fields.values()), fields
    assert "rl1.steps" in fields["overrides"]["description"]
    assert "configs/smollm2.yaml" in fields["config"]["description"]
    # a list of integers, not free JSON
    assert {"type": "array", "items": {"type": "integer"}} in fields["rl_steps"]["anyOf"]
