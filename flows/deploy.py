"""Deployments: the pipeline (run it from the Prefect UI with parameters) and a nightly
re-evaluation of the latest model version on a cron schedule, served by this process.

    prefect server start --host 127.0.0.1        # the API and UI, http://127.0.0.1:4200
    PREFECT_API_URL=http://127.0.0.1:4200/api rstar serve --config configs/tiny.yaml
"""

from __future__ import annotations

from prefect import serve

from flows.pipeline import pipeline
from flows.reevaluate import reevaluate

PIPELINE_DEPLOYMENT = "rstar-pipeline/{name}"
REEVAL_DEPLOYMENT = "rstar-reevaluate/{name}-nightly"


def deployments(config: str, name: str, cron: str) -> list:
    return [
        pipeline.to_deployment(
            name=name,
            parameters={"config": config},
            description="The whole recipe; set 'overrides' to change recipe values.",
        ),
        reevaluate.to_deployment(
            name=f"{name}-nightly",
            cron=cron,
            parameters={"config": config},
            description="Re-evaluate the latest registered model version.",
        ),
    ]


def serve_all(
    config: str = "configs/tiny.yaml", name: str = "tiny", cron: str = "0 3 * * *"
) -> None:
    """Register both deployments and run their flow runs from this process until stopped."""
    serve(*deployments(config, name, cron))
