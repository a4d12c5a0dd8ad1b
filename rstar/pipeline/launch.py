"""Running a stage as a Ray job: a Ray task with the CPUs/GPUs its recipe asks for, on a local
Ray capped to this machine by default, or on the cluster named by `RAY_ADDRESS`.

Ray does not retry (max_retries=0): Prefect owns retries, and a retried stage resumes from
its own checkpoint. The worker records its PID beside the stage's working directory, so an
operator (or the fault test) can find and kill exactly that process.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, MutableMapping

from rstar.cluster import ensure_ray
from rstar.pipeline.config import Recipe
from rstar.pipeline.layout import Layout
from rstar.pipeline.records import StageInputs, StageOutput
from rstar.pipeline.stage_table import find

# Settings a stage takes from the machine that launches it: storage endpoints and credentials,
# MLflow settings, project settings, torch's kernel choice (ATEN_CPU_CAPABILITY). A local Ray
# started by this process runs on this machine: they go as they are now. A cluster's nodes keep
# their own (a pod's cache paths, secrets, endpoints are not overridden by a laptop's loopback
# MLflow and S3 addresses) and take the launcher's only where they have none (`fill_missing`:
# the local stack's Ray head was started before its settings were exported).
FORWARDED = ("RSTAR_", "AWS_", "MLFLOW_", "HF_", "ATEN_")


def launcher_env(environ: dict[str, str]) -> dict[str, str]:
    """The variables of `environ` offered to a stage."""
    return {k: v for k, v in environ.items() if k.startswith(FORWARDED)}


def fill_missing(offered: dict[str, str], environ: MutableMapping[str, str]) -> None:
    """In a stage's worker on a cluster: set what the launcher offered and the node lacks, keep
    the node's own."""
    for k, v in offered.items():
        environ.setdefault(k, v)


def run_job(
    stage: str,
    recipe: Recipe,
    inputs: StageInputs,
    tracking_uri: str,
    run_id: str,
    on_progress: Callable[[tuple], None] | None = None,
) -> StageOutput:
    """Run `stage` in a Ray worker and return its outputs (raises what the stage raised, or
    ray's error when the worker died). With `on_progress`, the worker's progress ticks
    (rstar.pipeline.progress) come to it, through a Ray queue, instead of being logged."""
    import ray

    ensure_ray(recipe.resources.cpus)
    missing = shortfall(stage, recipe, ray.nodes())
    if missing:  # Ray would otherwise wait for it without a word, for ever
        from rstar.errors import NotRetryable

        raise NotRetryable(missing)
    # a fresh worker process per stage (max_calls, which only ray.remote takes): one reused for
    # the next stage kept the last one's memory (the allocator does not give it back), and a
    # real model's rl3 and evaluation were killed by Ray at 21.5 GB beside it
    offered = launcher_env(dict(os.environ))
    joined = bool(os.environ.get("RAY_ADDRESS"))  # a cluster, not a local Ray of this process
    job = ray.remote(max_calls=1)(_job).options(
        num_cpus=driver_cpus(stage, recipe),
        num_gpus=driver_gpus(stage, recipe),
        max_retries=0,
        name=f"rstar:{stage}",
        **({} if joined else {"runtime_env": {"env_vars": offered}}),
    )
    from ray.util.queue import Queue

    # progress ticks come through a queue that takes no CPU from the stage it serves
    ticks = Queue(actor_options={"num_cpus": 0}) if on_progress else None
    ref = job.remote(stage, recipe, inputs, tracking_uri, run_id, ticks, offered if joined else {})

    def drain() -> None:
        for tick in ticks.get_nowait_batch(ticks.qsize()) if ticks else []:
            on_progress(tick)

    try:
        # polled, the waiting done by Python: a signal handler that raises (Prefect's, on a
        # cancel) inside ray.wait's own wait came out as a SystemError, which Prefect retried
        while not ray.wait([ref], timeout=0)[0]:
            drain()
            time.sleep(0.2)
        drain()
        return ray.get(ref)
    except BaseException:
        # cancelled, interrupted, or the wait itself failed: the worker stops too, or a retry
        # would run beside it in the same working directory
        ray.cancel(ref, force=True)
        raise
    finally:
        if ticks:
            ray.kill(ticks.actor)


