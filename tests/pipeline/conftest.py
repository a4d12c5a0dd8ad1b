"""A reduced tiny recipe and a Prefect API for the pipeline tests.

The recipe keeps every stage and every mechanism of configs/tiny.yaml (pretraining, SFT,
three RL stages with RoC, mining, evaluation) at sizes that run in about a minute here."""

import os

import pytest
import yaml

from rstar.environment import apply_defaults

# the Prefect/Ray environment defaults, before Prefect loads, as every entry point sets them
apply_defaults()

SMALL = {
    "base.shipped": None,  # the shipped base is of tiny.yaml's size: pretrain a small one
    "base.hidden": 32,
    "base.layers": 1,
    "base.pretrain_steps": 3,
    "base.pretrain_batch": 4,
    "base.pretrain_seq_len": 32,
    "train_problems.synthetic.n": 12,
    "eval_problems.synthetic.n": 3,
    "sft.examples": 8,
    "sft.train.batch_size": 4,
    "sft.train.micro_batch_size": 4,
    "rl.0.steps": 3,
    "rl.1.steps": 1,
    "rl.2.steps": 1,
    **{f"rl.{i}.prompts_per_step": 2 for i in range(3)},
    **{f"rl.{i}.roc.group_size": 2 for i in range(3)},
    **{f"rl.{i}.max_response_tokens": 24 for i in range(3)},
    "mine.k": 2,
    "mine.problems": 4,
    "mine.max_response_tokens": 24,
    "eval.k": 1,
    "eval.max_response_tokens": 24,
    "retries.count": 2,
    "retries.delay_s": 0,
}


def write_recipe(directory, name: str, storage_root: str) -> str:
    """A recipe file: configs/tiny.yaml with SMALL applied, its own storage and MLflow store."""
    from rstar.pipeline.config import load_recipe

    recipe = load_recipe(
        "configs/tiny.yaml",
        {
            **SMALL,
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
def finished_local(prefect_api, tmp_path_factory):
    """The reduced pipeline run once on local storage: (recipe path, flow-run state, outputs)."""
    from flows.pipeline import pipeline

    d = tmp_path_factory.mktemp("pipeline-local")
    path = write_recipe(str(d), "local", str(d / "root"))
    state = pipeline(path, return_state=True)
    return path, state, state.result()
