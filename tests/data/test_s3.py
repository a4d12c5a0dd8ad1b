"""Parquet to and from S3 through s3fs, against a real S3 API on loopback (moto's server)."""

import pytest

from rstar.data import synth
from rstar.data.io import DataError, read_table, write_table


def test_parquet_round_trip_on_s3(s3):
    rows = synth.generate(20, seed=9)
    uri = f"{s3}/datasets/train.parquet"
    write_table(rows, uri, "problems")
    assert read_table(uri, "problems").to_pylist() == rows
    write_table(rows[:5], uri, "problems")  # replaced whole
    assert len(read_table(uri, "problems")) == 5
    with pytest.raises(DataError, match="no such file"):
        read_table(f"{s3}/datasets/missing.parquet", "problems")
    with pytest.raises(DataError, match="expected a 'rejects' file"):
        read_table(uri, "rejects")


def test_every_input_file_a_recipe_names_is_read_from_s3(s3):
    """The 14B recipe's inputs in their layouts on S3 (rstar.pipeline.rehearsal_inputs):
    curation reads its Parquet and JSON-lines sources (JSON lines were read from local disk
    only), the benchmarks and the SFT chats load."""
    from rstar.data.curate import SourceSpec, curate
    from rstar.data.sft import load_sft
    from rstar.eval.benchmarks import load_benchmark
    from rstar.pipeline.config import load_recipe
    from rstar.pipeline.rehearsal_inputs import write_inputs

    recipe = load_recipe("configs/qwen3-14b.yaml", check_inputs=False)
    moved = {"s3://rstar/raw/": f"{s3}/raw/"}

    def here(uri: str) -> str:
        return next((uri.replace(a, b) for a, b in moved.items() if uri.startswith(a)), uri)

    recipe.train_problems.files = [here(t) for t in recipe.train_problems.files]
    recipe.eval_problems.benchmarks = {
        k: here(v) for k, v in recipe.eval_problems.benchmarks.items()
    }
    recipe.sft.files = [here(u) for u in recipe.sft.files]
    written = write_inputs(recipe, per_file=6, held_out=2, chats=3)
    assert len(written) == 3 + 5 + 3 and all(u.startswith(s3) for u in written)
    held = [
        p["problem"]
        for n, u in recipe.eval_problems.benchmarks.items()
        for p in load_benchmark(n, u)
    ]
    report = curate(
        [SourceSpec.parse(t) for t in recipe.train_problems.files],
        f"{s3}/k.parquet",
        f"{s3}/r.parquet",
        eval_problems=held,
    )
    assert {src.rsplit("/", 1)[1]: n["read"] for src, n in report.by_source.items()} == {
        "dapo_math_17k.parquet": 6,
        "openmathreasoning_aops.parquet": 6,
        "project_euler.jsonl": 6,
    }
    assert report.dropped["contaminated"] == 0 and len(held) == 10
    assert [len(load_sft(u)) for u in recipe.sft.files] == [3, 3, 3]


def test_the_s3_fixture_leaves_no_credentials_behind():
    """Runs after the test above (file order): the fixture's endpoint and test credentials are
    gone, so no later test talks to moto (or to AWS with them) by accident."""
    import os

    assert "RSTAR_S3_ENDPOINT_URL" not in os.environ
    assert os.environ.get("AWS_ACCESS_KEY_ID") != "testing"
