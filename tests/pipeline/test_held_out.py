"""The problems stage keeps held-out benchmarks as published (any answer form; named benchmarks
in their public layout, GPQA's options included), while training problems keep the
integer-answer filter."""

import json

from rstar.data.io import read_table
from rstar.pipeline.config import load_recipe
from rstar.pipeline.layout import Layout
from rstar.pipeline.records import StageInputs
from rstar.pipeline.stages import problems
from rstar.tracking.mlflow_log import NullLog

GPQA = {
    "Record ID": "rec1",
    "Question": "Which boson carries the electromagnetic force?",
    "Correct Answer": "photon",
    "Incorrect Answer 1": "gluon",
    "Incorrect Answer 2": "W boson",
    "Incorrect Answer 3": "Higgs",
}
BENCH = [  # AIME-like, MATH-500-like, a letter
    {"problem": "Find the number of positive divisors of 2024.", "answer": "12"},
    {"problem": "Simplify the ratio of the areas of the two circles.", "answer": "\\frac{9}{4}"},
    {"problem": "Which option names the particle exchanged? (A) gluon (B) photon", "answer": "B"},
]


def test_held_out_benchmarks_keep_answers_of_any_form(tmp_path):
    files = {}
    for name, rows in {
        "gpqa": [GPQA],
        "bench": BENCH,
        "train": BENCH[1:] + [{"problem": "What is 6*7?", "answer": "42"}],
    }.items():
        files[name] = tmp_path / f"{name}.jsonl"
        files[name].write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = load_recipe(
        "configs/tiny.yaml",
        {
            "storage_root": str(tmp_path / "root"),
            "train_problems.synthetic": None,
            "train_problems.files": [str(files["train"])],
            "eval_problems.synthetic": None,
            "eval_problems.files": [str(files["bench"])],
            "eval_problems.benchmarks": {"gpqa_diamond": str(files["gpqa"])},
        },
    )
    out = problems(recipe, Layout(recipe.storage_root), StageInputs(), NullLog())
    held_out = read_table(out.datasets["eval"].uri, "problems").to_pylist()
    assert sorted(r["answer"] for r in held_out) == sorted(
        [r["answer"] for r in BENCH] + ["photon"]
    )
    (gpqa,) = [r for r in held_out if r["source"] == "gpqa_diamond"]
    assert json.loads(gpqa["metadata"])["choices"] == ["photon", "gluon", "W boson", "Higgs"]
    train = read_table(out.datasets["train"].uri, "problems").to_pylist()
    # training keeps integers only, and nothing that is also held out
    assert [r["answer"] for r in train] == ["42"]
