"""The training pipeline: base model -> problems -> SFT -> RL stage 1 -> RL stage 2 -> mine
hard -> RL stage 3 -> evaluation, one retryable, cached Prefect task per stage.

    rstar pipeline run --config configs/tiny.yaml --set rl1.steps=2
"""

from __future__ import annotations

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.runtime import flow_run
from prefect.states import Completed, Failed, State

from flows.reconcile import cancel_stage_tasks, claim_root
from rstar.pipeline.config import ConfigError, load_recipe, run_overrides
from rstar.pipeline.layout import Layout
from rstar.pipeline.records import StageOutput
from rstar.pipeline.stage_table import check_until, recipe_stages
from rstar.storage.lock import RootBusy
from rstar.tracking import mlflow_log as ml
from rstar.tracking.mlflow_log import TrackingUnreachable
from tasks.stage import submit
from tasks.summary import artifact_key, as_markdown


@flow(name="rstar-pipeline", log_prints=True, on_cancellation=[cancel_stage_tasks])
def pipeline(
    config: str = "configs/tiny.yaml",
    overrides: dict | None = None,
    storage_root: str | None = None,
    rl_steps: list[int] | None = None,
    seed: int = 0,
    until: str | None = None,
) -> dict[str, StageOutput]:
    """Run a recipe: base model, problems, SFT, RL stages 1-3, mining, evaluation, each stage a
    cached, retried task. One run per storage root at a time: a second one fails at once naming
    the first; what a killed run on the root left RUNNING is marked Crashed (Prefect) or FAILED
    (MLflow) first. Returns every stage's outputs.

    Args:
        config: The recipe (YAML): configs/tiny.yaml (the embedded default, about 20 minutes on 2
            CPUs), configs/smollm2.yaml (SmolLM2-135M on real problems, about 90 minutes),
            configs/tiny-verl.yaml (tiny on verl's trainers), configs/qwen3-14b.yaml (the paper's,
            a GPU cluster). A relative path is read from the directory `rstar serve` started in.
        overrides: Any recipe value by its dotted key, e.g. {"rl1.steps": 2, "eval.k": 4}; an RL
            stage by its name (rl1) or its position (rl.0). Wins over the fields below.
        storage_root: Where the run writes: a directory or s3://bucket/prefix. Empty: the
            recipe's.
        rl_steps: Steps of each RL stage in order (rl1, rl2, rl3), e.g. [2, 1, 1]. Empty: the
            recipe's.
        seed: Moves every seeded part (SFT's data and order, each RL stage's prompts and
            sampling) by this much; the held-out set stays. 0: the recipe's seeds.
        until: Stop after this stage (e.g. rl1) and return what ran; its cache serves the rest
            of the recipe later. Empty: the whole recipe.
    """
    try:
        values = run_overrides(
            config, overrides, storage_root=storage_root, rl_steps=rl_steps, seed=seed
        )
        recipe = load_recipe(config, values)
        check_until(recipe, until)
        with claim_root(Layout(recipe.storage_root).root):
            # the caller gets the outputs; Prefect records the state, named by the verdict
            return _final_state(_run(recipe, config, until), until)
    except (ConfigError, TrackingUnreachable, RootBusy) as e:
        # what the CLI checks before a run: a run from the UI fails with the same one line, no
        # traceback in its log
        return Failed(message=str(e))


