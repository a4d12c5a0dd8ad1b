"""An evaluation of the tiny model end to end (small k, short budget), and the protocol's
summary on crafted records."""

import json

import pytest

from rstar.agent.sampling import Sampling
from rstar.data import synth
from rstar.eval.benchmarks import load_benchmark
from rstar.eval.config import EvalConfig
from rstar.eval.run import evaluate, summarize_eval


def test_summary_on_crafted_records():
    problems = {
        "m1": {
            "id": "m1",
            "answer": "12",
            "source": "s",
            "metadata": json.dumps({"benchmark": "toy"}),
        },
        "m2": {
            "id": "m2",
            "answer": "5",
            "source": "s",
            "metadata": json.dumps({"benchmark": "toy"}),
        },
    }

    def rec(pid, answer, correct, n_calls=1, n_err=0, length=10):
        return {
            "problem_id": pid,
            "answer": answer,
            "correct": correct,
            "num_tool_calls": n_calls,
            "num_tool_errors": n_err,
            "response_len": length,
            "finish_reason": "answered",
        }

    records = [
        rec("m1", "12", True),
        rec("m1", "12", True),
        rec("m1", "7", False, n_err=1),
        rec("m1", "12.0", True),
        rec("m2", "4", False),
        rec("m2", "4", False),
        rec("m2", "5", True, length=30),
        rec("m2", None, False),
    ]
    s = summarize_eval(records, problems, 4)["toy"]
    assert s["avg_pass@1"] == pytest.approx((3 / 4 + 1 / 4) / 2)
    # the standard error is over questions (0.75 and 0.25), not over the 8 samples pooled
    assert s["avg_pass@1_se"] == pytest.approx(0.25)
    assert s["pass@4"] == pytest.approx(1.0)  # every question solved at least once in 4
    assert s["maj@4"] == pytest.approx(0.5)  # m1's majority is right, m2's ("4") is not
    assert s["tool_error_rate"] == pytest.approx(1 / 8) and s["tool_calls_per_answer"] == 1.0
    assert s["response_len_p95"] == 30
    # a question with fewer samples (a budget cut short) weighs as much as the others:
    # (3/4 + 1/4 + 2/2) / 3, where the pooled mean would be 6/10
    problems["m3"] = {**problems["m2"], "id": "m3", "answer": "9"}
    more = records + [rec("m3", "9", True), rec("m3", "9", True)]
    assert summarize_eval(more, problems, 4)["toy"]["avg_pass@1"] == pytest.approx(2 / 3)


async def test_evaluate_the_tiny_model(tiny_dir, tokenizer, agent_sandbox, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    from rstar.agent.loop import AgentLoop
    from rstar.rollout.hf_engine import HFEngine

    sampling = Sampling(temperature=0.6, max_response_tokens=24, max_turns=2)
    gpqa = tmp_path / "gpqa.jsonl"
    gpqa.write_text(
        json.dumps(
            {
                "Record ID": "r1",
                "Question": "Pick one.",
                "Correct Answer": "yes",
                "Incorrect Answer 1": "no",
                "Incorrect Answer 2": "maybe",
                "Incorrect Answer 3": "never",
            }
        )
        + "\n"
    )
    problems = synth.generate(2, seed=3, levels=(1,)) + load_benchmark("gpqa_diamond", str(gpqa))
    engine = HFEngine(AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32))
    loop = AgentLoop(
        engine,
        tokenizer,
        agent_sandbox,
        sampling,
    )
    records, summary = await evaluate(loop, problems, EvalConfig(k=3, sampling=sampling))
    await engine.close()
    assert len(records) == 3 * 3
    assert set(summary) == {
        "synthetic/" + json.loads(p["metadata"])["family"] for p in problems[:2]
    } | {"gpqa_diamond"}
    for s in summary.values():
        assert 0 <= s["avg_pass@1"] <= s["pass@3"] <= 1 and s["samples"] == 3 * s["questions"]
    gpqa_rows = [r for r in records if r["problem_id"] == "gpqa_diamond-r1"]
    assert sorted(r["sample_index"] for r in gpqa_rows) == [0, 1, 2]
    assert all(r["answer"] in (None, "yes", "no", "maybe", "never") for r in gpqa_rows)


