"""Parquet to and from S3 through s3fs, against a real S3 API on loopback (moto's server)."""
import os

import pytest

from rstar.data import synth
from rstar.data.io import DataError, read_table, write_table


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "RSTAR_S3_ENDPOINT_URL": f"http://{host}:{port}"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    import boto3

    boto3.client("s3", endpoint_url=env["RSTAR_S3_ENDPOINT_URL"]).create_bucket(Bucket="rstar-test")
    yield "s3://rstar-test"
    server.stop()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


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
