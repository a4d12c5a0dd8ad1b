"""The recipe benchmark's arithmetic and its ablation plot."""

from rstar.bench.recipe import (
    ablation_table,
    end_window,
    per_step,
    plot_ablation,
    pooled_error_rate,
    seed_paired_test,
)
from rstar.eval.metrics import overall_accuracy


def _step(step, calls, errors, accuracy=0.5, kept_calls=0, kept_errors=0):
    return {
        "step": step,
        "accuracy": accuracy,
        "tool_calls_positive": calls,
        "tool_errors_positive": errors,
        "tool_error_rate_positive": errors / calls if calls else 0.0,
        "tool_calls_positive_kept": kept_calls,
        "tool_errors_positive_kept": kept_errors,
        "response_len_mean": 80.0 + step,
    }


def test_accuracy_weights_benchmarks_by_questions():
    summary = {"a": {"questions": 1, "avg_pass@1": 1.0}, "b": {"questions": 3, "avg_pass@1": 0.0}}
    assert overall_accuracy(summary) == 0.25


def test_error_rates_pool_calls_not_step_rates():
    # a step with 1 error in 2 calls and one with 0 in 98: 1 in 100, not the mean of 0.5 and 0
    steps = [_step(1, 2, 1), _step(2, 98, 0)]
    assert pooled_error_rate(steps) == 0.01
    assert pooled_error_rate([_step(1, 0, 0)]) == 0.0  # no correct trajectory called the tool
    assert pooled_error_rate([_step(1, 4, 0, kept_calls=4, kept_errors=1)], "positive_kept") == 0.25


def test_per_step_pools_seeds():
    runs = {
        0: [_step(1, 10, 1, 0.2), _step(2, 10, 0, 0.4)],
        1: [_step(1, 30, 0, 0.4), _step(2, 10, 2, 0.6)],
    }
    (s1, e1, a1), (s2, e2, a2) = per_step(runs)
    assert (s1, s2) == (1, 2)
    assert e1 == 1 / 40 and e2 == 2 / 20
    assert abs(a1 - 0.3) < 1e-12 and abs(a2 - 0.5) < 1e-12


def test_ablation_table_compares_the_end_windows_pooled_over_seeds():
    # RoC: errors early only; GRPO: errors in the last step of one seed
    roc = {0: [_step(1, 10, 5), _step(2, 10, 0)], 1: [_step(1, 10, 5), _step(2, 10, 0)]}
    grpo = {0: [_step(1, 10, 0), _step(2, 10, 0)], 1: [_step(1, 10, 0), _step(2, 10, 1)]}
    rows, met = ablation_table({"roc": roc, "grpo": grpo}, window=1)
    # whole stage: 10 in 40
    assert rows[2] == "| roc | 0.000 | 0.000, 0.000 | 0.000 | 0.250 | 0.500 | 82 |"
    assert rows[3].startswith("| grpo | 0.050 | 0.000, 0.100 | 0.000 | 0.025 |")
    # lower, but two seeds cannot make p < 0.05 (one seed tied, the other 1 of 2 sign flips)
    assert not met and rows[-1].endswith("p = 0.500.")


def test_the_ablation_is_met_when_every_one_of_five_seeds_favours_roc():
    def runs(errors: list[int]) -> dict:
        return {seed: [_step(1, 10, e)] for seed, e in enumerate(errors)}

    roc, grpo = runs([0, 1, 0, 2, 1]), runs([1, 2, 2, 3, 2])
    diff, p = seed_paired_test({"roc": roc, "grpo": grpo}, window=1)
    assert diff == -0.12 and p == 1 / 32  # only the observed signs are as low
    _, met = ablation_table({"roc": roc, "grpo": grpo}, window=1)
    assert met
    # one seed the other way round: no longer significant
    roc[4] = [_step(1, 10, 4)]
    assert seed_paired_test({"roc": roc, "grpo": grpo}, window=1)[1] > 0.05
    assert not ablation_table({"roc": roc, "grpo": grpo}, window=1)[1]