def _run(recipe, config: str, until: str | None = None) -> dict[str, StageOutput]:
    uri = ml.absolute_uri(recipe.tracking.tracking_uri)
    ml.check_reachable(uri)
    root = Layout(recipe.storage_root).root
    # we hold the root: none of them is live
    stale = ml.fail_stale_runs(uri, recipe.tracking.experiment, root)
    if stale:
        get_run_logger().warning(
            "marked %d MLflow run(s) left RUNNING by a killed run on %s as FAILED", len(stale), root
        )
    parent = ml.start_run(
        uri,
        recipe.tracking.experiment,
        f"pipeline:{recipe.name}",
        params=recipe.model_dump(mode="json"),
        tags={
            ml.PIPELINE: "root",
            "rstar.recipe_digest": recipe.digest(),
            "rstar.config": config,
            ml.ROOT: root,
            # back to the Prefect flow run that made it (its page, where the server has a UI)
            "rstar.prefect_flow_run": flow_run.get_id(),
            "rstar.prefect_flow_run_url": flow_run.get_flow_run_ui_url() or "",
        },
    )
    outs: dict[str, StageOutput] = {}
    with ml.closing(uri, parent):
        for stage in recipe_stages(recipe):
            outs[stage.name] = submit(stage.name, recipe, stage.inputs(outs), parent)
            if stage.name == until:
                ml.set_tags(uri, parent, {"rstar.stopped_after": until})
                break
        ml.set_tags(
            uri,
            parent,
            {f"rstar.{k}.model_version": v.model.version for k, v in outs.items() if v.model},
        )
        _mark_reused(uri, parent, recipe, outs)
        if "evaluate" not in outs:
            return outs
        _headline(uri, parent, outs["evaluate"])
        ml.set_alias(uri, outs[recipe.rl[-1].name].model.version, ml.LATEST_EVALUATED)
    _where_to_look(recipe, config, uri, parent, outs)
    return outs


def _headline(uri: str, parent: str, evaluate: StageOutput) -> None:
    """The result on the parent run, where MLflow users look first and can compare pipeline
    runs: held-out accuracy per checkpoint (`heldout/<checkpoint>`; `heldout_accuracy` steps
    through them in stage order, one chart), the verdict as tag and description, the report."""
    log = ml.StageLog(uri, parent)
    for step, (name, accuracy) in enumerate(evaluate.evaluation.accuracy().items()):
        log.metrics(step, {f"heldout/{name}": accuracy, "heldout_accuracy": accuracy})
    if evaluate.evaluation.learnt is not None:
        log.tag("rstar.learnt", str(evaluate.evaluation.learnt).lower())
    log.tag(ml.NOTE, evaluate.evaluation.headline())
    for name in ("report.md", "accuracy.png"):
        log.artifact(f"{evaluate.report}/{name}", "evaluation")


def _mark_reused(uri: str, parent: str, recipe, outs: dict[str, StageOutput]) -> None:
    """Stages served from Prefect's cache ran under an earlier pipeline run: this run links to
    their runs (`rstar.<stage>.reused_run`) and, when it ran nothing itself, says so in its name."""
    c = ml.client(uri)
    reused = {
        stage: out.mlflow_run_id
        for stage, out in outs.items()
        if c.get_run(out.mlflow_run_id).data.tags.get(ml.PIPELINE) != parent
    }
    if not reused:
        return
    ml.set_tags(
        uri,
        parent,
        {
            "rstar.cached_stages": ",".join(reused),
            **{f"rstar.{stage}.reused_run": run_id for stage, run_id in reused.items()},
        },
    )
    if len(reused) == len(outs):
        c.update_run(parent, name=f"pipeline:{recipe.name} (all stages cached)")


def _where_to_look(
    recipe, config: str, uri: str, parent: str, outs: dict[str, StageOutput]
) -> None:
    """The result and where to find everything: in the log and as the run's summary artifact."""
    evaluation = outs["evaluate"].evaluation
    places = {
        "storage": Layout(recipe.storage_root).root,
        "MLflow parent run": ml.where(uri, parent),
        "lineage of the final model": f"rstar lineage {outs[recipe.rl[-1].name].model.version} "
        f"--config {config}",
    }
    log = get_run_logger()
    log.info("\n%s\n\n%s\n", evaluation.table, "\n".join(evaluation.verdict))
    for what, place in places.items():
        log.info("%s: %s", what, place)
    create_markdown_artifact(
        f"# {recipe.name}\n\n{evaluation.headline()}\n"
        + "".join(f"- {what}: {as_markdown(place)}\n" for what, place in places.items()),
        key=artifact_key(recipe.name, "summary"),
        description=f"the result of pipeline {recipe.name}",
    )


def _final_state(outs: dict[str, StageOutput], until: str | None = None) -> State:
    """Completed, named by the verdict so the runs list tells learnt from not (or by the stage
    it was asked to stop after)."""
    if "evaluate" not in outs:
        return Completed(name=f"Stopped after {until}", data=outs)
    learnt = outs["evaluate"].evaluation.learnt
    name = {True: "Learnt", False: "Did not learn", None: "Completed"}[learnt]
    return Completed(name=name, message="; ".join(outs["evaluate"].evaluation.verdict), data=outs)
