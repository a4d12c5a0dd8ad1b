"""Progress a person can read: where a stage is, how long it took so far, what is left.

A stage's work runs in a Ray worker. Where the pipeline's output is a terminal, the driver
draws a rich progress bar per task (pretrain, sft, rl1, mine, eval/rl3 ...) from the ticks the
worker sends it (`connected`, rstar.pipeline.launch); piped to a file or a CI log, the worker
logs plain lines instead (rstar.logs), with the same figures.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import contextmanager

log = logging.getLogger(__name__)
_send: Callable[[tuple], None] | None = None  # set in a worker whose driver draws the bars
SEND_EVERY_S = 0.2  # a tick is a Ray call: at most five a second per task, and always the last
# piped, a line at least this often while steps come: a real model's SFT step takes 15 s here,
# and 50 of them in silence looked hung
LOG_EVERY_S = 60.0


@contextmanager
def connected(send: Callable[[tuple], None] | None):
    """Within the body, ticks go to `send` as (label, done, total, text) instead of being logged."""
    global _send
    _send = send
    try:
        yield
    finally:
        _send = None


def _span(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class StepClock:
    """`clock.where(step)` -> "step 12/40, 1m05s, ~2m31s left": the rate of the steps run since the
    clock started (a resumed stage's first reported step may not be 1). `tick` reports a step:
    to the driver's bar, or as a logged `[label] ...` line every `every` steps, at the first step
    a minute after the last line, and at the last."""

    def __init__(self, total: int, label: str = "", every: int = 1, unit: str = "step") -> None:
        self.total, self.label, self.every, self.unit = total, label, max(1, every), unit
        self.start, self.before, self.sent, self.done = time.monotonic(), None, 0.0, 0
        self.logged = self.start

    def where(self, step: int) -> str:
        if self.before is None:
            self.before = step - 1
        spent = time.monotonic() - self.start
        left = spent / (step - self.before) * (self.total - step)
        return f"{self.unit} {step}/{self.total}, {_span(spent)}" + (
            f", ~{_span(left)} left" if step < self.total else ""
        )

    def tick(self, step: int, text: str = "") -> None:
        where = self.where(step)  # every step: the rate counts from the first step seen
        now = time.monotonic()
        if _send is not None:
            if step == self.total or now - self.sent >= SEND_EVERY_S:
                self.sent = now
                _send((self.label, step, self.total, text))
        elif step % self.every == 0 or step == self.total or now - self.logged >= LOG_EVERY_S:
            self.logged = now
            log.info("[%s] %s%s", self.label, where, f": {text}" if text else "")

    def advance(self, n: int = 1) -> None:
        """Count `n` more units done (rollouts of a sampling stage)."""
        self.done += n
        self.tick(self.done)


class Bars:
    """The driver's side in a terminal: one bar per task label, fed with the workers' ticks.
    While it is shown, whatever the process prints goes above the bars (rich's redirection)."""

    def __init__(self) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.progress = Progress(
            TextColumn("[bold]{task.description:<10}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("left"),
            TimeRemainingColumn(),
            TextColumn("{task.fields[text]}"),
            redirect_stdout=True,
            redirect_stderr=True,
        )
        self.tasks: dict[str, int] = {}

    def __enter__(self) -> Bars:
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def update(self, tick: tuple) -> None:
        label, done, total, text = tick
        if label not in self.tasks:
            self.tasks[label] = self.progress.add_task(label, total=total, text="")
        self.progress.update(self.tasks[label], completed=done, total=total, text=text)
