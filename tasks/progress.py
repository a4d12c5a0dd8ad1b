"""Where a running stage's progress shows: in the Prefect UI (a progress artifact per task of the
stage that fills as its steps come, and a line in the task run's log at least once a minute)
and, in a terminal, a bar per task (tasks.console). The worker sends ticks (label, done, total,
text) through a Ray queue (rstar.pipeline.launch)."""

from __future__ import annotations

import time
from contextlib import contextmanager

from prefect import get_run_logger
from prefect.artifacts import create_progress_artifact, update_progress_artifact

from rstar.pipeline.progress import LOG_EVERY_S, StepClock
from tasks.console import progress_bars
from tasks.summary import artifact_key

ARTIFACT_EVERY_S = 2.0  # an update is an API call


class PrefectProgress:
    """Ticks of one stage as Prefect progress artifacts (`<recipe>-<stage>-progress-<label>`)
    and throttled log lines ("[rl1] step 3/5, 4m10s, ~2m46s left: accuracy 0.25")."""

    def __init__(self, recipe: str, stage: str) -> None:
        self.recipe, self.stage, self.log = recipe, stage, get_run_logger()
        self.tasks: dict[str, dict] = {}

    def __call__(self, tick: tuple) -> None:
        label, done, total, text = tick
        now = time.monotonic()
        task = self.tasks.get(label)
        if task is None:
            task = self.tasks[label] = {"clock": StepClock(total, label), "logged": float("-inf")}
            task["artifact"] = create_progress_artifact(
                100.0 * done / total,
                key=artifact_key(self.recipe, f"{self.stage}-progress-{label.replace('/', '-')}"),
                description=f"{label}: {done}/{total}",
            )
            task["updated"] = now
        where = task["clock"].where(done)
        last = done >= total
        if last or now - task["updated"] >= ARTIFACT_EVERY_S:
            task["updated"] = now
            update_progress_artifact(
                task["artifact"], 100.0 * done / total, description=f"{label}: {where}"
            )
        if last or now - task["logged"] >= LOG_EVERY_S:  # the first tick too
            task["logged"] = now
            self.log.info("[%s] %s%s", label, where, f": {text}" if text else "")


@contextmanager
def stage_progress(recipe: str, stage: str):
    """A callable for the stage's ticks: to Prefect, and to the bars where there is a terminal."""
    prefect = PrefectProgress(recipe, stage)
    with progress_bars() as bars:

        def on_tick(tick: tuple) -> None:
            prefect(tick)
            if bars is not None:
                bars(tick)

        yield on_tick
