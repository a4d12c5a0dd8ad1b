"""A reduced tiny recipe and a Prefect API for the pipeline tests.

The recipe keeps every stage and every mechanism of configs/tiny.yaml (a shipped base, SFT,
three RL stages with RoC, mining, evaluation) at sizes that run in about a minute here. Its RL
stages earn reward: the base is the session's SFT model (`tiny_sft`, presented as a shipped
base with its manifest, `shipped_sft`), and the problems are ones it solves about half the time
(`product_problems`, curated from JSONL files like any user's). So rl1 moves the weights, and a
resume that lost them, or AdamW's moments, shows in what follows."""

import os

import pytest
import yaml

from rstar.environment import apply_defaults
from tests.conftest import product_problems

# the Prefect/Ray environment defaults, before Prefect loads, as every entry point sets them
apply_defaults()

SMALL = {
    "sft.examples": 8,
    "sft.train.batch_size": 4,
    "sft.train.micro_batch_size": 4,
    "sft.train.lr": 1.0e-6,  # the base is already the SFT model: the stage runs, changes little
    "sft.train.epochs": 1,
    "rl.0.steps": 3,
    "rl.1.steps": 1,
    "rl.2.steps": 1,
    **{f"rl.{i}.prompts_per_step": 2 for i in range(3)},
    **{f"rl.{i}.roc.group_size": 2 for i in range(3)},
    **{f"rl.{i}.max_response_tokens": 96 for i in range(3)},
    **{f"rl.{i}.lr": 1.0e-4 for i in range(3)},
    "mine.k": 2,
    "mine.problems": 4,
    "mine.max_response_tokens": 96,
    "eval.k": 1,
    "eval.max_response_tokens": 96,
    "retries.count": 2,
    "retries.delay_s": 0,
}


def write_recipe(directory, name: str, storage_root: str, base: str | None = None) -> str:
    """A recipe file: configs/tiny.yaml with SMALL applied, its own problem files, storage and
    MLflow store. `base`: the shipped base to start from (`shipped_sft`, for a recipe that
    runs); without it, tiny.yaml's (for tests that stop before the base stage)."""
    import json

    from rstar.pipeline.config import load_recipe

    files = {}
    for split, (n, seed) in {"train": (12, 11), "eval": (3, 12)}.items():
        files[split] = os.path.join(directory, f"{name}-{split}.jsonl")
        with open(files[split], "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in product_problems(n, seed))
    recipe = load_recipe(
        "configs/tiny.yaml",
        {
            **SMALL,
            **({"base.shipped": base} if base else {}),
            "train_problems.synthetic": None,
            "train_problems.files": [files["train"]],
            "eval_problems.synthetic": None,
            "eval_problems.files": [files["eval"]],
            "name": name,
            "storage_root": storage_root,
            "tracking.tracking_uri": f"sqlite:///{directory}/mlflow.db",
            "tracking.registered_model": f"rstar-{name}",
        },
    )
    path = os.path.join(directory, f"{name}.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(recipe.model_dump(mode="json"), f)
    return path


@pytest.fixture(scope="session")
def shipped_sft(tiny_sft, tmp_path_factory):
    """The session's SFT model as a shipped base: tiny.yaml's base spec, its own digest."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rstar.model.shipped import write_shipped
    from rstar.pipeline.config import load_recipe

    out = str(tmp_path_factory.mktemp("shipped-sft") / "base")
    write_shipped(
        AutoModelForCausalLM.from_pretrained(tiny_sft, dtype=torch.float32),
        AutoTokenizer.from_pretrained(tiny_sft),
        load_recipe("configs/tiny.yaml").base,
        out,
        seconds=0.0,
        metrics={},
        rebuild="the tests' tiny_sft fixture (tests/conftest.py)",
    )
    return out


@pytest.fixture(scope="session", autouse=True)
def _own_mirror_cache(tmp_path_factory):
    """Local mirrors of remote storage in this session's own directory."""
    saved = os.environ.get("RSTAR_CACHE")
    os.environ["RSTAR_CACHE"] = str(tmp_path_factory.mktemp("rstar-cache"))
    yield
    if saved is None:
        os.environ.pop("RSTAR_CACHE")
    else:
        os.environ["RSTAR_CACHE"] = saved


@pytest.fixture(scope="session")
def prefect_api():
    """A Prefect API server on loopback (Prefect's own test harness), for this session."""
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield PREFECT_API_URL.value()


@pytest.fixture(scope="session")
def finished_local(prefect_api, shipped_sft, tmp_path_factory):
    """The reduced pipeline run once on local storage: (recipe path, flow-run state, outputs)."""
    from flows.pipeline import pipeline

    d = tmp_path_factory.mktemp("pipeline-local")
    path = write_recipe(str(d), "local", str(d / "root"), shipped_sft)
    state = pipeline(path, return_state=True)
    return path, state, state.result()
