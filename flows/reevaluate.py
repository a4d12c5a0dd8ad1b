"""Re-evaluation: evaluate chosen registered model versions again, by default with the settings
and held-out set of the first one's last evaluation (read from its lineage), so the figures
compare; and attach the results to each version's lineage (the evaluation run is tagged
`rstar.evaluates.<name/version>`, which `rstar lineage` reads).

    rstar pipeline reevaluate --config configs/tiny.yaml --version rstar-tiny/5
"""

from __future__ import annotations

import time
from dataclasses import fields

from prefect import flow, get_run_logger

from flows.reconcile import cancel_stage_tasks
from rstar.agent.sampling import Sampling
from rstar.errors import NotRetryable
from rstar.pipeline.config import load_recipe
from rstar.pipeline.records import ModelRef, StageInputs, StageOutput, Stored
from rstar.tracking import mlflow_log as ml
from rstar.tracking.digest import digest
from rstar.tracking.lineage import lineage
from tasks.stage import submit


def resolve_versions(uri: str, model_name: str, versions: list[str]) -> dict[str, tuple[str, str]]:
    """{"name/version": (source, digest registered)}; "latest" means the newest version of the
    recipe's model, "@<alias>" the version its alias points at."""
    from mlflow.exceptions import MlflowException

    c = ml.client(uri)
    out = {}
    for v in versions:
        if v.startswith("@"):
            try:
                v = f"{model_name}/{c.get_model_version_by_alias(model_name, v[1:]).version}"
            except MlflowException:
                raise ValueError(
                    f"{model_name} has no version with the alias {v[1:]!r} yet (a pipeline run "
                    f"gives its final model {ml.LATEST_EVALUATED!r} once evaluated)"
                ) from None
        elif v == "latest":
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


def _moved(key: str) -> str:
    """A setting's key now: evaluations recorded before the sampling block had its own key
    (rstar.agent.sampling) named its fields at the top."""
    return f"sampling.{key}" if key in {f.name for f in fields(Sampling)} else key


def recorded_settings(uri: str, version: str) -> dict | None:
    """How `version` was last evaluated, read from its lineage: {"run_id", "label", "overrides"
    (the eval settings as recipe overrides), "held_out" ({"uri", "digest"})}; None if never."""
    import yaml

    evaluations = lineage(uri, version).evaluations
    if not evaluations or not evaluations[-1]["held_out"]:
        return None
    last = evaluations[-1]
    return {
        "run_id": last["run_id"],
        "label": last["label"],
        # include_base says which checkpoints a pipeline evaluates, not how
        "overrides": {
            f"eval.{_moved(k)}": yaml.safe_load(v)
            for k, v in last["settings"].items()
            if k != "include_base"
        },
        "held_out": last["held_out"],
    }


@flow(name="rstar-reevaluate", log_prints=True, on_cancellation=[cancel_stage_tasks])
def reevaluate(
    config: str = "configs/tiny.yaml",
    versions: list[str] | None = None,
    problems: str | None = None,
    overrides: dict | None = None,
    recorded: bool = True,
) -> StageOutput:
    """Evaluate registered model versions again and attach the results to their lineage.

    Args:
        config: The recipe whose MLflow store and registered model hold the versions.
        versions: Each as name/version, "latest" (the newest) or "@<alias>", e.g.
            "@latest-evaluated" (a pipeline run's final model, once evaluated). Empty: the
            latest.
        problems: A problems-schema Parquet to evaluate on. Empty: the held-out set the first
            version was last evaluated on (with `recorded`), else the recipe's.
        overrides: Recipe values by dotted key, e.g. {"eval.k": 4}; they win over the recorded
            settings.
        recorded: Evaluate with the settings (k, temperature, budgets) and held-out set of the
            first version's last evaluation, so the two can be compared; off: the recipe's.
    """
    recipe = load_recipe(config, overrides)
    uri = ml.absolute_uri(recipe.tracking.tracking_uri)
    ml.check_reachable(uri)
    sources = resolve_versions(uri, recipe.tracking.registered_model, versions or ["latest"])
    first = next(iter(sources))
    before = recorded_settings(uri, first) if recorded else None
    if before:
        recipe = load_recipe(config, {**before["overrides"], **(overrides or {})})
        get_run_logger().info(
            "settings and held-out set of %s's evaluation %s (run %s): %s",
            first,
            before["label"],
            before["run_id"],
            ", ".join(f"{k}={v}" for k, v in before["overrides"].items()),
        )
    parent = ml.start_run(
        uri,
        recipe.tracking.experiment,
        f"reevaluate:{recipe.name}",
        tags={ml.PIPELINE: "reevaluate"},
        params={
            "versions": sorted(sources),
            "settings_from": f"{before['label']} run {before['run_id']}" if before else "recipe",
        },
    )
    with ml.closing(uri, parent):
        if problems is not None:
            held_out = Stored(problems, digest(problems))
        elif before:
            held_out = _unchanged(before["held_out"], first)
        else:  # the recipe's, cached after a pipeline run
            held_out = submit("problems", recipe, StageInputs(), parent).datasets["eval"]
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


def _unchanged(held_out: dict, version: str) -> Stored:
    """The recorded held-out set, refused if its file changed since (another run on the root)."""
    found = digest(held_out["uri"])
    if found != held_out["digest"]:
        raise NotRetryable(
            f"the held-out set {version} was last evaluated on, {held_out['uri']}, has changed "
            f"(digest {found}, recorded {held_out['digest']}): give `problems`, or recorded=false"
            " for the recipe's"
        )
    return Stored(held_out["uri"], found)
