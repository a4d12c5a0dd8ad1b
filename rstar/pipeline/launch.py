"""Running a stage as a Ray job: a Ray task with the CPUs/GPUs its recipe asks for, on a local
Ray capped to this machine by default, or on the cluster named by `RAY_ADDRESS`.

Ray does not retry (max_retries=0): Prefect owns retries, and a retried stage resumes from
its own checkpoint. The worker records its PID beside the stage's working directory, so an
operator (or the fault test) can find and kill exactly that process.
"""
from __future__ import annotations

import os

from rstar.pipeline.config import Recipe

# Environment a stage needs on whatever node runs it: storage endpoints and credentials,
# MLflow settings, project settings, torch's kernel choice (ATEN_CPU_CAPABILITY).
FORWARDED = ("RSTAR_", "AWS_", "MLFLOW_", "HF_", "ATEN_")


def ensure_ray(cpus: float, object_store_mb: int = 256) -> None:
    import ray

    if ray.is_initialized():
        return
    address = os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=True)
        return
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # a local Ray binds to loopback only
    ray.init(num_cpus=max(1, int(cpus)), object_store_memory=object_store_mb * 1024 * 1024,
             include_dashboard=False, log_to_driver=True)


def run_job(stage: str, recipe: Recipe, inputs: dict, tracking_uri: str, run_id: str) -> dict:
    """Run `stage` in a Ray worker and return its outputs (raises what the stage raised, or
    ray's error when the worker died)."""
    import ray

    ensure_ray(recipe.resources.cpus)
    env = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED)}
    job = ray.remote(_job).options(num_cpus=recipe.resources.cpus, num_gpus=driver_gpus(stage, recipe), max_retries=0,
                                   runtime_env={"env_vars": env}, name=f"rstar:{stage}")
    return ray.get(job.remote(stage, recipe, inputs, tracking_uri, run_id))


def driver_gpus(stage: str, recipe: Recipe) -> float:
    """GPUs the stage's own Ray task holds: none for a verl stage, whose driver only launches
    verl, which places its workers on the recipe's GPUs itself (held here, they would be
    missing there: 56 of 64 free on an 8x8 cluster); none for mining and evaluation, whose
    engine replicas hold them."""
    if recipe.engine == "verl" and stage in {s.name for s in recipe.rl} | {"mine", "evaluate"}:
        return 0  # mining and evaluation serve the model from engine replicas (stages.serving)
    return recipe.resources.gpus


def pid_file(recipe: Recipe, stage: str) -> str:
    from rstar.pipeline.stages import Layout

    return Layout(recipe.storage_root).work(stage) + ".pid"


def _job(stage: str, recipe: Recipe, inputs: dict, tracking_uri: str, run_id: str) -> dict:
    import torch

    from rstar.pipeline import stages
    from rstar.storage import atomic_write_text
    from rstar.tracking.mlflow_log import StageLog

    from transformers.utils import logging as hf_logging

    torch.set_num_threads(max(1, int(recipe.resources.cpus)))
    hf_logging.disable_progress_bar()  # a "Loading weights" / "Writing model shards" bar per checkpoint is noise
    atomic_write_text(pid_file(recipe, stage), str(os.getpid()))
    return stages.run(stage, recipe, inputs, StageLog(tracking_uri, run_id))
