"""A stage that asks for more than the cluster has fails at once, naming the shortfall, instead
of waiting for Ray to find resources that do not exist."""

import pytest

from rstar.errors import NotRetryable
from rstar.pipeline.config import load_recipe
from rstar.pipeline.launch import driver_cpus, run_job, shortfall


def cluster(gpu_nodes: int, gpus: int = 8) -> list[dict]:
    """`ray.nodes()` of infra/cluster/raycluster.yaml's cluster: a head that takes no work
    (num-cpus 0) and GPU workers."""
    head = {"Alive": True, "Resources": {"CPU": 0.0, "memory": 3e10}}
    workers = [
        {"Alive": True, "Resources": {"CPU": 96.0, "GPU": float(gpus), "memory": 1.6e12}}
        for _ in range(gpu_nodes)
    ]
    # a dead node counts for nothing
    return [head, *workers, {"Alive": False, "Resources": {"CPU": 96.0, "GPU": 8.0}}]


def test_the_14b_recipe_on_a_cluster_one_node_short():
    recipe = load_recipe("configs/qwen3-14b.yaml", check_inputs=False)
    for stage in ("sft", "rl1", "mine", "evaluate"):
        assert shortfall(stage, recipe, cluster(7)) == (
            f"stage {stage} needs 8 nodes with 8 GPUs each for verl's workers, the cluster has 7 "
            "(56 GPUs in all)"
        )
        assert shortfall(stage, recipe, cluster(8)) is None
    # 64 GPUs, but in nodes of 4: verl's per-node placement cannot use them
    assert "the cluster has 0 (64 GPUs in all)" in shortfall("rl2", recipe, cluster(16, gpus=4))
    # verl's SFT holds 10 CPUs a GPU on every node, its PPO trainer 3: nodes of 64 CPUs fit RL
    # only; the stage's own task holds one CPU (the recipe's 16 left SFT no room beside it)
    lean = [{**n, "Resources": {**n["Resources"], "CPU": 64.0}} for n in cluster(8)]
    assert shortfall("sft", recipe, lean) == (
        "stage sft needs 80 CPUs on each of 8 GPU nodes for verl's workers (10 a GPU), "
        "0 nodes have them"
    )
    assert shortfall("rl1", recipe, lean) is None and shortfall("mine", recipe, lean) is None
    assert driver_cpus("sft", recipe) == driver_cpus("rl1", recipe) == 1
    assert driver_cpus("mine", recipe) == 16
    assert shortfall("problems", recipe, cluster(1)) is None  # made on CPUs
    assert (
        shortfall("problems", recipe, cluster(0))
        == "stage problems needs 16 CPUs for its own task, the cluster has 0"
    )


def test_a_stage_asking_for_a_gpu_this_machine_lacks_fails_at_once():
    recipe = load_recipe("configs/tiny.yaml", {"resources.gpus": 1})
    with pytest.raises(
        NotRetryable, match="stage problems needs 1 GPUs for its own task, the cluster has 0"
    ):
        run_job("problems", recipe, {}, "sqlite:///unused.db", "no-run")


def test_each_stage_runs_in_a_worker_process_of_its_own(tmp_path):
    """A worker reused for the next stage kept the last stage's memory (Ray then killed a real
    model's evaluation beside its RL stage's 18 GB)."""
    import ray

    from rstar.pipeline.launch import pid_file
    from rstar.pipeline.records import StageInputs
    from rstar.tracking import mlflow_log as ml

    recipe = load_recipe(
        "configs/tiny.yaml",
        {
            "storage_root": str(tmp_path / "root"),
            "tracking.tracking_uri": f"sqlite:///{tmp_path}/mlruns.db",
        },
    )
    uri = recipe.tracking.tracking_uri
    pids = []
    try:
        for _ in range(2):
            run_job("problems", recipe, StageInputs(), uri, ml.start_run(uri, "pids", "problems"))
            with open(pid_file(recipe, "problems")) as f:
                pids.append(f.read())
    finally:
        ray.shutdown()
    assert pids[0] != pids[1]


def test_a_stage_gets_the_launchers_settings_only_where_its_node_has_none():
    """A pod's own storage, MLflow and cache settings win over the launching machine's (a
    laptop's loopback MLflow URL on a GPU pod); what the node lacks (a Ray head started before
    the local stack's settings were exported) comes from the launcher. Checked on a dict: on
    os.environ, a variable set here would reach every later test's subprocesses (it did:
    ATEN_CPU_CAPABILITY=avx2 made vLLM's CPU build sample garbage in the verl tests)."""
    from rstar.pipeline.launch import fill_missing, launcher_env

    here = {
        "MLFLOW_TRACKING_URI": "http://127.0.0.1:5000",
        "RSTAR_S3_ENDPOINT_URL": "http://127.0.0.1:9000",
        "ATEN_CPU_CAPABILITY": "avx2",
        "PATH": "/usr/bin",
    }
    offered = launcher_env(here)
    assert offered == {k: v for k, v in here.items() if k != "PATH"}
    node = {"MLFLOW_TRACKING_URI": "http://mlflow.pod:5000", "PATH": "/bin"}
    fill_missing(offered, node)
    assert node == {
        "MLFLOW_TRACKING_URI": "http://mlflow.pod:5000",
        "RSTAR_S3_ENDPOINT_URL": "http://127.0.0.1:9000",
        "ATEN_CPU_CAPABILITY": "avx2",
        "PATH": "/bin",
    }
