import os
import shutil
import sys

import pytest

from rstar.sandbox.config import SandboxConfig
from rstar.sandbox.service import SandboxService


def _has_gpu() -> bool:
    return shutil.which("nvidia-smi") is not None and os.path.exists("/dev/nvidia0")


def pytest_collection_modifyitems(config, items):
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


_session = None


def pytest_sessionstart(session):
    global _session
    _session = session


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """End the test process without interpreter finalisation. Prefect, fsspec and Ray's gRPC
    leave daemon threads running; tearing their native state down under them segfaulted once
    in CI after every test had passed (exit 139 instead of 0). By now every fixture is torn
    down and pytest has reported, so nothing is left to flush but the streams."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(_session.exitstatus) if _session is not None else 0)


@pytest.fixture
def log_lines(monkeypatch):
    """rstar's log lines on stderr as the `rstar` command configures them (rstar.logs), undone
    after the test."""
    import logging

    from rstar.logs import LEVEL_ENV, configure

    logger = logging.getLogger("rstar")
    monkeypatch.setattr(logger, "handlers", [])
    monkeypatch.setattr(logger, "propagate", logger.propagate)
    monkeypatch.setattr(logger, "level", logger.level)
    monkeypatch.delenv(LEVEL_ENV, raising=False)
    configure("INFO")


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    from rstar.model.tiny import build_tiny

    return build_tiny(str(tmp_path_factory.mktemp("tiny")))


@pytest.fixture(scope="session")
def tokenizer(tiny_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_dir)


@pytest.fixture(scope="session")
async def agent_sandbox():
    cfg = SandboxConfig(
        lean_executors=1, warm_executors=1, slots_per_executor=4, uid_base=410_000, timeout_s=5
    )
    async with SandboxService(cfg) as sb:
        yield sb


@pytest.fixture(scope="session")
def s3(tmp_path_factory):
    """A real S3 API on loopback (moto's server) with one bucket; s3fs and boto3 find it
    through RSTAR_S3_ENDPOINT_URL and the usual AWS variables."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "RSTAR_S3_ENDPOINT_URL": f"http://{host}:{port}",
    }
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
