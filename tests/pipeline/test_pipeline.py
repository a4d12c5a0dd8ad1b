"""The pipeline end to end through real Prefect, Ray, MLflow and Parquet: local storage and
S3 (moto on loopback), caching of a finished pipeline, a stage killed mid-way, and a whole
pipeline killed mid-way."""

import json
import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest

from rstar.data.io import read_table
from rstar.data.schema import schema
from rstar.eval.metrics import overall_accuracy
from rstar.pipeline.config import load_recipe
from rstar.pipeline.report import pipeline_report
from rstar.storage import filesystem
from rstar.tracking import mlflow_log as ml
from rstar.tracking.digest import digest
from rstar.tracking.lineage import lineage
from tasks.summary import artifact_key
from tests.pipeline.conftest import write_recipe

STAGES = ["base", "problems", "sft", "rl1", "rl2", "mine", "rl3", "evaluate"]


@pytest.fixture(scope="module", autouse=True)
def _own_ray():
    """The flows start a local Ray in this process; stop it after this module so later tests
    can start their own."""
    yield
    import ray

    ray.shutdown()


def _task_states(flow_run_id, expect=STAGES, timeout_s: float = 60) -> dict[str, list[str]]:
    """{task name: [state names of its runs]} for one flow run, from the Prefect API.

    Prefect records task runs from events in the background, so the last ones can reach the
    API after the flow returns: poll until every expected task shows a final state."""
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    async def read():
        async with get_client() as client:
            return await client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
            )

    deadline = time.monotonic() + timeout_s
    while True:
        runs = asyncio.run(read())
        out: dict[str, list[str]] = {}
        for r in runs:  # a task run's state can still be unrecorded (None) too
            out.setdefault(r.name, []).append(r.state.name if r.state else "PENDING")
        recorded = all(r.state and r.state.is_final() for r in runs)
        if (set(out) == set(expect) and recorded) or time.monotonic() > deadline:
            return out
        time.sleep(0.5)


def _artifacts(flow_run_id, kind: str = "markdown") -> dict[str, str]:
    """{artifact key: data} of one flow run's artifacts of one type, from the Prefect API."""
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    async def read():
        async with get_client() as client:
            return await client.read_artifacts(
                artifact_filter=ArtifactFilter(
                    flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])
                )
            )

    return {a.key: a.data for a in asyncio.run(read()) if a.type == kind}


def _wait_for_deployment(name: str, timeout_s: float = 180) -> None:
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    async def wait():
        async with get_client() as client:
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    return await client.read_deployment_by_name(name)
                except ObjectNotFound:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(1)

    asyncio.run(wait())


def _stage_runs(recipe):
    c = ml.client(recipe.tracking.tracking_uri)
    exp = c.get_experiment_by_name(recipe.tracking.experiment)
    return c, c.search_runs([exp.experiment_id], max_results=500)


def _check_trajectories(recipe, outs):
    """Every RL step's rollouts of the stages in `outs` are readable Parquet with the documented
    schema, each rollout exactly once."""
    from rstar.pipeline.layout import Layout

    last = recipe.rl[-1]  # it trains on the mined set, which may hold fewer problems than a step
    if last.name in outs:
        mined = read_table(Layout(recipe.storage_root).dataset("hard_problems"), "hard_problems")
    for s in [s for s in recipe.rl if s.name in outs]:
        prompts = min(s.prompts_per_step, len(mined)) if s is last else s.prompts_per_step
        fs, root = filesystem(outs[s.name].trajectories)
        files = sorted(fs.ls(root))
        assert [f.rsplit("/", 1)[-1] for f in files] == [
            f"step={i:05d}.parquet" for i in range(1, s.steps + 1)
        ]
        for f in files:
            uri = f"s3://{f}" if outs[s.name].trajectories.startswith("s3://") else f
            table = read_table(uri, "trajectories")
            assert table.schema.names == schema("trajectories").names
            rows = table.to_pylist()
            assert len(rows) == prompts * s.roc.group_size * s.roc.oversample
            assert len({(r["group_id"], r["sample_index"]) for r in rows}) == len(rows)
            assert {r["stage"] for r in rows} == {s.name}
            if s.roc.mode != "released":  # which RoC kept: its group size of every prompt's
                assert sum(r["kept"] for r in rows) == prompts * s.roc.group_size
    if "mine" not in outs:
        return
    # mining's, streamed to parts: every problem mined, k rollouts each, each once
    fs, root = filesystem(outs["mine"].trajectories)
    remote = "s3://" if outs["mine"].trajectories.startswith("s3://") else ""
    parts = [remote + p for p in sorted(fs.ls(root))]
    assert parts and all(p.rsplit("/", 1)[-1].startswith("part-") for p in parts)
    rows = [r for p in parts for r in read_table(p, "trajectories").to_pylist()]
    assert len(rows) == len({(r["group_id"], r["sample_index"]) for r in rows})
    assert len(rows) == recipe.mine.problems * recipe.mine.k
    assert {r["stage"] for r in rows} == {"mine"} and {r["kept"] for r in rows} == {None}


