"""The recipe benchmark's arithmetic and its ablation plot."""
from rstar.pipeline.bench import _accuracy, end_window, plot_ablation


def test_accuracy_weights_benchmarks_by_questions():
    summary = {"a": {"questions": 1, "avg_pass@1": 1.0}, "b": {"questions": 3, "avg_pass@1": 0.0}}
    assert _accuracy(summary) == 0.25


def test_ablation_plot_is_a_png(tmp_path):
    hist = {m: [{"step": s, "tool_error_rate_positive": 0.5 / s, "accuracy": 0.1 * s} for s in (1, 2, 3)]
            for m in ("roc", "grpo")}
    path = tmp_path / "ablation.png"
    plot_ablation(hist, str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_ablation_compares_the_last_third_of_the_stage():
    assert end_window(30) == 10 and end_window(31) == 10
    assert end_window(2) == 1  # a stage shorter than 3 steps: its last step
