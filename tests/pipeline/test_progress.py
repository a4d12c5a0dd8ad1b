"""Progress lines: the time left is the rate of the steps seen so far times the steps to go."""
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
