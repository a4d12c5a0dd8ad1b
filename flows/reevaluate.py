"""Re-evaluation: evaluate chosen registered model versions on the recipe's held-out set (or a
problems file) and attach the results to each version's lineage (the evaluation run is tagged
`rstar.evaluates.<name/version>`, which `rstar lineage` reads).

    rstar pipeline reevaluate --config configs/tiny.yaml --version rstar-tiny/5
"""

from __future__ import annotations

import time

from prefect import flow, get_run_logger

from rstar.pipeline.config import load_recipe
from rstar.pipeline.records import ModelRef, StageInputs, StageOutput, Stored
from rstar.tracking import mlflow_log as ml
from rstar.tracking.digest import digest
from tasks.stage import submit


def resolve_versions(uri: str, model_name: str, versions: list[str]) -> dict[str, tuple[str, str]]:
    """{"name/version": (source, digest registered)}; "latest" means the newest version of the
    recipe's model."""
    c = ml.client(uri)
    out = {}
    for v in versions:
        if v == "latest":
            found = c.search_model_versions(
                f"name = '{model_name}'", order_by=["version_number DESC"], max_results=1
            )
            if not found:
                raise ValueError(f"no versions of {model_name!r} are registered yet")
            v = f"{model_name}/{found[0].version}"
        name, _, number = v.rpartition("/") if "/" in v else (model_name, "/", v)
        mv = c.get_model_version(name, number)
        out[f"{name}/{number}"] = (mv.source, mv.tags.get(ml.DIGEST))
    return out


@flow(name="rstar-reevaluate", log_prints=True)
def reevaluate(
    config: str = "configs/tiny.yaml",
    versions: list[str] | None = None,
    problems: str | None = None,
    overrides: dict | None = None,
) -> StageOutput:
    """Evaluate `versions` (default: the latest) on `problems` (default: the recipe's held-out
    set)."""
    recipe = load_recipe(config, overrides)
    uri = ml.absolute_uri(recipe.tracking.tracking_uri)
    ml.check_reachable(uri)
    sources = resolve_versions(uri, recipe.tracking.registered_model, versions or ["latest"])
    parent = ml.start_run(
        uri,
        recipe.tracking.experiment,
        f"reevaluate:{recipe.name}",
        tags={ml.PIPELINE: "reevaluate"},
        params={"versions": sorted(sources)},
    )
    with ml.closing(uri, parent):
        if problems is None:
            # cached after a pipeline run
            held_out = submit("problems", recipe, StageInputs(), parent).datasets["eval"]
        else:
            held_out = Stored(problems, digest(problems))
        models = {
            v.replace("/", "-v"): ModelRef(source, registered, v)
            for v, (source, registered) in sources.items()
        }
        out = submit(
            "evaluate",
            recipe,
            StageInputs(
                models=models,
                problems=held_out,
                report_name=f"reeval-{time.strftime('%Y%m%d-%H%M%S')}",
            ),
            parent,
        )
    get_run_logger().info("\n%s", out.evaluation.table)
    return out