# CPUs verl's resource pools hold for each GPU's process (RayResourcePool's max_colocate_count
# in verl's SFT trainer and in its PPO trainer): a node must have them beside its GPUs, or verl
# waits for its placement group for ever
VERL_CPUS_PER_GPU = {"sft": 10, "rl": 3}


def driver_cpus(stage: str, recipe: Recipe) -> float:
    """CPUs the stage's own Ray task holds: a stage verl trains only launches verl and merges
    its checkpoint, and holds one, so that verl's workers find theirs on the node it lands on
    (holding the recipe's 16 of a 90-CPU node left verl's SFT, 80 a node, no room there: it
    waited for ever); the others `resources.cpus`."""
    trains = recipe.engine == "verl" and find(recipe, stage).needs.trains
    return 1 if trains else recipe.resources.cpus


def driver_gpus(stage: str, recipe: Recipe) -> float:
    """GPUs the stage's own Ray task holds: with `engine: verl`, none. SFT and RL drivers only
    launch verl, which places its workers on the recipe's GPUs itself (held here, they would be
    missing there: 56 of 64 free on an 8x8 cluster); mining and evaluation serve the model from
    engine replicas, which hold them (stages.serving); the base is copied, the problems made,
    on CPUs."""
    return 0 if recipe.engine == "verl" else recipe.resources.gpus


def shortfall(stage: str, recipe: Recipe, nodes: list[dict]) -> str | None:
    """What the cluster (`ray.nodes()`) lacks for `stage`, in words, or None: CPUs and GPUs for
    the stage's own task, and for a verl stage on GPUs `resources.nodes` nodes with
    `resources.gpus` GPUs each (verl places its workers per node; mining and evaluation put one
    engine replica on each of those GPUs)."""
    alive = [n["Resources"] for n in nodes if n.get("Alive", True)]
    total = {k: sum(r.get(k, 0) for r in alive) for k in ("CPU", "GPU")}
    own = (("CPU", driver_cpus(stage, recipe)), ("GPU", driver_gpus(stage, recipe)))
    missing = [
        f"{need:g} {kind}s for its own task, the cluster has {total[kind]:g}"
        for kind, need in own
        if need > total[kind]
    ]
    stage_of = find(recipe, stage)
    needs = stage_of.needs
    if recipe.engine == "verl" and recipe.resources.gpus and (needs.trains or needs.serves):
        per_node, wanted = recipe.resources.gpus, recipe.resources.nodes
        fit = [r for r in alive if r.get("GPU", 0) >= per_node]
        cpus = per_node * VERL_CPUS_PER_GPU.get(stage_of.kind, 0)
        if len(fit) < wanted:
            missing.append(
                f"{wanted} nodes with {per_node:g} GPUs each for verl's workers, the cluster has "
                f"{len(fit)} ({total['GPU']:g} GPUs in all)"
            )
        elif needs.trains and sum(r.get("CPU", 0) >= cpus for r in fit) < wanted:
            missing.append(
                f"{cpus:g} CPUs on each of {wanted} GPU nodes for verl's workers "
                f"({VERL_CPUS_PER_GPU[stage_of.kind]} a GPU), "
                f"{sum(r.get('CPU', 0) >= cpus for r in fit)} nodes have them"
            )
    return f"stage {stage} needs " + "; ".join(missing) if missing else None


def pid_file(recipe: Recipe, stage: str) -> str:
    return Layout(recipe.storage_root).work(stage) + ".pid"


def _job(
    stage: str,
    recipe: Recipe,
    inputs: StageInputs,
    tracking_uri: str,
    run_id: str,
    ticks,
    offered: dict[str, str],
) -> StageOutput:
    fill_missing(offered, os.environ)  # before torch reads ATEN_CPU_CAPABILITY
    import torch
    from transformers.utils import logging as hf_logging

    from rstar.logs import configure
    from rstar.pipeline import progress, stages
    from rstar.storage import atomic_write_text
    from rstar.tracking.mlflow_log import StageLog

    configure()  # at the driver's level (RSTAR_LOG_LEVEL, offered) unless the node sets one
    torch.set_num_threads(max(1, int(recipe.resources.cpus)))
    # a "Loading weights" / "Writing model shards" bar per checkpoint is noise
    hf_logging.disable_progress_bar()
    atomic_write_text(pid_file(recipe, stage), str(os.getpid()))
    with progress.connected(ticks.put_nowait if ticks is not None else None):
        return stages.run(stage, recipe, inputs, StageLog(tracking_uri, run_id))
