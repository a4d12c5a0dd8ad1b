"""The relay benchmark runs both relays on the same calls and writes its section. Its figures
live in docs/benchmarks.md; the behaviour it measures is tested in test_distributed.py
(test_a_slow_call_holds_no_other_call_of_its_batch)."""

from rstar.bench.relay import RELAYS, run, workload


def test_the_workload_is_seeded_and_mixed():
    calls = workload(200, 0.1, 0.01, 0.5, seed=3)
    assert calls == workload(200, 0.1, 0.01, 0.5, seed=3)
    assert 5 < sum(slow for _, slow in calls) < 40


def test_the_relay_benchmark_measures_both_relays_and_writes_them(tmp_path):
    out = tmp_path / "benchmarks.md"
    figures = run(
        calls=24,
        wave=12,
        slow_fraction=0.3,
        quick_s=0.01,
        slow_s=0.3,
        slots=4,
        rounds=1,
        out=str(out),
    )
    assert set(figures) == set(RELAYS)
    assert all(f["calls_per_s"] > 0 and f["slow_p50_ms"] >= 300 for f in figures.values())
    text = out.read_text()
    assert "<!-- sandbox-relay:start -->" in text
    assert all(f"| {relay} |" in text for relay in RELAYS)
