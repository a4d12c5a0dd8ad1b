"""`rstar pipeline rehearse`: a GPU recipe run on this machine's CPU as its cluster would run it.

A rehearsal is the recipe's own file with a fixed set of `--set` values (`overrides`): the
base model swapped for a random one of the same architecture, verl on CPU ranks standing for
the GPUs (the recipe's `rehearsal` block: rstar.pipeline.config.Rehearsal), and the scale shrunk
(steps, batches, lengths, samples). Every verl command line it runs must equal the one
`rstar pipeline plan` prints for the recipe but for the keys `ALLOWED` names; `compare` says
which keys differ, stage by stage.
"""

from __future__ import annotations

from contextlib import contextmanager

# The verl keys a rehearsal may set otherwise than the plan, by why.
ALLOWED = {
    # CPU ranks for GPUs (rstar.train.verl_cpu, verl_launcher.cpu_overrides): the platform,
    # float32, vLLM's CPU build (no sleep mode, no graphs, a KV cache in bytes, no tensor
    # parallelism), no torch.compile, one reward worker, no data-loader processes
    "device": [
        "trainer.device",
        "engine.dtype",
        "+engine.mixed_precision",
        "engine.use_torch_compile",
        "+actor_rollout_ref.rollout.enable_sleep_mode",
        "actor_rollout_ref.rollout.free_cache_engine",
        "actor_rollout_ref.rollout.enforce_eager",
        "actor_rollout_ref.rollout.dtype",
        "actor_rollout_ref.rollout.max_model_len",
        "+actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes",
        "actor_rollout_ref.rollout.tensor_model_parallel_size",
        "actor_rollout_ref.actor.fsdp_config.dtype",
        "+actor_rollout_ref.actor.fsdp_config.mixed_precision",
        "actor_rollout_ref.actor.use_torch_compile",
        "actor_rollout_ref.actor.fsdp_config.use_torch_compile",
        "reward.num_workers",
        "data.dataloader_num_workers",
    ],
    # fewer, shorter, smaller: steps and their schedule, batches, lengths, nodes and ranks (the
    # shard group the same share of a node), agent-loop workers
    "scale": [
        "trainer.total_epochs",
        "trainer.total_training_steps",
        "trainer.save_freq",
        "trainer.test_freq",
        "trainer.n_gpus_per_node",
        "trainer.nnodes",
        "engine.fsdp_size",
        "actor_rollout_ref.actor.fsdp_config.fsdp_size",
        "actor_rollout_ref.rollout.agent.num_workers",
        "actor_rollout_ref.actor.optim.lr_warmup_steps",
        "data.train_batch_size",
        "data.micro_batch_size_per_gpu",
        "data.max_length",
        "data.max_token_len_per_gpu",
        "data.max_response_length",
        "actor_rollout_ref.rollout.response_length",
        "actor_rollout_ref.rollout.n",
        "actor_rollout_ref.actor.ppo_mini_batch_size",
        "+rstar.group_size",
        "+rstar.sampling",
    ],
}
# Known only when the stage runs (rstar.pipeline.plan.PLACEHOLDERS): its working directory and
# files in it, the model pulled to this machine, the prompt length measured on the problems,
# the previous stage's optimizer state, the environment verl's Ray job carries. A key ending in
# "." stands for every key it begins.
RUN_TIME = [
    "model.path",
    "actor_rollout_ref.model.path",
    "data.train_files",
    "data.val_files",
    "data.max_prompt_length",
    "actor_rollout_ref.rollout.prompt_length",
    "trainer.default_local_dir",
    "actor_rollout_ref.rollout.agent.agent_loop_config_path",
    "actor_rollout_ref.rollout.router_config_path",
    "+rstar.optimizer_from",
    "++ray_kwargs.ray_init.runtime_env.env_vars.",
]
RANKS_PER_NODE, NODES = 2, 2


def scale_overrides(recipe) -> dict:
    """The scale a rehearsal runs at: two steps for the first RL stage (a checkpoint after each,
    so a kill after the first resumes), one for the others; 4 prompts x 2 x 2 rollouts, 256
    tokens, 2 turns; a short SFT; a handful of problems mined and evaluated."""
    sampling = {"max_response_tokens": 256, "max_turns": 2}
    values: dict = {
        "sft.train.epochs": 1,
        "sft.train.batch_size": 8,
        "sft.train.micro_batch_size": 2,
        "sft.train.max_length": 1024,
        "mine.k": 2,
        "mine.problems": 8,
        "mine.in_flight": 16,
        "eval.k": 1,
    }
    for section in ("mine", "eval"):
        values.update({f"{section}.sampling.{k}": v for k, v in sampling.items()})
    for i in range(len(recipe.rl)):
        values.update(
            {
                f"rl.{i}.steps": 2 if i == 0 else 1,
                f"rl.{i}.prompts_per_step": 4,
                f"rl.{i}.roc.group_size": 2,
                f"rl.{i}.warmup_steps": 1,
                f"rl.{i}.checkpoint_every": 1,
                **{f"rl.{i}.sampling.{k}": v for k, v in sampling.items()},
            }
        )
    return values