def test_pipeline_end_to_end_on_local_storage(finished_local):
    path, state, outs = finished_local
    recipe = load_recipe(path)
    assert state.is_completed()
    assert set(outs) == set(STAGES)
    assert all(
        state == "Completed"
        for states in _task_states(state.state_details.flow_run_id).values()
        for state in states
    )

    c, runs = _stage_runs(recipe)
    parents = [r for r in runs if r.data.tags.get(ml.PIPELINE) == "root"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    # per stage, its last run: the one whose outputs the flow passed on (an attempt that failed
    # and was retried by the task's retries leaves a FAILED run before it)
    children = {
        r.data.tags[ml.STAGE]: r
        for r in sorted(runs, key=lambda r: r.info.start_time)
        if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id
    }
    assert set(children) == set(STAGES)
    assert all(r.info.status == "FINISHED" for r in children.values())
    assert children["rl1"].data.params["rl.steps"] == "3"  # the resolved config as params
    history = c.get_metric_history(children["rl1"].info.run_id, "rollout/accuracy")
    assert [m.step for m in history] == [1, 2, 3]  # per-step trainer metrics
    # rl1 earns reward of both kinds and its updates move the weights: the kill and resume
    # tests below compare something a lost checkpoint would change
    # (8 rollouts a step: some step with both outcomes, not necessarily every one)
    assert any(0 < m.value < 1 for m in history), [m.value for m in history]
    assert _weights(outs["rl1"]) != _weights(outs["sft"])
    assert "curves/rl1_curves.png" in [
        a.path for a in c.list_artifacts(children["rl1"].info.run_id, "curves")
    ]
    assert set(children["base"].data.metrics) >= {"copy_repeat"}  # copying probes
    assert set(children["sft"].data.metrics) >= {"copy_repeat", "copy_into_call", "copy_read_back"}
    assert 0 <= outs["sft"].metrics["copy_read_back"] <= 1
    # what a stage wrote is tagged as its output, not logged as a dataset it read; what it
    # counted is a metric
    wrote = json.loads(children["problems"].data.tags["rstar.output.train_problems"])
    assert wrote["digest"] == outs["problems"].datasets["train"].digest != "-"
    assert not children["problems"].inputs.dataset_inputs
    kept = outs["problems"].metrics["train_problems"]
    assert children["problems"].data.metrics["train_problems"] == kept
    mined = json.loads(children["mine"].data.tags["rstar.output.hard_problems"])
    assert mined["digest"] == outs["mine"].datasets["hard_problems"].digest
    assert not children["mine"].inputs.dataset_inputs
    assert children["mine"].data.metrics["kept"] == outs["mine"].metrics["kept"]

    from rstar.agent.format import saved_style

    assert {saved_style(outs[s].model.uri) for s in ("sft", "rl1", "rl2", "rl3")} == {
        recipe.prompt_style
    }
    lin = lineage(recipe.tracking.tracking_uri, outs["rl3"].model.version)
    # each version points at its own copy under registry/, which later runs on the root never
    # overwrite
    root = os.path.dirname(os.path.dirname(outs["rl3"].model.uri))
    for link in lin.chain:
        assert link.source == os.path.join(root, "registry", f"{link.stage}-{link.digest}")
        assert digest(link.source) == outs[link.stage].model.digest == link.digest
    assert [link.stage for link in lin.chain] == ["base", "sft", "rl1", "rl2", "rl3"]
    assert {d["name"]: d["digest"] for d in lin.data} == {
        "train_problems": outs["problems"].datasets["train"].digest,
        "eval_problems": outs["problems"].datasets["eval"].digest,
    }
    assert [link.version for link in lin.chain] == [
        outs[s].model.version for s in ["base", "sft", "rl1", "rl2", "rl3"]
    ]
    # each version names its logged model: the output of the stage's run, with a signature,
    # pointing at the version's files
    name, number = outs["rl3"].model.version.rsplit("/", 1)
    logged = c.get_logged_model(c.get_model_version(name, number).tags[ml.LOGGED_MODEL])
    assert logged.source_run_id == children["rl3"].info.run_id
    assert logged.params["source"] == lin.chain[-1].source
    assert logged.tags["rstar.model_version"] == outs["rl3"].model.version
    # and the evaluation that scored it
    scored = c.get_model_version(name, number).tags[f"{ml.EVALUATED}.eval"]
    rl3_accuracy = outs["evaluate"].evaluation.accuracy()["rl3"]
    assert scored.startswith(f"held-out accuracy {rl3_accuracy:.3f} as rl3, run ")
    assert [o.model_id for o in children["rl3"].outputs.model_outputs] == [logged.model_id]
    from mlflow.models import Model

    signature = Model.load(f"{logged.artifact_location}/MLmodel").signature
    assert signature.inputs.input_names() == ["problem"]
    rl3_data = {d["name"]: d["digest"] for d in lin.chain[-1].datasets}
    # stage 3 trained on the mined set, stages 1-2 on the training set, each by its own name
    assert rl3_data["hard_problems"] == outs["mine"].datasets["hard_problems"].digest
    assert rl3_data["rl3_trajectories"] != "-"
    rl1_data = {d["name"]: d["context"] for d in lin.chain[2].datasets}
    assert rl1_data == {"train_problems": "training", "rl1_trajectories": "output"}
    assert lin.chain[1].datasets[0]["name"] == "sft_chats"
    assert [e["run_id"] for e in lin.evaluations] == [outs["evaluate"].mlflow_run_id]
    (ev,) = lin.evaluations  # the pipeline's own, with its settings and held-out set
    assert ev["label"] == "eval" and ev["settings"]["k"] == str(recipe.eval.k)
    assert ev["settings"]["sampling.temperature"] == str(recipe.eval.sampling.temperature)
    assert ev["data"] == [f"eval_problems digest {outs['problems'].datasets['eval'].digest}"]
    _check_trajectories(recipe, outs)
    report = outs["evaluate"].report
    assert {"report.md", "report.html", "accuracy.png", "summary.json"} <= set(os.listdir(report))
    # SFT and each stage side by side
    assert list(outs["evaluate"].evaluation.summaries) == ["sft", "rl1", "rl2", "rl3"]
    # one markdown summary per stage in the UI
    artifacts = _artifacts(state.state_details.flow_run_id)
    assert set(artifacts) == {artifact_key(recipe.name, s) for s in [*STAGES, "summary"]}
    # the run's own: the verdict, the table, where to look; and its state named by the verdict
    summary = artifacts[artifact_key(recipe.name, "summary")]
    assert "**DID NOT LEARN.**" in summary and "| rl3 avg@1" in summary
    assert f"rstar lineage {outs['rl3'].model.version}" in summary
    assert state.name == "Did not learn"
    # and each stage's progress, full at its end
    progress = _artifacts(state.state_details.flow_run_id, "progress")
    stages = [s.name for s in recipe.rl]
    assert {artifact_key(recipe.name, f"{s}-progress-{s}") for s in stages} | {
        artifact_key(recipe.name, f"evaluate-progress-eval-{s}") for s in ["sft", *stages]
    } <= set(progress)
    assert {float(v) for v in progress.values()} == {100.0}
    assert outs["rl3"].model.version in artifacts[artifact_key(recipe.name, "rl3")]
    assert "| rl3 avg@1" in artifacts[artifact_key(recipe.name, "evaluate")]
    # a reduced recipe that cannot learn in 5 steps is told so, with the copy probes beside
    assert outs["evaluate"].evaluation.learnt is False
    assert "DID NOT LEARN" in artifacts[artifact_key(recipe.name, "evaluate")]
    assert any(
        line.startswith("copy probes") and "sft " in line
        for line in outs["evaluate"].evaluation.verdict
    )
    assert children["evaluate"].data.tags["rstar.learnt"] == "false"
    # the stage the recipe says rl2 is for, judged on those questions' paired changes
    assert any(
        re.match(r"(ok|NO GAIN SHOWN): rl2 on all questions \(3 questions\) \d", line)
        for line in outs["evaluate"].evaluation.verdict
    )
    # every sample of the evaluation, as artifacts of its run
    assert {a.path for a in c.list_artifacts(children["evaluate"].info.run_id, "samples")} == {
        f"samples/{name}.samples.parquet" for name in ["sft", "rl1", "rl2", "rl3"]
    }
    # the headline on the parent run: held-out accuracy per checkpoint, verdict, report
    parent = c.get_run(parents[0].info.run_id)
    accuracy = outs["evaluate"].evaluation.accuracy()
    assert {k: v for k, v in parent.data.metrics.items() if k.startswith("heldout/")} == {
        f"heldout/{name}": pytest.approx(value) for name, value in accuracy.items()
    }
    chart = c.get_metric_history(parent.info.run_id, "heldout_accuracy")
    assert [(m.step, m.value) for m in chart] == [
        (i, pytest.approx(v)) for i, v in enumerate(accuracy.values())
    ]
    assert parent.data.tags["rstar.learnt"] == "false"
    # the final model, evaluated, is what the nightly re-evaluation takes
    from flows.reevaluate import resolve_versions

    name = recipe.tracking.registered_model
    assert resolve_versions(recipe.tracking.tracking_uri, name, ["@latest-evaluated"]) == (
        resolve_versions(recipe.tracking.tracking_uri, name, [outs["rl3"].model.version])
    )
    with pytest.raises(ValueError, match="no version with the alias 'champion'"):
        resolve_versions(recipe.tracking.tracking_uri, name, ["@champion"])
    # and back to the Prefect flow run that made it
    assert parent.data.tags["rstar.prefect_flow_run"] == str(state.state_details.flow_run_id)
    assert parent.data.tags["rstar.prefect_flow_run_url"].endswith(
        f"/flow-run/{state.state_details.flow_run_id}"
    )
    assert parent.data.tags[ml.NOTE].startswith("**DID NOT LEARN.**")
    assert "| rl3 avg@1" in parent.data.tags[ml.NOTE]
    assert {a.path for a in c.list_artifacts(parent.info.run_id, "evaluation")} == {
        "evaluation/report.md",
        "evaluation/accuracy.png",
    }
    # what the experiment and the registered model are, in MLflow's own description fields
    experiment = c.get_experiment(parent.info.experiment_id)
    assert "heldout/<checkpoint>" in experiment.tags[ml.NOTE]
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    assert "rstar.stage" in c.get_registered_model(recipe.tracking.registered_model).description


def test_the_run_report_holds_what_the_robustness_benchmark_reads(finished_local):
    path, _, outs = finished_local
    recipe = load_recipe(path)
    report = pipeline_report(recipe, outs)
    assert list(report["accuracy"]) == ["sft", "rl1", "rl2", "rl3"]
    assert report["accuracy"]["rl3"] == overall_accuracy(
        outs["evaluate"].evaluation.summaries["rl3"]
    )
    assert set(report["metrics"]["sft"]) >= {"copy_into_call", "copy_read_back"}
    assert (
        report["recipe_seconds"]
        == sum(report["seconds"][s] for s in ("sft", "rl1", "rl2", "mine", "rl3"))
        > 0
    )
    assert report["learnt"] is False and report["verdict"] == outs["evaluate"].evaluation.verdict


def test_rerunning_a_finished_pipeline_serves_every_stage_from_cache(finished_local):
    from flows.pipeline import pipeline

    path, _, outs = finished_local
    state = pipeline(path, return_state=True)
    assert state.is_completed()
    states = _task_states(state.state_details.flow_run_id)
    assert set(states) == set(STAGES)
    assert all(s == ["Cached"] for s in states.values()), states
    assert {k: v.model and v.model.version for k, v in state.result().items()} == {
        k: v.model and v.model.version for k, v in outs.items()
    }
    # the re-run's MLflow run is not an empty mystery: it says it reused every stage, and whose runs
    from mlflow import MlflowClient

    recipe = load_recipe(path)
    c = MlflowClient(recipe.tracking.tracking_uri)
    exp = c.get_experiment_by_name(recipe.tracking.experiment)
    (rerun,) = c.search_runs(
        [exp.experiment_id],
        "tags.`rstar.pipeline` = 'root'",
        order_by=["start_time DESC"],
        max_results=1,
    )
    assert rerun.info.run_name == f"pipeline:{recipe.name} (all stages cached)"
    assert set(rerun.data.tags["rstar.cached_stages"].split(",")) == set(STAGES)
    assert rerun.data.tags["rstar.rl3.reused_run"] == outs["rl3"].mlflow_run_id


def test_a_run_until_a_stage_stops_after_it(finished_local):
    """--until rl1: the stages through rl1 run (here from cache), nothing after them; the run is
    named by where it stopped and its report has no verdict; a stage the recipe lacks is refused
    before anything runs."""
    from flows.pipeline import pipeline
    from rstar.pipeline.report import pipeline_report

    path, _, outs = finished_local
    state = pipeline(path, until="rl1", return_state=True)
    assert state.is_completed() and state.name == "Stopped after rl1"
    got = state.result()
    assert list(got) == ["base", "problems", "sft", "rl1"]
    assert got["rl1"].model.version == outs["rl1"].model.version
    assert set(_task_states(state.state_details.flow_run_id, expect=got)) == set(got)
    report = pipeline_report(load_recipe(path), got)
    assert set(report) == {"metrics", "seconds", "recipe_seconds"}
    assert set(report["seconds"]) == set(got)

    bad = pipeline(path, until="rl9", return_state=True)
    assert bad.is_failed() and "until: 'rl9' is no stage of recipe" in bad.message


def test_pipeline_on_s3(prefect_api, s3, shipped_sft, tmp_path):
    from flows.pipeline import pipeline

    path = write_recipe(str(tmp_path), "s3", f"{s3}/pipeline", shipped_sft)
    state = pipeline(path, return_state=True)
    assert state.is_completed()
    outs = state.result()
    recipe = load_recipe(path)
    for stage in ["base", "sft", "rl1", "rl2", "rl3"]:
        assert outs[stage].model.uri.startswith(f"{s3}/pipeline/models/")
    fs, _ = filesystem(s3)
    assert fs.exists("rstar-test/pipeline/models/rl3/latest.json")
    _check_trajectories(recipe, outs)
    lin = lineage(recipe.tracking.tracking_uri, outs["rl3"].model.version)
    last = lin.chain[-1]  # the version's own copy on S3, readable after models/rl3 is replaced
    assert last.source == f"{s3}/pipeline/registry/rl3-{outs['rl3'].model.digest}"
    assert fs.exists(f"rstar-test/pipeline/registry/rl3-{outs['rl3'].model.digest}/latest.json")


def test_a_killed_stage_is_retried_and_resumes_from_its_checkpoint(
    prefect_api, finished_local, shipped_sft, tmp_path
):
    """SIGKILL rl1's Ray worker mid-stage: Prefect retries the task, the trainer
    resumes from the checkpoint, and the trajectories equal the uninterrupted run's."""
    from flows.pipeline import pipeline
    from rstar.pipeline.launch import pid_file

    path = write_recipe(str(tmp_path), "fault", str(tmp_path / "root"), shipped_sft)
    recipe = load_recipe(path)
    # Once step 2's rollouts are on disk, step 1's checkpoint is too: the kill lands mid-stage
    # with something to resume from.
    second_step = os.path.join(
        recipe.storage_root, "trajectories", "stage=rl1", "step=00002.parquet"
    )
    killed = []

    def killer():
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and not os.path.exists(second_step):
            time.sleep(0.05)
        if os.path.exists(second_step):
            pid = int(Path(pid_file(recipe, "rl1")).read_text())
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    state = pipeline(path, until="rl1", return_state=True)  # what follows rl1 is not in question
    thread.join(timeout=5)
    assert killed, "rl1 never wrote its second step"
    assert state.is_completed()
    outs = state.result()
    assert _task_states(state.state_details.flow_run_id, expect=outs)["rl1"] == ["Completed"]

    c, runs = _stage_runs(recipe)
    rl1 = [r for r in runs if r.data.tags.get(ml.STAGE) == "rl1"]
    # one MLflow run holds the stage's whole history: the retry continued the run it was killed in
    assert [r.info.status for r in rl1] == ["FINISHED"]
    assert (
        rl1[0].data.tags["rstar.started_as"] == "resumed"
        and rl1[0].data.tags["rstar.attempts"] == "2"
    )
    assert sorted(
        {m.step for m in c.get_metric_history(rl1[0].info.run_id, "rollout/accuracy")}
    ) == list(range(1, recipe.rl[0].steps + 1))
    _check_trajectories(recipe, outs)

    _, _, reference = finished_local  # the same recipe, never interrupted
    ref_recipe = load_recipe(finished_local[0])
    for step in range(1, 4):
        got = read_table(
            f"{outs['rl1'].trajectories}/step={step:05d}.parquet", "trajectories"
        ).to_pylist()
        want = read_table(
            f"{reference['rl1'].trajectories}/step={step:05d}.parquet", "trajectories"
        ).to_pylist()
        assert [(r["group_id"], r["response_ids"], r["reward"]) for r in got] == [
            (r["group_id"], r["response_ids"], r["reward"]) for r in want
        ], f"step {step}"
    assert ref_recipe.rl[0] == recipe.rl[0]
    # the weights, AdamW moments and schedule came back: the same model as the uninterrupted run
    assert _weights(outs["rl1"]) == _weights(reference["rl1"])


def _weights(out) -> str:
    """The digest of a stage's model weights alone (its directory also holds the trainer's
    state, whose history has wall-clock timings)."""
    return digest(os.path.join(out.model.uri, "model.safetensors"))


def _flow_run_and_tasks(flow_run_id: str):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        run = client.read_flow_run(flow_run_id)
        tasks = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id]))
        )
    return run, tasks


