"""Progress lines a person can read: where a stage is, how long it took so far, what is left."""
from __future__ import annotations

import time


def _span(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class StepClock:
    """`clock.where(step)` -> "step 12/40, 1m05s, ~2m31s left": the rate of the steps run since the
    clock started (a resumed stage's first reported step may not be 1)."""

    def __init__(self, total: int) -> None:
        self.total, self.start, self.before = total, time.monotonic(), None

    def where(self, step: int) -> str:
        if self.before is None:
            self.before = step - 1
        spent = time.monotonic() - self.start
        left = spent / (step - self.before) * (self.total - step)
        return f"step {step}/{self.total}, {_span(spent)}" + (f", ~{_span(left)} left" if step < self.total else "")