def overrides(config: str, plan_overrides: dict, base: str) -> dict:
    """The `--set` values that make the recipe in `config` (with `plan_overrides`) a rehearsal:
    its scale (`scale_overrides`), the base model in `base` (a random model of the recipe's
    architecture), verl on `NODES` x `RANKS_PER_NODE` CPU ranks."""
    from rstar.pipeline.config import load_recipe

    recipe = load_recipe(config, plan_overrides or None, check_inputs=False)
    return {
        **plan_overrides,
        **scale_overrides(recipe),
        "base.path": base,
        "resources.gpus": RANKS_PER_NODE,
        "resources.nodes": NODES,
        "rehearsal": {"plan": config, "plan_overrides": plan_overrides},
    }


def keyed(command: list[str]) -> dict[str, str]:
    """A verl command's Hydra overrides as key -> value (the program and module left out)."""
    return dict(arg.split("=", 1) for arg in command[3:])


def differs(plan: list[str], rehearsal: list[str]) -> dict[str, list]:
    """{key: [the plan's value, the rehearsal's]} for every override the two lines set
    otherwise (None where one line does not set the key)."""
    a, b = keyed(plan), keyed(rehearsal)
    return {k: [a.get(k), b.get(k)] for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)}


def refused(keys, run_time: bool = False) -> list[str]:
    """The keys among `keys` that no list of ALLOWED names (nor, with `run_time`, RUN_TIME)."""
    allowed = {k for names in ALLOWED.values() for k in names} | set(RUN_TIME if run_time else [])
    prefixes = tuple(k for k in allowed if k.endswith("."))
    return sorted(k for k in keys if k not in allowed and not k.startswith(prefixes))


def compare(plan_stages: list[dict], rehearsal_stages: list[dict]) -> list[dict]:
    """Per stage of two plans (rstar.pipeline.plan.plan): {"name", "differs", "refused": the
    keys that differ and are not ALLOWED}."""
    out = []
    for p, r in zip(plan_stages, rehearsal_stages, strict=True):
        diff = differs(p["command"] or [], r["command"] or [])
        out.append({"name": p["name"], "differs": diff, "refused": refused(diff)})
    return out


@contextmanager
def _environ(values: dict[str, str]):
    """`values` in this process's environment for the body."""
    import os

    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


STAGE_TIMEOUT_S = 45 * 60  # one stage's invocation, the kill and retry included


def _last_error(log: str) -> str:
    """The line of a failed invocation's log that says what failed (the last error line)."""
    with open(log, errors="replace") as f:
        lines = [ln.strip() for ln in f if ln.strip()]
    errors = [ln for ln in lines if "Error" in ln or "error:" in ln]
    return (errors or lines or ["(no output)"])[-1][:500]


def _checkpointed(shared: str, step: int) -> bool:
    """Whether an RL stage's verl run (its working directory holds verl_train.parquet) has
    recorded its checkpoint of `step`, in the shared volume's mirrors."""
    import glob
    import os

    markers = os.path.join(shared, "mirror", "*", "latest_checkpointed_iteration.txt")
    for marker in glob.glob(markers):
        here = os.path.dirname(marker)
        if os.path.exists(os.path.join(here, "verl_train.parquet")):
            with open(marker) as f:
                if f.read().strip() == str(step):
                    return True
    return False


def _kill_stage_worker(recipe, stage: str) -> int:
    """SIGKILL the Ray worker running `stage` (its PID beside the working directory, as
    rstar.pipeline.launch records it), as a node's crash would; returns the PID."""
    import os
    import signal

    from rstar.pipeline.launch import pid_file
    from rstar.storage import filesystem

    fs, path = filesystem(pid_file(recipe, stage))
    pid = int(fs.cat_file(path).decode())
    os.kill(pid, signal.SIGKILL)
    return pid


def _stage_commands(tracking_uri: str, experiment: str) -> dict[str, list[str]]:
    """The verl command each stage ran, from its MLflow run (rstar.pipeline.verl_stages logs it),
    by stage name; the newest run of a name."""
    import json
    import tempfile

    from rstar.pipeline.verl_stages import COMMAND_FILE
    from rstar.tracking import mlflow_log as ml

    c = ml.client(tracking_uri)
    exp = c.get_experiment_by_name(experiment)
    commands: dict[str, list[str]] = {}
    if exp is None:
        return commands
    for run in c.search_runs([exp.experiment_id], order_by=["attributes.start_time ASC"]):
        names = [a.path for a in c.list_artifacts(run.info.run_id)]
        if COMMAND_FILE in names:
            with tempfile.TemporaryDirectory() as d:
                path = c.download_artifacts(run.info.run_id, COMMAND_FILE, d)
                with open(path) as f:
                    commands[run.info.run_name] = json.load(f)
    return commands