@pytest.mark.timeout(900)
def test_a_pipeline_killed_mid_stage_is_reconciled_and_continued_by_the_next_run(
    prefect_api, shipped_sft, finished_local, tmp_path
):
    """SIGKILL a whole `rstar pipeline run` (its process group: driver, Ray, the stage's worker)
    in the middle of rl1. The next `rstar pipeline run` on the root marks the killed flow run and
    its task runs Crashed and its MLflow parent FAILED, resumes rl1 from its checkpoint, and
    continues rl1's MLflow run, so that one run holds every step."""
    import json
    import subprocess
    import sys

    from rstar.pipeline.layout import Layout
    from rstar.pipeline.records import StageOutput
    from rstar.storage.lock import LOCK

    path = write_recipe(str(tmp_path), "killed", str(tmp_path / "root"), shipped_sft)
    recipe = load_recipe(path)
    second_step = os.path.join(
        recipe.storage_root, "trajectories", "stage=rl1", "step=00002.parquet"
    )
    # what follows rl1 is not in question
    command = [sys.executable, "-m", "flows.cli", "pipeline", "run", "--config", path]
    command += ["--until", "rl1"]
    env = {**os.environ, "PREFECT_API_URL": prefect_api}
    run = subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 600
        while (
            time.monotonic() < deadline and not os.path.exists(second_step) and run.poll() is None
        ):
            time.sleep(0.05)
        assert os.path.exists(second_step), "the pipeline never reached rl1's second step"
    finally:
        try:
            os.killpg(run.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # it ended by itself (the assertion above says how)
        run.wait()
    killed = json.loads(Path(os.path.join(recipe.storage_root, LOCK)).read_text())["flow_run_id"]
    assert _flow_run_and_tasks(killed)[0].state.is_running()  # what a SIGKILL leaves behind

    again = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "marked Crashed, left RUNNING by a killed run: flow run" in again.stdout + again.stderr
    flow_run, task_runs = _flow_run_and_tasks(killed)
    assert flow_run.state.is_crashed() and "was killed" in flow_run.state.message
    assert all(t.state.is_final() for t in task_runs), [(t.name, t.state.name) for t in task_runs]

    c, runs = _stage_runs(recipe)
    parents = {r.info.run_id: r for r in runs if r.data.tags.get(ml.PIPELINE) == "root"}
    old = next(r for r in parents.values() if r.info.status != "FINISHED")
    assert old.info.status == "FAILED" and "rstar.reconciled" in old.data.tags
    rl1 = [r for r in runs if r.data.tags.get(ml.STAGE) == "rl1"]
    assert [r.info.status for r in rl1] == ["FINISHED"]
    assert rl1[0].data.tags["rstar.started_as"] == "resumed"
    assert rl1[0].data.tags["rstar.earlier_pipelines"] == old.info.run_id
    assert (
        rl1[0].data.tags["mlflow.parentRunId"] in parents
        and rl1[0].data.tags["mlflow.parentRunId"] != old.info.run_id
    )
    assert sorted(
        {m.step for m in c.get_metric_history(rl1[0].info.run_id, "rollout/accuracy")}
    ) == list(range(1, recipe.rl[0].steps + 1))
    _check_trajectories(
        recipe,
        {"rl1": StageOutput("rl1", trajectories=Layout(recipe.storage_root).trajectories("rl1"))},
    )
    # rl1 resumed to the model the uninterrupted run trained (same recipe but for names)
    rl1_weights = os.path.join(recipe.storage_root, "models", "rl1", "model.safetensors")
    assert digest(rl1_weights) == _weights(finished_local[2]["rl1"])


@pytest.mark.timeout(900)
def test_a_served_deployment_runs_when_triggered_like_the_ui_run_button(
    prefect_api, finished_local
):
    """`rstar serve` in its own process; a flow run created from the deployment through the
    API (what the UI's Run button does) is picked up and completes."""
    import subprocess
    import sys

    from prefect.deployments import run_deployment

    path, _, outs = finished_local
    recipe = load_recipe(path)
    env = {**os.environ, "PREFECT_API_URL": prefect_api}
    server = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "serve", "--config", path, "--name", "test"],
        env=env,
        cwd=os.getcwd(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        _wait_for_deployment("rstar-reevaluate/test-nightly")
        flow_run = run_deployment(
            "rstar-reevaluate/test-nightly",
            parameters={"versions": [outs["rl1"].model.version]},
            timeout=600,
        )
        assert flow_run.state.is_completed(), flow_run.state
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    evals = lineage(recipe.tracking.tracking_uri, outs["rl1"].model.version).evaluations
    # the pipeline's evaluation and the re-evaluation, both attached to rl1's version
    assert len(evals) == 2
    # oldest first, told apart
    assert evals[0]["label"] == "eval" and evals[1]["label"].startswith("reeval-")
    assert evals[0]["data"] == evals[1]["data"] and evals[0]["settings"] == evals[1]["settings"]
    # the same checkpoint, settings and data: the same figures
    assert evals[0]["metrics"] == evals[1]["metrics"]


def test_a_reevaluation_takes_the_settings_and_held_out_set_a_version_was_evaluated_with(
    prefect_api, finished_local, tmp_path
):
    """A deployment's recipe may differ from the one a version was trained and evaluated with
    (another held-out set, another k): by default a re-evaluation takes what the version's last
    evaluation used, so the two compare; recorded=False takes the recipe's."""
    import json

    import yaml

    from flows.reevaluate import reevaluate
    from tests.conftest import product_problems

    path, _, outs = finished_local
    raw = yaml.safe_load(Path(path).read_text())
    held_out = tmp_path / "eval.jsonl"
    held_out.write_text("".join(json.dumps(r) + "\n" for r in product_problems(2, 77)))
    raw["eval"]["k"] = 2
    raw["eval_problems"]["files"] = [str(held_out)]
    raw["storage_root"] = str(tmp_path / "root")  # where its own held-out set is made
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump(raw))
    version = outs["rl2"].model.version  # (rl1's evaluations are counted by another test)
    reevaluate(str(other), [version])
    reevaluate(str(other), [version], recorded=False)
    pipeline_eval, recorded, own = lineage(raw["tracking"]["tracking_uri"], version).evaluations
    assert recorded["settings"] == pipeline_eval["settings"]
    assert recorded["data"] == pipeline_eval["data"]
    assert recorded["label"].startswith("reeval-")
    assert own["settings"]["k"] == "2" and own["data"] != pipeline_eval["data"]
    # each evaluation is on the version itself too, by its label
    name, number = version.rsplit("/", 1)
    tags = ml.client(raw["tracking"]["tracking_uri"]).get_model_version(name, number).tags
    labels = {e["label"] for e in (pipeline_eval, recorded, own)}
    assert {f"{ml.EVALUATED}.{label}" for label in labels} <= set(tags)


