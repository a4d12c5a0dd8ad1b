"""A reduced tiny recipe and a Prefect API for the pipeline tests.

The recipe keeps every stage and every mechanism of configs/tiny.yaml (a shipped base, SFT,
three RL stages with RoC, mining, evaluation) at sizes that run in about a minute here. Its RL
stages earn reward: the base is the session's SFT model (`tiny_sft`, presented as a shipped
base with its manifest, `shipped_sft`), and the problems are ones it solves about half the time
(`product_problems`, curated from JSONL files like any user's). So rl1 moves the weights, and a
resume that lost them, or AdamW's moments, shows in what follows."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

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
    **{f"rl.{i}.sampling.max_response_tokens": 96 for i in range(3)},
    **{f"rl.{i}.lr": 1.0e-4 for i in range(3)},
    "mine.k": 2,
    "mine.problems": 4,
    "mine.sampling.max_response_tokens": 96,
    "eval.k": 1,
    "eval.sampling.max_response_tokens": 96,
    "expect.stage_for": {"rl2": {}},  # judged on every held-out question: the wiring shows
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


# -- services as a user runs them: a Prefect server and `rstar serve` ---------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(url: str, proc: subprocess.Popen, what: str, timeout_s: float = 180) -> None:
    """Until `url` answers 200; an error naming `what` if its process ends or time runs out."""
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: {url} did not answer within {timeout_s:.0f} s")
        time.sleep(1)


def prefect_call(api: str, path: str, body: dict | None = None, tries: int = 6):
    """One Prefect REST call (POST when there is a body). A 503 is the server's "SQLite was busy,
    try again" (prefect/server/api/server.py), which Prefect's own client retries; so do we, with
    the same kind of backoff, a bounded number of times."""
    data = None if body is None else json.dumps(body).encode()
    for attempt in range(tries):
        req = urllib.request.Request(
            f"{api}{path}", data=data, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return json.load(r)
        except urllib.error.HTTPError as e:
            if e.code != 503 or attempt == tries - 1:
                raise
        time.sleep(2**attempt)


def until(what: str, check, timeout_s: float):
    """`check()`'s first truthy answer, polled; a TimeoutError naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not (found := check()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout_s:.0f} s")
        time.sleep(0.5)
    return found


def final_flow_run_state(api: str, run_id: str, timeout_s: float) -> dict:
    """The flow run's state once it is final (Prefect's terminal types: a custom name such as
    "Did not learn" has one of them), through the REST API."""
    from prefect.client.schemas.objects import TERMINAL_STATES

    def final():
        state = prefect_call(api, f"/flow_runs/{run_id}")["state"]
        return state if state["type"] in TERMINAL_STATES else None

    return until(f"a final state of flow run {run_id}", final, timeout_s)


@pytest.fixture
def services(tmp_path):
    """Start processes in their own sessions (`<name>.log` in tmp_path); stop exactly those at
    the end."""
    started: list[subprocess.Popen] = []

    def start(args: list[str], env: dict, name: str) -> subprocess.Popen:
        with open(tmp_path / f"{name}.log", "w") as log:  # the child keeps its own copy
            proc = subprocess.Popen(
                args, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in started:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def prefect_services(services, recipe: str, name: str, home) -> tuple[int, dict]:
    """A Prefect server on a free loopback port and `rstar serve --config recipe --name name`
    registered with it, Prefect's home under `home`: (port, the environment to talk to them)."""
    bin_dir = os.path.dirname(sys.executable)
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_API_URL": api,
        "PREFECT_UI_API_URL": api,  # what the UI's pages call (its default is port 4200)
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    }
    server = services(
        [f"{bin_dir}/prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env,
        "prefect-server",
    )
    wait_for(f"{api}/health", server, "prefect server")
    serve = services(
        [sys.executable, "-m", "flows.cli", "serve", "--config", recipe, "--name", name],
        env,
        "rstar-serve",
    )
    wait_for(f"{api}/deployments/name/rstar-pipeline/{name}", serve, "rstar serve")
    return port, env
