"""Problems from installed packages (CHAMP, reasoning-gym) through the same curation as any file:
read offline, seeded, whole GSM-Symbolic templates held out, a clear error for a bad URI before
any work, and a report of what each source kept and why the rest went."""

import json
import subprocess
import sys

import pytest

from rstar.data.curate import SourceSpec, curate
from rstar.data.io import DataError, read_table, write_table
from rstar.data.packaged import GSM_SUFFIX, packaged_rows
from rstar.eval.run import _benchmark
from rstar.pipeline.config import ConfigError, load_recipe
from rstar.pipeline.layout import Layout
from rstar.pipeline.records import StageInputs
from rstar.pipeline.stages import problems
from rstar.tracking.mlflow_log import NullLog

TRAIN = "reasoning-gym://gsm_symbolic?n=300&seed=0&templates=0-69"
HELD_OUT = "reasoning-gym://gsm_symbolic?n=60&seed=99&templates=70-99"


def _curate(tmp_path, sources, eval_problems=(), **cfg):
    from rstar.data.curate import CurationConfig

    out = tmp_path / f"{len(list(tmp_path.iterdir()))}.parquet"
    report = curate(
        [SourceSpec.parse(s) for s in sources],
        str(out),
        str(tmp_path / f"rejects-{out.name}"),
        eval_problems=eval_problems,
        cfg=CurationConfig(**cfg),
    )
    return report, read_table(str(out), "problems").to_pylist()


def test_champ_integer_problems_and_the_report_per_source(tmp_path):
    report, kept = _curate(tmp_path, ["champ://", "reasoning-gym://gcd?n=20&seed=3"])
    champ = report.by_source["champ://"]
    # 270 problems, 79 with a plain integer answer (the rest are expressions such as 2^(n-1))
    assert (champ["read"], champ["kept"], champ["non_integer_answer"]) == (270, 79, 191)
    assert report.by_source["reasoning-gym://gcd?n=20&seed=3"]["read"] == 20
    assert report.kept == len(kept) == sum(c["kept"] for c in report.by_source.values())
    assert "champ://: read 270, kept 79 (dropped: non_integer_answer 191)" in report.format()
    row = next(r for r in kept if r["source"] == "champ://")
    assert row["id"].startswith("champ/") and json.loads(row["metadata"])["category"]
    # reported under a name MLflow takes in a metric key, not the URI
    assert {_benchmark(r) for r in kept} == {"champ", "gcd"}


def test_generators_are_seeded_and_hold_out_whole_templates(tmp_path):
    train = [r for _, r in packaged_rows(TRAIN)]
    assert train == [r for _, r in packaged_rows(TRAIN)]  # same URI, same problems
    assert train != [r for _, r in packaged_rows(TRAIN.replace("seed=0", "seed=1"))]
    held_out = [r for _, r in packaged_rows(HELD_OUT)]
    assert len(train) == 300 and len(held_out) == 60
    assert {r["template"] for r in train} <= set(range(70))
    assert {r["template"] for r in held_out} <= set(range(70, 100))
    assert not any(r["problem"].endswith(GSM_SUFFIX) for r in train + held_out)

    # held out by template, nothing is contaminated; drawn from every template, the 8-gram rule
    # finds the shared templates (it is live, and the template split is what passes it)
    eval_text = [r["problem"] for r in held_out]
    report, kept = _curate(tmp_path, [TRAIN], eval_problems=eval_text)
    assert report.dropped["contaminated"] == 0 and len(kept) > 290
    mixed = TRAIN.replace("&templates=0-69", "")
    report, _ = _curate(tmp_path, [mixed], eval_problems=eval_text)
    assert report.dropped["contaminated"] > 40


@pytest.mark.parametrize(
    ("uri", "says"),
    [
        ("reasoning-gym://gsm_symbolc?n=5", "no dataset 'gsm_symbolc'; did you mean gsm_symbolic"),
        ("reasoning-gym://gcd?seed=1", "say how many problems"),
        ("reasoning-gym://gcd?n=5&max_valu=9", "refused the config {'max_valu': 9}"),
        ("reasoning-gym://gcd?n=5&templates=1-3", "templates is an option of gsm_symbolic only"),
        ("reasoning-gym://gsm_symbolic?n=5&templates=32", "none of these templates"),
        ("champ://all", "CHAMP takes no path or options"),
    ],
)
def test_a_bad_uri_fails_the_recipe_naming_it(tmp_path, uri, says):
    with pytest.raises(DataError, match="^" + uri.replace("?", r"\?") + ": .*" + says[:20]):
        list(packaged_rows(uri))
    with pytest.raises(ConfigError) as e:
        load_recipe(
            "configs/tiny.yaml",
            {"train_problems.synthetic": None, "train_problems.files": [uri]},
        )
    assert "train_problems.files.0: " + uri in str(e.value) and says in str(e.value)


def test_held_out_integer_answers_on_request(tmp_path):
    recipe = load_recipe(
        "configs/tiny.yaml",
        {
            "storage_root": str(tmp_path / "root"),
            "train_problems.synthetic": None,
            "train_problems.files": ["reasoning-gym://gsm_symbolic?n=40&seed=0&templates=0-69"],
            "eval_problems.synthetic": None,
            "eval_problems.files": ["champ://", HELD_OUT],
            "eval_problems.integer_answers": True,
        },
    )
    out = problems(recipe, Layout(recipe.storage_root), StageInputs(), NullLog())
    held_out = read_table(out.datasets["eval"].uri, "problems").to_pylist()
    assert sum(r["source"] == "champ://" for r in held_out) == 79
    assert all(r["answer"].lstrip("-").isdigit() for r in held_out)
    assert out.metrics["train_problems"] == 40


def test_reading_a_table_then_exiting_does_not_abort(tmp_path):
    """pyarrow read through a Python file object left I/O threads that aborted the interpreter
    at exit once the heap was large (a CHAMP curation was enough)."""
    path = write_table(
        [{"id": "a", "problem": "p", "answer": "1", "source": "s", "metadata": "{}"}],
        str(tmp_path / "p.parquet"),
        "problems",
    )
    code = (
        "import sys\nheap = [{'a': str(i) * 20} for i in range(100000)]\n"
        f"from rstar.data.io import read_table\nread_table({path!r}, 'problems')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-500:]
