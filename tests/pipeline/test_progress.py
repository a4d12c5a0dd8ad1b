"""Progress: the time left is the rate of the steps seen so far times the steps to go; piped
output gets plain log lines, a terminal gets bars fed by the stage's Ray worker."""

from rstar.pipeline import progress


def test_time_left_counts_from_the_first_step_seen(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    clock = progress.StepClock(200)
    for step in range(1, 51):  # a resumed stage would start later: its first step seen counts
        now[0] += 2.0
        line = clock.where(step)
    assert line == "step 50/200, 1m40s, ~5m00s left"  # 2 s a step, 150 to go
    resumed = progress.StepClock(200)
    now[0] += 2.0
    assert resumed.where(151) == "step 151/200, 2s, ~1m38s left"
    assert resumed.where(200).endswith(", 2s")  # nothing left to estimate at the last step


def test_piped_ticks_are_logged_every_few_steps_and_at_the_last(log_lines, capsys):
    clock = progress.StepClock(120, "pretrain", every=50)
    for step in range(1, 121):
        clock.tick(step, f"loss {1 / step:.3f}")
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "[pretrain] step 50/120, 0s, ~0s left",
        "[pretrain] step 100/120, 0s, ~0s left",
        "[pretrain] step 120/120, 0s",
    ]
    assert lines[-1].endswith("loss 0.008")


def test_slow_piped_steps_are_logged_once_a_minute(log_lines, capsys, monkeypatch):
    now = [0.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    clock = progress.StepClock(40, "sft", every=50)
    for step in range(1, 41):
        now[0] += 15.0  # a real model's SFT step
        clock.tick(step)
    steps = [line.split()[2].rstrip(",") for line in capsys.readouterr().err.splitlines()]
    assert steps == ["4/40", "8/40", "12/40", "16/40", "20/40", "24/40", "28/40", "32/40",
                     "36/40", "40/40"]  # fmt: skip


def test_ticks_for_a_terminal_go_to_the_driver_not_to_the_log(log_lines, monkeypatch, capsys):
    now = [0.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    sent = []
    with progress.connected(sent.append):
        clock = progress.StepClock(40, "rl1")
        for step in range(1, 41):
            now[0] += 0.05  # four steps per send interval
            clock.tick(step, f"accuracy {step / 40:.2f}")
        rollouts = progress.StepClock(6, "eval/sft", unit="rollouts")
        for _ in range(6):
            rollouts.advance()
    assert capsys.readouterr() == ("", "")
    steps = [s for label, s, total, _ in sent if label == "rl1"]
    assert 8 <= len(steps) <= 11 and steps[-1] == 40  # throttled, and the last always sent
    assert sent[-1][:3] == ("eval/sft", 6, 6)
    progress.StepClock(1, "after").tick(1)  # outside `connected`, logged again
    assert capsys.readouterr().err.startswith("[after] step 1/1")


def test_bars_keep_one_task_per_label():
    with progress.Bars() as bars:
        for tick in [("sft", 1, 4, "loss 2.0"), ("sft", 4, 4, "loss 1.0"), ("eval/sft", 3, 8, "")]:
            bars.update(tick)
        tasks = {t.description: t for t in bars.progress.tasks}
    assert sorted(tasks) == ["eval/sft", "sft"]
    assert (tasks["sft"].completed, tasks["sft"].total, tasks["sft"].fields["text"]) == (
        4,
        4,
        "loss 1.0",
    )
    assert tasks["eval/sft"].completed == 3


def test_a_stage_in_a_ray_worker_sends_its_ticks_to_the_driver(tmp_path):
    import ray

    from rstar.pipeline.config import load_recipe
    from rstar.pipeline.launch import run_job
    from rstar.pipeline.records import StageInputs
    from rstar.tracking import mlflow_log as ml
    from tests.model.test_shipped import SMALL_BASE
    from tests.pipeline.conftest import write_recipe

    # a base pretrained here (a few steps), whose ticks the worker sends
    path = write_recipe(str(tmp_path), "ticks", str(tmp_path / "root"))
    recipe = load_recipe(path, {**SMALL_BASE, "base.shipped": None})
    uri = recipe.tracking.tracking_uri
    ticks = []
    try:
        out = run_job(
            "base",
            recipe,
            StageInputs(),
            uri,
            ml.start_run(uri, "ticks", "base"),
            on_progress=ticks.append,
        )
    finally:
        ray.shutdown()
    assert out.stage == "base"
    label, done, total, text = ticks[-1]
    assert (label, done, total) == (
        "pretrain",
        recipe.base.pretrain_steps,
        recipe.base.pretrain_steps,
    )
    assert text.startswith("loss ")


def test_in_a_terminal_prefect_log_lines_go_above_the_bars(monkeypatch):
    import logging
    import sys

    from prefect.logging.handlers import PrefectConsoleHandler

    from tasks.console import LinesAbove, progress_bars

    handler = PrefectConsoleHandler()
    monkeypatch.setattr(logging.getLogger("rstar-test-bars"), "handlers", [handler])
    own = handler.console
    with progress_bars() as on_progress:  # piped (pytest captures): no bars, the worker prints
        assert on_progress is None and handler.console is own
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
    with progress_bars() as on_progress:
        assert isinstance(handler.console, LinesAbove)
        on_progress(("sft", 1, 2, "loss 1.0"))
    assert handler.console is own  # restored when the stage ends


def test_a_stages_progress_reaches_the_prefect_ui(prefect_api, monkeypatch):
    """A progress artifact per task label that fills as ticks come (throttled to one update
    per ARTIFACT_EVERY_S, and the last), and a line in the task run's log at the first tick, once
    a minute and at the last."""
    import asyncio

    from prefect import flow, task
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId
    from prefect.runtime import flow_run

    import tasks.progress as tp

    now = [1000.0]
    monkeypatch.setattr(tp.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    lines = []

    @task
    def stage():
        ui = tp.PrefectProgress("Rec", "rl1")
        monkeypatch.setattr(ui.log, "info", lambda fmt, *a: lines.append(fmt % a))
        for step in range(1, 6):
            ui(("rl1", step, 5, f"accuracy {step / 10:.1f}"))
            now[0] += 30.0  # a step of 30 s
        ui(("eval/rl1", 1, 2, ""))
        return flow_run.get_id()

    @flow
    def run():
        return stage()

    run_id = run()

    async def read():
        async with get_client() as client:
            return await client.read_artifacts(
                artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run_id]))
            )

    found = {a.key: a for a in asyncio.run(read())}
    assert set(found) == {"rec-rl1-progress-rl1", "rec-rl1-progress-eval-rl1"}
    assert found["rec-rl1-progress-rl1"].type == "progress"
    assert float(found["rec-rl1-progress-rl1"].data) == 100.0
    assert float(found["rec-rl1-progress-eval-rl1"].data) == 50.0
    assert found["rec-rl1-progress-rl1"].description == "rl1: step 5/5, 2m00s"
    # step 3 is the first a minute after the first line
    assert lines == [
        "[rl1] step 1/5, 0s, ~0s left: accuracy 0.1",
        "[rl1] step 3/5, 1m00s, ~40s left: accuracy 0.3",
        "[rl1] step 5/5, 2m00s: accuracy 0.5",
        "[eval/rl1] step 1/2, 0s, ~0s left",
    ]
