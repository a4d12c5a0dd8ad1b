"""Deployments: the pipeline (run it from the Prefect UI with parameters) and a nightly
re-evaluation of the latest model version on a cron schedule, served by this process.

    prefect server start --host 127.0.0.1        # the API and UI, http://127.0.0.1:4200
    PREFECT_API_URL=http://127.0.0.1:4200/api rstar serve --config configs/tiny.yaml

Paths a recipe gives relative to the working directory (the recipe itself, its storage root, a
SQLite MLflow store) are made absolute here, once, and shown: the Run form then says where a run
will write, and that is where `mlflow ui` must look.
"""

from __future__ import annotations

import os

from prefect.schedules import Cron

from flows.pipeline import pipeline
from flows.reevaluate import reevaluate
from rstar.pipeline.config import load_recipe
from rstar.pipeline.layout import Layout
from rstar.tracking.mlflow_log import LATEST_EVALUATED, absolute_uri


def deployments(config: str, name: str, cron: str, timezone: str = "UTC") -> list:
    config = os.path.abspath(config)
    recipe = load_recipe(config, check_inputs=False)
    root = Layout(recipe.storage_root).root
    tracking = {"tracking.tracking_uri": absolute_uri(recipe.tracking.tracking_uri)}
    return [
        pipeline.to_deployment(
            name=name,
            parameters={"config": config, "storage_root": root, "overrides": tracking},
            description=(
                f"The whole recipe {recipe.name}: base, problems, SFT, RL stages, mining, "
                f"evaluation. Writes under {root}; MLflow: {tracking['tracking.tracking_uri']}."
            ),
        ),
        reevaluate.to_deployment(
            name=f"{name}-nightly",
            schedule=Cron(cron, timezone=timezone),
            parameters={
                "config": config,
                "versions": [f"@{LATEST_EVALUATED}"],
                "overrides": {"storage_root": root, **tracking},
            },
            description=(
                f"Re-evaluate the version of {recipe.tracking.registered_model} a pipeline run "
                f"last evaluated (its alias {LATEST_EVALUATED}), {cron} {timezone}, with the "
                "settings and held-out set of its last evaluation."
            ),
        ),
    ]


def where_runs_write(found: list) -> str:
    """What `rstar serve` says at start: the recipe and the places its runs will write."""
    params = found[0].parameters
    store = params["overrides"]["tracking.tracking_uri"]
    return (
        f"recipe {params['config']}\nruns write under {params['storage_root']}\n"
        f"MLflow store {store} (see it: mlflow ui --backend-store-uri {store})"
    )