def test_eval_command_compares_checkpoints(tiny_dir, tmp_path):
    from typer.testing import CliRunner

    from rstar.cli import app
    from rstar.data.io import read_table, write_table

    held_out = str(tmp_path / "held.parquet")
    write_table(synth.generate(2, seed=8, levels=(1,)), held_out, "problems")
    out = tmp_path / "eval"
    import shutil

    from rstar.agent.format import STYLES, save_style

    # as the pipeline publishes a checkpoint: with the prompt style it trained on
    trained = str(tmp_path / "rl1")
    shutil.copytree(tiny_dir, trained)
    save_style(trained, "compact")
    command = (
        f"eval --model sft={tiny_dir} --model rl1={trained} --bench problems={held_out} "
        f"--out {out} --k 2 --max-response-tokens 16 --max-turns 1"
    )
    r = CliRunner().invoke(app, command.split())
    assert r.exit_code == 0, r.output
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary) == {"sft", "rl1"}
    report = (out / "report.md").read_text()
    assert "sft avg@1" in report and "rl1 avg@1" in report  # side by side
    assert "| group | questions | sft | rl1 |" in report  # and by family and level
    assert len(read_table(str(out / "sft.samples.parquet"), "trajectories")) == 4
    prompts = {
        name: read_table(str(out / f"{name}.samples.parquet"), "trajectories")
        .column("prompt_text")[0]
        .as_py()
        for name in ("sft", "rl1")
    }
    assert STYLES["compact"].system in prompts["rl1"]  # read back from the checkpoint
    assert (
        STYLES["paper"].system.split("\n")[0] in prompts["sft"]
        and STYLES["compact"].system not in prompts["sft"]
    )
    assert "<th>rl1 avg pass@1</th>" in (out / "report.html").read_text()
    for png in ("accuracy.png", "length.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_eval_names_a_missing_model_before_loading_anything(tmp_path):
    from typer.testing import CliRunner

    from rstar.cli import app

    command = f"eval --model x={tmp_path}/nowhere --bench aime24 --out {tmp_path / 'out'}"
    result = CliRunner().invoke(app, command.split())
    text = " ".join(result.output.replace("│", " ").split())  # rich wraps the message in a box
    assert result.exit_code == 2 and "is not a model directory" in text and "Traceback" not in text


def test_the_same_checkpoint_evaluated_twice_gives_the_same_figures(tiny_dir):
    """Sampling is seeded by the evaluation's seed, problem and sample, not by the label the
    checkpoint is evaluated under (the pipeline's `rl3`, a nightly re-evaluation's
    `rstar-tiny/5`)."""
    from rstar.data import synth
    from rstar.eval.config import EvalConfig
    from rstar.eval.run import evaluate_model

    problems = synth.generate(4, seed=5, levels=(1,), prefix="eval")
    cfg = EvalConfig(k=2, sampling=Sampling(temperature=1.0, max_response_tokens=32, max_turns=2))
    (first, s1), (again, s2) = (
        evaluate_model(tiny_dir, problems, cfg, name=n) for n in ("rl3", "rstar-tiny/5")
    )

    def texts(records):
        return [
            r["response_text"]
            for r in sorted(records, key=lambda r: (r["problem_id"], r["sample_index"]))
        ]

    assert texts(first) == texts(again) and s1 == s2
    assert len(set(texts(first))) > 1  # sampled, not one greedy text
    other, _ = evaluate_model(
        tiny_dir, problems, EvalConfig(**{**cfg.__dict__, "seed": 1}), name="rl3"
    )
    assert texts(other) != texts(first)  # the seed is what decides


def test_a_model_whose_files_changed_since_registration_is_refused(tiny_dir, tmp_path):
    import pytest

    from rstar.data.io import write_table
    from rstar.errors import NotRetryable
    from rstar.pipeline import stages
    from rstar.pipeline.config import load_recipe
    from rstar.pipeline.layout import Layout
    from rstar.pipeline.records import ModelRef, StageInputs, Stored
    from rstar.tracking.digest import digest
    from rstar.tracking.mlflow_log import NullLog

    recipe = load_recipe(
        "configs/tiny.yaml",
        {
            "storage_root": str(tmp_path / "root"),
            "eval.k": 1,
            "eval.sampling.max_response_tokens": 8,
        },
    )
    held_out = write_table(
        synth.generate(1, seed=8, levels=(1,)), str(tmp_path / "held.parquet"), "problems"
    )
    inputs = StageInputs(
        models={"rl1": ModelRef(tiny_dir, "0123456789abcdef")}, problems=Stored(held_out)
    )
    with pytest.raises(
        NotRetryable,
        match=f"rl1: the files at {tiny_dir} have digest {digest(tiny_dir)}, "
        "not the 0123456789abcdef they were registered with",
    ):
        stages.evaluate(recipe, Layout(recipe.storage_root), inputs, NullLog())
    registered = StageInputs(
        models={"rl1": ModelRef(tiny_dir, digest(tiny_dir))}, problems=Stored(held_out)
    )
    out = stages.evaluate(recipe, Layout(recipe.storage_root), registered, NullLog())
    assert list(out.evaluation.summaries) == ["rl1"]


def test_a_held_out_set_from_a_file_is_reported_under_the_files_stem():
    """Curation names a file's problems after its path; the evaluation reports them under the
    file's stem, a name MLflow accepts in a metric key (a path is refused there)."""
    problem = {
        "id": "p",
        "answer": "1",
        "source": "/data/sets/held-out.v2.jsonl",
        "metadata": json.dumps({}),
    }
    record = {
        "problem_id": "p",
        "answer": "1",
        "correct": True,
        "num_tool_calls": 0,
        "num_tool_errors": 0,
        "response_len": 5,
        "finish_reason": "answered",
    }
    assert list(summarize_eval([record], {"p": problem}, 1)) == ["held-out"]


def test_the_base_evaluated_beside_the_recipe_keeps_the_verdict_on_the_trained(tiny_dir, tmp_path):
    """`eval.include_base` (a chat model's starting point): the base is a row of the table and
    a line of its own; the verdict still compares the RL stages with SFT."""
    from rstar.data.io import write_table
    from rstar.pipeline import stages
    from rstar.pipeline.config import load_recipe
    from rstar.pipeline.layout import Layout
    from rstar.pipeline.records import ModelRef, StageInputs, Stored
    from rstar.tracking.digest import digest
    from rstar.tracking.mlflow_log import NullLog

    recipe = load_recipe(
        "configs/tiny.yaml",
        {
            "storage_root": str(tmp_path / "root"),
            "eval.k": 1,
            "eval.sampling.max_response_tokens": 8,
            "eval.include_base": True,
        },
    )
    held_out = write_table(
        synth.generate(1, seed=8, levels=(1,)), str(tmp_path / "held.parquet"), "problems"
    )
    model = ModelRef(tiny_dir, digest(tiny_dir))
    names = ["base", "sft", "rl1", "rl2", "rl3"]
    inputs = StageInputs(models=dict.fromkeys(names, model), problems=Stored(held_out))
    out = stages.evaluate(recipe, Layout(recipe.storage_root), inputs, NullLog())
    assert list(out.evaluation.summaries) == names
    lines = out.evaluation.verdict
    assert lines[0].startswith("sft held-out ") and "rl1 held-out" in lines[1]
    assert out.evaluation.learnt is not None and "| base |" in out.evaluation.table


def test_a_resumed_evaluation_keeps_the_checkpoints_it_finished(tiny_dir, tmp_path, monkeypatch):
    """Each checkpoint's samples are kept as it finishes: an evaluation run again with the same
    recipe and inputs (a retry, a run after a kill) evaluates only the checkpoints it lacks,
    and reports the same figures for the ones it kept."""
    import os

    from rstar.data.io import write_table
    from rstar.eval import run
    from rstar.pipeline import cache, stages
    from rstar.pipeline.config import load_recipe
    from rstar.pipeline.layout import Layout
    from rstar.pipeline.records import ModelRef, StageInputs, Stored
    from rstar.tracking.digest import digest
    from rstar.tracking.mlflow_log import NullLog

    recipe = load_recipe(
        "configs/tiny.yaml",
        {
            "storage_root": str(tmp_path / "root"),
            "eval.k": 2,
            "eval.sampling.max_response_tokens": 8,
        },
    )
    held_out = write_table(
        synth.generate(3, seed=8, levels=(1,)), str(tmp_path / "held.parquet"), "problems"
    )
    model = ModelRef(tiny_dir, digest(tiny_dir))
    inputs = StageInputs(models={"sft": model, "rl1": model}, problems=Stored(held_out))
    first = stages.evaluate(recipe, Layout(recipe.storage_root), inputs, NullLog())
    # killed before rl1's samples were kept
    os.remove(f"{cache.work_uri(recipe, 'evaluate', inputs)}/rl1.samples.parquet")
    evaluated = []
    real = run.evaluate_model

    def counting(path, problems, cfg, **kw):
        evaluated.append(kw["name"])
        return real(path, problems, cfg, **kw)

    monkeypatch.setattr(run, "evaluate_model", counting)
    again = stages.evaluate(recipe, Layout(recipe.storage_root), inputs, NullLog())
    assert evaluated == ["rl1"]
    assert again.evaluation.summaries == first.evaluation.summaries
    assert again.evaluation.table == first.evaluation.table