def test_lineage_command_prints_the_chain(finished_local):
    from typer.testing import CliRunner

    from rstar.cli import app

    path, _, outs = finished_local
    result = CliRunner().invoke(app, ["lineage", outs["rl3"].model.version, "--config", path])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    stages = [
        line.split()[1] if line.startswith("->") else line.split()[0]
        for line in lines
        if line.strip() and not line.startswith("       ")
    ]
    # from the problems to the model
    assert stages[:7] == ["data", "data", "base", "sft", "rl1", "rl2", "rl3"]
    assert (
        "-> evaluation eval " in result.output
        and outs["mine"].datasets["hard_problems"].digest in result.output
    )
    assert f"on eval_problems digest {outs['problems'].datasets['eval'].digest}" in result.output
    assert "settings include_base=False k=1 " in result.output


def test_a_cached_stage_whose_outputs_were_deleted_or_overwritten_runs_again(
    prefect_api, shipped_sft, tmp_path
):
    """On a root of its own (it damages what it runs on), finished once, then damaged."""
    import shutil

    from flows.pipeline import pipeline

    path = write_recipe(str(tmp_path), "damaged", str(tmp_path / "root"), shipped_sft)
    # through rl3: the evaluation after it is not in question
    assert pipeline(path, until="rl3", return_state=True).is_completed()
    recipe = load_recipe(path)
    shutil.rmtree(os.path.join(recipe.storage_root, "models", "rl3"))
    # another recipe at the same storage root rewrote the mined problems (and said so)
    marker = os.path.join(recipe.storage_root, "cache", "mine.key")
    assert os.path.exists(marker)
    with open(marker, "w") as f:
        f.write("tiny-mine-made-by-another-recipe")
    state = pipeline(path, until="rl3", return_state=True)
    states = _task_states(state.state_details.flow_run_id, expect=state.result())
    assert (
        states["rl3"] == ["Completed"]
        and states["rl2"] == ["Cached"]
        and states["mine"] == ["Completed"]
    )
    assert os.path.exists(os.path.join(recipe.storage_root, "models", "rl3", "config.json"))