def run(config: str, plan_overrides: dict, workdir: str, echo=print) -> dict:
    """Rehearse the recipe in `config` on a two-host cluster on this machine (the module's
    docstring): every stage in order, each by `rstar pipeline run --until <stage>` on the first
    host (earlier stages served from cache), the first RL stage's worker killed once after its
    first checkpoint (Prefect's retry resumes it). Returns {"stages": [{"name", "status",
    "seconds", "differs", "refused"}], "allowed": {...}, "model": ...}; `echo` gets a line per
    stage as it ends."""
    import json
    import os
    import time

    from rstar.model.qwen3 import STAND_IN, build_stand_in
    from rstar.pipeline.config import input_files, load_recipe
    from rstar.pipeline.plan import plan
    from rstar.pipeline.rehearsal_cluster import (
        RehearsalCluster,
        RehearsalError,
        _bin,
        check_memory,
    )
    from rstar.pipeline.rehearsal_inputs import write_inputs
    from rstar.pipeline.stage_table import stage_names
    from rstar.storage import atomic_write_text

    check_memory()

    config = os.path.abspath(config)
    planned_recipe = load_recipe(config, plan_overrides or None, check_inputs=False)
    planned = {s["name"]: s["command"] for s in plan(planned_recipe)}
    os.makedirs(workdir, exist_ok=True)
    base = build_stand_in(os.path.join(workdir, "stand-in"))
    values = overrides(config, plan_overrides, base)
    recipe = load_recipe(config, values, check_inputs=False)
    first_rl = recipe.rl[0].name
    results = []
    with RehearsalCluster(workdir, recipe, RANKS_PER_NODE, NODES) as cluster:
        env = cluster.env
        cluster.buckets([recipe.storage_root, *(uri for _, uri, _ in input_files(recipe))])
        # this process reaches S3 as the hosts do
        storage_env = {k: v for k, v in env.items() if k.startswith(("RSTAR_", "AWS_"))}
        with _environ(storage_env):
            write_inputs(recipe)
        sets = [a for k, v in values.items() for a in ("--set", f"{k}={json.dumps(v)}")]
        failed = False
        for name in stage_names(recipe):
            if failed:
                results.append({"name": name, "status": "not run", "seconds": 0.0})
                continue
            log = cluster.log(f"stage-{name}")
            cmd = [_bin("rstar"), "pipeline", "run", "--config", config, *sets, "--until", name]
            start = time.monotonic()
            proc = cluster.hosts.start(0, cmd, env, log)
            killed = []
            while proc.poll() is None:
                if name == first_rl and not killed and _checkpointed(env["RSTAR_CACHE"], 1):
                    with _environ(storage_env):
                        killed.append(_kill_stage_worker(recipe, name))
                if time.monotonic() - start > STAGE_TIMEOUT_S:
                    cluster.hosts.stop(proc)
                    raise RehearsalError(
                        f"stage {name} did not finish within {STAGE_TIMEOUT_S} s; its log: {log}"
                    )
                time.sleep(2)
            seconds = round(time.monotonic() - start, 1)
            entry = {"name": name, "seconds": seconds, "log": log}
            if proc.returncode:
                failed = True
                entry.update(status="failed", error=_last_error(log))
            else:
                entry["status"] = "finished"
            if name == first_rl:
                with open(log, errors="replace") as f:
                    resumed = [ln.strip() for ln in f if "Resuming from" in ln]
                entry["killed"] = bool(killed)
                entry["resumed"] = resumed[-1][-200:] if resumed else None
                if not (killed and resumed) and not failed:
                    failed = True
                    entry.update(status="failed", error="its worker was not killed and resumed")
            results.append(entry)
            echo(_line(entry))
            # what has run so far, for a rehearsal stopped before its end
            atomic_write_text(os.path.join(workdir, "stages.json"), json.dumps(results, indent=1))
        ran = _stage_commands(cluster.tracking_here, recipe.tracking.experiment)
    for entry in results:
        name = entry["name"]
        if planned.get(name) or name in ran:
            diff = differs(planned.get(name) or [], ran.get(name) or [])
            entry["differs"] = diff
            entry["refused"] = refused(diff, run_time=True)
    return {
        "stages": results,
        "allowed": {**ALLOWED, "run_time": RUN_TIME},
        "model": f"random Qwen3 stand-in {STAND_IN} with Qwen3's tokenizer",
        "hosts": f"{NODES} network namespaces, {RANKS_PER_NODE} CPU ranks each",
    }


def _line(entry: dict) -> str:
    text = f"{entry['name']:<10} {entry['status']:<9} {entry['seconds']:>7.1f} s"
    if entry.get("error"):
        text += f"  {entry['error']}"
    if entry.get("resumed"):
        text += f"  (killed, then: {entry['resumed']})"
    return text
