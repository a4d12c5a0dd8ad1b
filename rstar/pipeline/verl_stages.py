"""SFT and RL on the cluster path (`engine: verl`): verl's own trainers, launched as a command
from the stage's Ray worker, then their last FSDP checkpoint merged into a Hugging Face
directory by verl's model merger. verl resumes from its own checkpoints after a retry.

On GPUs verl joins the Ray cluster the stage runs on and places its workers on the recipe's
GPUs; with `resources.gpus: 0` the same trainers run on this machine's CPU (verl's plug-in
platform, rstar.train.verl_cpu), for CI and for trying the cluster path on a laptop.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
from dataclasses import replace
from pathlib import Path

from rstar.pipeline import cache
from rstar.pipeline.config import Recipe
from rstar.pipeline.layout import Layout
from rstar.pipeline.records import StageInputs
from rstar.storage import dirs, filesystem, remove_tree
from rstar.train.hydra_override import value as hydra_value

logger = logging.getLogger(__name__)
# In a verl stage's published model: where its last actor checkpoint (optimizer state) lies.
VERL_CHECKPOINT = "verl_actor_checkpoint.txt"
# In a verl stage's working directory and MLflow run: the command it ran, as a JSON list.
COMMAND_FILE = "verl_command.json"


def device(recipe: Recipe) -> str:
    """Where verl runs a stage: on the recipe's GPUs, or on the CPU (`resources.gpus: 0`, or a
    rehearsal's CPU ranks)."""
    return "gpu" if recipe.resources.gpus and not recipe.rehearsal else "cpu"


def joins_cluster(recipe: Recipe) -> bool:
    """Whether verl joins the Ray cluster the stage runs on (GPUs, or a rehearsal's CPU ranks)
    rather than starting a Ray of its own on this machine's CPU."""
    return bool(recipe.resources.gpus)


def gpus_per_node(recipe: Recipe) -> int:
    """verl's `n_gpus_per_node`: the recipe's GPUs (a rehearsal's ranks), or on the CPU one
    training slot."""
    return int(recipe.resources.gpus) or 1


def _rehearsed(recipe: Recipe):
    """The recipe a rehearsal stands for (its `rehearsal.plan`, with its overrides)."""
    from rstar.pipeline.config import load_recipe

    return load_recipe(
        recipe.rehearsal.plan, recipe.rehearsal.plan_overrides or None, check_inputs=False
    )


def _shape(recipe: Recipe, stage: str):
    from rstar.errors import NotRetryable
    from rstar.train.gpu_sizing import ModelShape

    shape = ModelShape.of(recipe.base.path or "")
    if shape is None:
        raise NotRetryable(
            f"cannot size stage {stage}'s GPU settings: base {recipe.base.path!r} is neither a "
            "directory with a config.json nor a model rstar.train.gpu_sizing knows"
        )
    return shape


def gpu_settings(recipe: Recipe, rl, prompt_tokens: int):
    """The GPU settings an RL stage gets (rstar.train.gpu_sizing), for the recipe's base model
    (what `rstar pipeline plan` shows before any model exists); None on the CPU."""
    from rstar.train.gpu_sizing import size

    if recipe.rehearsal:  # the plan's settings for its stage of that name, on the ranks here
        plan = _rehearsed(recipe)
        planned = next(s for s in plan.rl if s.name == rl.name)
        return gpu_settings(plan, planned, prompt_tokens).on_ranks(
            gpus_per_node(recipe), recipe.resources.nodes, recipe.rehearsal.agent_workers
        )
    if device(recipe) == "cpu":
        return None
    per_node = gpus_per_node(recipe)
    return size(
        _shape(recipe, rl.name),
        recipe.resources.gpu_memory_gb,
        per_node * recipe.resources.nodes,
        prompt_tokens,
        rl.sampling.max_response_tokens,
        # the rollouts an update trains on: what RoC keeps, in PPO mini-batches
        rl.prompts_per_step * rl.roc.group_size // rl.mini_batches,
        per_node,
    )


def sft_gpu_settings(recipe: Recipe):
    """The GPU settings of verl's SFT (rstar.train.gpu_sizing.size_sft); None on the CPU."""
    from rstar.train.gpu_sizing import size_sft

    if recipe.rehearsal:
        return sft_gpu_settings(_rehearsed(recipe)).on_ranks(
            gpus_per_node(recipe), recipe.resources.nodes
        )
    if device(recipe) == "cpu":
        return None
    per_node = gpus_per_node(recipe)
    return size_sft(
        _shape(recipe, "sft"),
        recipe.resources.gpu_memory_gb,
        per_node * recipe.resources.nodes,
        recipe.sft.train.max_length,
        recipe.sft.train.batch_size,
        per_node,
    )


def sft_command(recipe: Recipe, model: str, data: str, work: str) -> list[str]:
    """The command of verl's Ray SFT trainer (rstar.train.verl_sft) for the recipe's SFT, from
    the model in `model` on the chats in `data`, checkpoints in `work`."""
    from rstar.train.verl_sft import sft_command

    return sft_command(
        replace(recipe.sft.train, prompt_style=recipe.prompt_style),
        model=model,
        train_files=data,
        out_dir=work,
        n_gpus=gpus_per_node(recipe),
        nodes=recipe.resources.nodes,
        experiment=recipe.tracking.experiment,
        device=device(recipe),
        gpu=sft_gpu_settings(recipe),
    )


