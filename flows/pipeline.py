"""The training pipeline: base model -> problems -> SFT -> RL stage 1 -> RL stage 2 -> mine
hard -> RL stage 3 -> evaluation, one retryable, cached Prefect task per stage.

    rstar pipeline run --config configs/tiny.yaml --set rl.0.steps=2
"""
from __future__ import annotations

from prefect import flow, get_run_logger

from flows.reconcile import claim_root
from rstar.pipeline.config import load_recipe
from rstar.pipeline.stages import Layout
from rstar.tracking import mlflow_log as ml
from tasks.stage import submit


def _model_inputs(out: dict) -> dict:
    return {"model": out["model"], "model_digest": out["model_digest"], "input_model": out["model_version"]}


@flow(name="rstar-pipeline", log_prints=True)
def pipeline(config: str = "configs/tiny.yaml", overrides: dict | None = None) -> dict:
    """Run the recipe in `config` (overrides: {"rl.0.steps": 2, ...}). Returns every stage's outputs.
    One run per storage root at a time: a second one fails at once naming the first; what a
    killed run on the root left RUNNING is marked Crashed (Prefect) or FAILED (MLflow) first."""
    recipe = load_recipe(config, overrides)
    with claim_root(Layout(recipe.storage_root).root):
        return _run(recipe, config)


def _run(recipe, config: str) -> dict:
    uri = ml.absolute_uri(recipe.tracking.tracking_uri)
    ml.check_reachable(uri)
    root = Layout(recipe.storage_root).root
    stale = ml.fail_stale_runs(uri, recipe.tracking.experiment, root)  # we hold the root: none of them is live
    if stale:
        get_run_logger().warning("marked %d MLflow run(s) left RUNNING by a killed run on %s as FAILED", len(stale), root)
    parent = ml.start_run(uri, recipe.tracking.experiment, f"pipeline:{recipe.name}",
                          params=recipe.model_dump(mode="json"),
                          tags={ml.PIPELINE: "root", "rstar.recipe_digest": recipe.digest(), "rstar.config": config,
                                ml.ROOT: root})
    try:
        outs: dict[str, dict] = {}

        def run(name: str, inputs: dict) -> dict:
            outs[name] = submit(name, recipe, inputs, parent)
            return outs[name]

        run("base", {})
        data = run("problems", {})
        train = {"problems": data["train"], "problems_digest": data["train_digest"]}
        prev = run("sft", _model_inputs(outs["base"]))
        for i, s in enumerate(recipe.rl):
            last = i == len(recipe.rl) - 1
            problems = train
            if last:
                hard = outs["mine"]
                problems = {"problems": hard["problems"], "problems_digest": hard["problems_digest"]}
            prev = run(s.name, {**_model_inputs(prev), **problems})
            if s.name == recipe.mine.after:
                run("mine", {**_model_inputs(prev), **train})
        models = ["sft"] + [s.name for s in recipe.rl]
        copying = {m: {k: v for k, v in outs[m]["metrics"].items() if k.startswith("copy_")} for m in ("base", "sft")}
        run("evaluate", {"models": {m: outs[m]["model"] for m in models}, "copying": copying,
                         "digests": {m: outs[m]["model_digest"] for m in models},
                         "versions": {m: outs[m]["model_version"] for m in models},
                         "problems": data["eval"], "problems_digest": data["eval_digest"]})
    except BaseException:
        ml.end_run(uri, parent, "FAILED")
        raise
    ml.set_tags(uri, parent, {f"rstar.{k}.model_version": v["model_version"] for k, v in outs.items()
                              if "model_version" in v})
    _mark_reused(uri, parent, recipe, outs)
    ml.end_run(uri, parent)
    _where_to_look(recipe, config, uri, parent, outs)
    return outs


def _mark_reused(uri: str, parent: str, recipe, outs: dict) -> None:
    """Stages served from Prefect's cache ran under an earlier pipeline run: this run links to
    their runs (`rstar.<stage>.reused_run`) and, when it ran nothing itself, says so in its name."""
    c = ml.client(uri)
    reused = {stage: out["mlflow_run_id"] for stage, out in outs.items()
              if c.get_run(out["mlflow_run_id"]).data.tags.get(ml.PIPELINE) != parent}
    if not reused:
        return
    ml.set_tags(uri, parent, {"rstar.cached_stages": ",".join(reused),
                              **{f"rstar.{stage}.reused_run": run_id for stage, run_id in reused.items()}})
    if len(reused) == len(outs):
        c.update_run(parent, name=f"pipeline:{recipe.name} (all stages cached)")


def _where_to_look(recipe, config: str, uri: str, parent: str, outs: dict) -> None:
    log = get_run_logger()
    log.info("\n%s\n\n%s\n", outs["evaluate"]["table"], "\n".join(outs["evaluate"]["verdict"]))
    log.info("storage: %s", Layout(recipe.storage_root).root)
    log.info("MLflow parent run %s; UI: mlflow ui --backend-store-uri %s", parent, uri)
    log.info("Prefect UI: prefect server start (then open http://127.0.0.1:4200)")
    log.info("lineage of the final model: rstar lineage %s --config %s", outs[recipe.rl[-1].name]["model_version"], config)

