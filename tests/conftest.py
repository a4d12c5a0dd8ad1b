import os
import shutil

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
    cfg = SandboxConfig(lean_executors=1, warm_executors=1, slots_per_executor=4, uid_base=410_000, timeout_s=5)
    async with SandboxService(cfg) as sb:
        yield sb
