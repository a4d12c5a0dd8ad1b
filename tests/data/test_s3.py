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


def test_the_s3_fixture_leaves_no_credentials_behind():
    """Runs after the test above (file order): the fixture's endpoint and test credentials are
    gone, so no later test talks to moto (or to AWS with them) by accident."""
    import os

    assert "RSTAR_S3_ENDPOINT_URL" not in os.environ
    assert os.environ.get("AWS_ACCESS_KEY_ID") != "testing"
