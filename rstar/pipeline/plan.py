"""`rstar pipeline plan`: what each stage of a recipe will run, checked, without running it.

For every stage, in the order the pipeline runs them: its engine, the Ray job's resources and,
for a stage on verl, the full command: `python -m rstar.train.verl_trainer` (verl's main_ppo with
RoC) for an RL stage, verl's SFT trainer for SFT. Each is composed with verl's own Hydra schema
and put through the checks verl's entry point runs before it starts Ray, so a recipe that verl
would refuse fails here, naming the stage and verl's message, instead of minutes into a cluster
run.
"""

from __future__ import annotations

import contextlib
import os
import sys

from rstar.errors import NotRetryable
from rstar.pipeline import verl_stages
from rstar.pipeline.config import Recipe
from rstar.pipeline.layout import Layout
from rstar.pipeline.stage_table import Stage, recipe_stages
from rstar.storage import dirs
from rstar.train.verl_launcher import DEFAULT_PROMPT_TOKENS


class PlanError(NotRetryable, ValueError):
    """A stage verl would refuse; the message names the stage and what verl said."""


def compose_verl(overrides: list[str], config_name: str = "ppo_trainer"):
    """verl's `config_name` config (ppo_trainer, sft_trainer_engine) with `overrides`, as its
    entry point composes it."""
    import verl
    from hydra import compose, initialize_config_dir

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(config_name=config_name, overrides=overrides)


def check_verl(overrides: list[str]):
    """Compose and validate as main_ppo does before Ray starts; returns the config."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    cfg = compose_verl(overrides)
    with contextlib.redirect_stdout(sys.stderr):  # verl prints its verdict; stdout may be --json
        validate_config(
            cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg)
        )
    return cfg


def check_verl_sft(overrides: list[str]):
    """Compose verl's SFT config and build its engine, optimizer and checkpoint configs as its
    trainer does first (the model's is built from the model itself, at run time); returns it."""
    from verl.utils.config import omega_conf_to_dataclass

    cfg = compose_verl(overrides, "sft_trainer_engine")
    for part in ("engine", "optim", "checkpoint"):
        omega_conf_to_dataclass(cfg[part])
    return cfg


# What the plan's verl commands hold in place of what is known only at run time.
PLACEHOLDERS = (
    "RUN in a path: the run's key (recipe and inputs). Model paths: where the stage pulls its "
    f"input model to. data.max_prompt_length: {DEFAULT_PROMPT_TOKENS} here, at run time the "
    "longest prompt of the stage's problems rounded up to 64 (the GPU settings are sized for it "
    "again)."
)


def _verl_command(recipe: Recipe, layout: Layout, stage: Stage, rl, gpu=None) -> list[str] | None:
    """The verl command `stage` will run (None for a stage verl does not run), checked; with the
    placeholders `PLACEHOLDERS` names (`rl`: its RL config if it is an RL stage, `gpu`: its GPU
    settings)."""
    from dataclasses import replace

    from rstar.train.verl_launcher import verl_command

    if recipe.engine != "verl" or not stage.needs.trains:
        return None
    name = stage.name
    # named at run time by the recipe and inputs (rstar.pipeline.cache.work_dir)
    work = f"{layout.work_uri(name)}/RUN"
    device, n_gpus = verl_stages.device(recipe), verl_stages.gpus_per_node(recipe)
    model = dirs.local_dir(layout.model(stage.model_from))
    if rl is None:
        cmd = verl_stages.sft_command(recipe, model, layout.dataset("sft"), work)
        check = check_verl_sft
    else:
        cmd, check = (
            verl_command(
                replace(rl, prompt_style=recipe.prompt_style),
                gpu=gpu,
                model=model,
                train_files=f"{work}/verl_train.parquet",
                val_files=f"{work}/verl_val.parquet",
                agent_loop_config=f"{work}/agent_loops.yaml",
                sandbox_url=recipe.sandbox_url,
                out_dir=work,
                n_gpus=n_gpus,
                nodes=recipe.resources.nodes,
                experiment=recipe.tracking.experiment,
                router_config=f"{work}/router.yaml",
                device=device,
            ),
            check_verl,
        )
    try:
        check(cmd[3:])
    except Exception as e:  # noqa: BLE001 - Hydra, OmegaConf and verl's asserts: say which stage
        raise PlanError(f"stage {name}: verl refuses its config: {type(e).__name__}: {e}") from None
    return cmd


def plan(recipe: Recipe) -> list[dict]:
    """[{"name", "engine", "resources", "command"}] per stage; raises PlanError for a verl stage
    whose command verl would refuse. `resources`: what the stage's Ray task holds (`cpus`,
    `gpus`) and, for a verl stage, the workers verl places (`verl_workers`)."""
    from rstar.pipeline.launch import driver_cpus, driver_gpus
    from rstar.pipeline.stages import serving

    layout = Layout(recipe.storage_root)
    stages = []
    for stage in recipe_stages(recipe):
        name = stage.name
        rl = next((s for s in recipe.rl if s.name == name), None)
        gpu = None
        if recipe.engine == "verl" and stage.needs.trains:
            gpu = (
                verl_stages.gpu_settings(recipe, rl, DEFAULT_PROMPT_TOKENS)
                if rl
                else verl_stages.sft_gpu_settings(recipe)
            )
        command = _verl_command(recipe, layout, stage, rl, gpu)
        engine = "verl" if command else "local"
        if name == "base" and not recipe.base.build_tiny:
            engine = "gguf" if recipe.base.gguf else "files"  # files: copied, never loaded
        resources = {"cpus": driver_cpus(name, recipe), "gpus": driver_gpus(name, recipe)}
        served = serving(recipe) if stage.needs.serves else {}
        if served:  # the model in engine replicas (Ray actors), not in the stage's process
            engine = f"{served['kind']}-replicas"
            resources["replicas"] = served["replicas"]
        if engine == "verl":
            resources["verl_workers"] = {
                "nodes": recipe.resources.nodes,
                "gpus_per_node": recipe.resources.gpus,
            }
        lines = gpu.lines() if gpu else []
        if gpu and rl:
            lines.append(gpu.checkpoint_volume(rl.steps, rl.checkpoint_every, rl.checkpoints_kept))
        stages.append(
            {
                "name": name,
                "engine": engine,
                "resources": resources,
                "command": command,
                "gpu_settings": lines,
            }
        )
    return stages