def test_ablation_plot_is_a_png(tmp_path):
    hist = {
        m: {seed: [_step(s, 10, 5 // s, 0.1 * s) for s in (1, 2, 3)] for seed in (0, 1)}
        for m in ("roc", "grpo")
    }
    path = tmp_path / "ablation.png"
    plot_ablation(hist, str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_ablation_compares_the_last_third_of_the_stage():
    assert end_window(30) == 10 and end_window(31) == 10
    assert end_window(2) == 1  # a stage shorter than 3 steps: its last step


def _bench(avg, se, calls=1.0, errors=0.0, samples=60, length=200):
    return {
        "questions": samples,
        "samples": samples,
        "avg_pass@1": avg,
        "avg_pass@1_se": se,
        "tool_calls_per_answer": calls,
        "tool_error_rate": errors,
        "response_len_mean": length,
    }


def test_the_real_model_section_reports_gains_with_their_intervals(tmp_path):
    from rstar.bench.recipe import write_real_model_benchmark
    from rstar.pipeline.records import Evaluation, StageOutput

    summaries = {
        "base": {"gsm": _bench(0.02, 0.02, calls=0.0), "champ": _bench(0.0, 0.0, calls=0.0)},
        "sft": {"gsm": _bench(0.05, 0.03, errors=0.5), "champ": _bench(0.01, 0.01, errors=0.5)},
        "rl1": {"gsm": _bench(0.30, 0.06, errors=0.25), "champ": _bench(0.02, 0.02, calls=2.0)},
    }
    import pyarrow as pa
    import pyarrow.parquet as pq

    # rl1's rollouts over its two steps (its last step's metrics alone would say 1.000)
    steps = tmp_path / "trajectories"
    steps.mkdir()
    for step, rows in enumerate([[(1.0, 2, 0, 100), (0.0, 1, 1, 200)], [(1.0, 1, 0, 150)]], 1):
        keys = ["reward", "num_tool_calls", "num_tool_errors", "response_len"]
        table = pa.Table.from_pylist([dict(zip(keys, r)) for r in rows])
        pq.write_table(table, steps / f"step={step:05d}.parquet")
    outs = {
        "sft": StageOutput("sft"),
        "rl1": StageOutput("rl1", {"accuracy": 1.0}, trajectories=str(steps)),
        "evaluate": StageOutput(
            "evaluate", evaluation=Evaluation(summaries, "", True, ["ok: rl1 held-out ..."])
        ),
    }
    text = write_real_model_benchmark(
        "configs/smollm2.yaml",
        outs,
        12.0,
        str(tmp_path / "b.md"),
        {"storage_root": str(tmp_path / "root")},
    )
    # rl1's tool use: 60 answers x 2 calls none in error, 60 x 1 call a quarter in error
    assert "| rl1 | 0.020 (0.000-0.059) | 0.300 (0.182-0.418) | 1.50 | 0.083 | 200 |" in text
    assert "- gsm, over base: +0.280 (+0.156 to +0.404; excludes zero)" in text
    assert "- champ, over sft: +0.010 (-0.034 to +0.054; includes zero)" in text
    assert "| rl1 | 3 | 0.667 | 0.250 | 150 |" in text and "- ok: rl1 held-out ..." in text
    assert (tmp_path / "b.md").read_text().count("## Real model: smollm2") == 1


def _fake_bench(monkeypatch):
    """The pipeline and the ablation's training replaced by recorders: what each was asked."""
    from types import SimpleNamespace

    import flows.pipeline
    import rstar.bench.recipe as bench

    seen = {"pipeline": []}

    def pipeline(config, values, until=None):
        seen["pipeline"].append((config, values, until))
        return {"sft": SimpleNamespace(model=SimpleNamespace(uri=f"sft-of-{until}"))}

    def ablation(recipe, sft_model, seeds):
        seen["ablation"] = (recipe.rl[0].steps, recipe.rl[0].sampling.max_response_tokens)
        seen["ablation_sft"], seen["seeds"] = sft_model, seeds
        return {
            m: {s: [_step(i, 10, e) for i in (1, 2, 3)] for s in range(seeds)}
            for m, e in (("roc", 0), ("grpo", 1))
        }

    monkeypatch.setattr(flows.pipeline, "pipeline", pipeline)
    monkeypatch.setattr(bench, "ablation", ablation)
    return seen


def _bench_recipe(*args):
    from typer.testing import CliRunner

    from flows.cli import app

    return CliRunner().invoke(app, ["bench-recipe", *args])


def test_ablation_only_runs_its_recipe_to_sft_and_the_ablation_on_its_overrides(
    tmp_path, monkeypatch
):
    """`rstar bench-recipe --ablation-only`: the pipeline up to SFT and the ablation both see
    the ablation's overrides file over the command's --set values (the full benchmark used to
    load the recipe file without them); the table is printed, docs/benchmarks.md not written."""
    seen = _fake_bench(monkeypatch)
    overrides = tmp_path / "abl.yaml"
    overrides.write_text("rl1.steps: 3\nstorage_root: " + str(tmp_path / "abl-root") + "\n")
    out, png = tmp_path / "benchmarks.md", tmp_path / "abl.png"
    result = _bench_recipe(
        "--ablation-only", "--ablation", str(overrides), "--out", str(out), "--png", str(png),
        "--set", "rl1.steps=7", "--set", "rl1.sampling.max_response_tokens=90",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    [(_, values, until)] = seen["pipeline"]
    assert until == "sft" and values["rl1.steps"] == 3  # the file's, over --set's
    assert values["storage_root"] == str(tmp_path / "abl-root")
    assert seen["ablation"] == (3, 90) and seen["seeds"] == 5  # five seeds unless told
    assert "| roc | 0.000 |" in result.output and "target met" in result.output
    assert png.exists() and (tmp_path / "abl.json").exists() and not out.exists()


def test_the_recipe_benchmark_ablates_on_an_sft_of_its_own(tmp_path, monkeypatch):
    """The whole benchmark: the recipe as given, then the ablation's recipe up to SFT, whose
    checkpoint the ablation starts from; the section says which setting it ablated."""
    import rstar.bench.recipe as bench

    seen = _fake_bench(monkeypatch)
    written = {}
    monkeypatch.setattr(
        bench,
        "write_recipe_benchmark",
        lambda config, outs, wall, ablation, out, values: written.update(a=ablation, v=values),
    )
    root = str(tmp_path / "root")
    result = _bench_recipe("--png", str(tmp_path / "abl.png"), "--set", f"storage_root={root}")
    assert result.exit_code == 0, result.output
    (_, recipe_values, until), (_, ablation_values, sft_only) = seen["pipeline"]
    assert until is None and recipe_values == written["v"] == {"storage_root": root}
    assert sft_only == "sft" and ablation_values["storage_root"] == "runs/roc-ablation"
    assert seen["ablation_sft"] == "sft-of-sft" and seen["ablation"] == (48, 256)
    assert written["a"].what == "`configs/roc-ablation.yaml`'s overrides" and written["a"].met
    # '' ablates the recipe's own stage 1 on the recipe's own SFT
    seen["pipeline"].clear()
    result = _bench_recipe("--png", str(tmp_path / "abl.png"), "--ablation", "")
    assert result.exit_code == 0, result.output
    assert [until for *_, until in seen["pipeline"]] == [None]
    assert seen["ablation_sft"] == "sft-of-None" and seen["ablation"][0] == 40
    assert written["a"].what == "the recipe's own stage 1"


def test_bad_ablation_overrides_are_refused_naming_the_file_and_key(tmp_path):
    import pytest

    from rstar.bench.recipe import ablation_recipe
    from rstar.pipeline.config import ConfigError

    bad = tmp_path / "bad.yaml"
    for text, said in [
        ("rl1.stepz: 3\n", "stepz: unknown key"),
        ("- rl1.steps\n", "expected a mapping"),
        ("rl1.steps: [\n", "cannot read"),
    ]:
        bad.write_text(text)
        with pytest.raises(ConfigError, match=rf"^{bad}: .*{said}"):
            ablation_recipe("configs/tiny.yaml", str(bad), {})
    with pytest.raises(ConfigError, match="missing.yaml: cannot read"):
        ablation_recipe("configs/tiny.yaml", str(tmp_path / "missing.yaml"), {})