def sft(recipe: Recipe, inputs: StageInputs, log, data: str) -> str:
    """verl's Ray SFT trainer on the chats in `data`; returns the merged model's directory. verl
    resumes from its checkpoint of the last finished epoch."""
    from rstar.train.verl_sft import last_checkpoint

    work, _ = cache.work_dir(recipe, "sft", inputs)
    os.makedirs(work, exist_ok=True)
    cmd = sft_command(recipe, dirs.pull(inputs.model.uri), data, work)
    # its workers, on a cluster, see only what Ray's job carries (as the RL stages' do)
    cmd += ray_job_env({**job_env(recipe), **mlflow_env(log)})
    return _run(cmd, "sft", log, work, recipe, lambda: last_checkpoint(work))


def rl(recipe: Recipe, inputs: StageInputs, log, cfg, work: str) -> str:
    """verl's trainer with this project's agent loop, tool, reward and RoC (FSDP actor, vLLM
    rollouts; on the CPU one training process and the HF engine as rollout); returns the merged
    model's directory, which names its actor checkpoint for the next stage's optimizer state."""
    import contextlib

    from rstar.sandbox.client import check_health
    from rstar.sandbox.process import SandboxProcess
    from rstar.train.verl_launcher import build_verl_run

    with contextlib.ExitStack() as stack:
        # on the CPU without a sandbox service named, one of its own for this stage (loopback only)
        sandbox_url = recipe.sandbox_url or stack.enter_context(SandboxProcess()).url
        # a sandbox that does not answer would turn every tool call into an error and train on that
        check_health(sandbox_url)
        held_out = Layout(recipe.storage_root).dataset("eval_problems")
        fs, path = filesystem(held_out)
        model = dirs.pull(inputs.model.uri)
        # the previous verl stage's optimizer state, which this one carries over unless it resets
        pointer = os.path.join(model, VERL_CHECKPOINT)
        optimizer_from = Path(pointer).read_text().strip() if os.path.exists(pointer) else None
        trajectories = Layout(recipe.storage_root).trajectories(cfg.name)
        if not os.path.exists(os.path.join(work, "latest_checkpointed_iteration.txt")):
            remove_tree(trajectories)  # a fresh start (verl resumes otherwise): other runs' files
        cmd = build_verl_run(
            replace(cfg, prompt_style=recipe.prompt_style),
            model=model,
            problems=inputs.problems.uri,
            sandbox_url=sandbox_url,
            out_dir=work,
            n_gpus=gpus_per_node(recipe),
            nodes=recipe.resources.nodes,
            val_problems=held_out if fs.exists(path) else None,
            experiment=recipe.tracking.experiment,
            optimizer_from=optimizer_from,
            trajectories=trajectories,
            device=device(recipe),
            gpu=lambda prompt_tokens: gpu_settings(recipe, cfg, prompt_tokens),
        )
        # on a cluster the job's processes see only what Ray's job carries
        cmd += ray_job_env({**job_env(recipe), **mlflow_env(log)})
        actor = os.path.join(work, f"global_step_{cfg.steps}", "actor")
        merged = _run(cmd, cfg.name, log, work, recipe, lambda: actor)
    with open(os.path.join(merged, VERL_CHECKPOINT), "w") as f:
        f.write(actor)
    return merged


def job_env(recipe: Recipe) -> dict[str, str]:
    """What every verl process needs in its environment (rstar.train.verl_launcher.verl_env):
    the project's modules and, on CPU ranks, the platform and its threads."""
    from rstar.train.verl_launcher import verl_env

    threads = recipe.rehearsal.threads if recipe.rehearsal else int(recipe.resources.cpus)
    return verl_env(device(recipe), threads)


def mlflow_env(log) -> dict[str, str]:
    """What makes verl's MLflow logger write into this stage's run, beside the pipeline's own
    metrics (none without a run)."""
    run_id = getattr(log, "run_id", None)
    return {"MLFLOW_TRACKING_URI": log.tracking_uri, "MLFLOW_RUN_ID": run_id} if run_id else {}


def ray_job_env(env: dict[str, str]) -> list[str]:
    """Hydra overrides that put `env` into the Ray job verl starts or joins. verl's logger runs
    in its task-runner actor; on a cluster started apart (`ray start`) actors do not inherit the
    launching process's environment, and verl forwards only its own list of variables."""
    return [
        f"++ray_kwargs.ray_init.runtime_env.env_vars.{k}={hydra_value(v)}" for k, v in env.items()
    ]


def _run(cmd: list[str], stage: str, log, work: str, recipe: Recipe, checkpoint) -> str:
    """Run a verl command for `stage` in its work directory, then merge the FSDP checkpoint
    `checkpoint()` names into `work/hf` with verl's model merger; return that directory."""
    from rstar.train.verl_launcher import merge_command

    log.tag("rstar.verl_command", " ".join(cmd)[:5000])
    # whole, for what compares it with the plan's line (rstar.pipeline.rehearsal)
    command_file = os.path.join(work, COMMAND_FILE)
    with open(command_file, "w") as f:
        json.dump(cmd, f)
    log.artifact(command_file)
    logger.info("[%s] verl (%s): %s ...", stage, device(recipe), " ".join(cmd[:3]))
    # on the CPU: torch threads per training process, which Ray would otherwise start with one
    env = {**os.environ, **job_env(recipe), **mlflow_env(log)}
    if not joins_cluster(recipe):
        # verl alone on the CPU starts a Ray of its own, with its training slots
        env.pop("RAY_ADDRESS", None)
    else:  # verl joins the Ray this stage runs on (the cluster), where its GPUs (ranks) are
        import ray

        if ray.is_initialized():
            env.setdefault("RAY_ADDRESS", ray.get_runtime_context().gcs_address)
    # Hydra's outputs/ land in the work directory
    subprocess.run(cmd, check=True, env=env, cwd=work)
    merged = os.path.join(work, "hf")
    subprocess.run(merge_command(checkpoint(), merged), check=True, env=env)
    return merged
