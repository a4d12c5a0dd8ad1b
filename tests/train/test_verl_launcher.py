"""The cluster path on CPU: stage config -> verl's Hydra config (composed with verl's own
schema), dataset rows, RoC inside verl's training step on verl's DataProto and advantages.
verl's trainer itself runs in test_verl_run.py."""

import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from rstar.agent.sampling import Sampling
from rstar.algo.roc import RoCConfig
from rstar.data import synth
from rstar.data.io import read_table, write_table
from rstar.pipeline.plan import compose_verl
from rstar.train.config import RLConfig
from rstar.train.verl_launcher import build_verl_run, to_verl_rows, verl_overrides

STAGE = RLConfig(
    name="rl1",
    steps=300,
    prompts_per_step=512,
    roc=RoCConfig(group_size=16),
    sampling=Sampling(max_response_tokens=8192, max_turns=10),
    lr=1e-6,
    warmup_steps=20,
    mini_batches=4,
)


def placeholder_overrides(stage: RLConfig = STAGE, **kw) -> list[str]:
    """`verl_overrides` with placeholder paths, for tests about the rest of the command."""
    paths = {"model": "m", "train_files": "t", "agent_loop_config": "a", "sandbox_url": "s"}
    return verl_overrides(stage, **{**paths, "out_dir": "o", "n_gpus": 8, **kw})


def test_overrides_compose_and_pass_verls_own_validation(tmp_path):
    from verl.trainer.ppo.reward import get_custom_reward_fn
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    cfg = compose_verl(
        verl_overrides(
            STAGE,
            model="/models/qwen3-14b-base",
            train_files="/data/train.parquet",
            agent_loop_config="/run/agent_loops.yaml",
            sandbox_url="http://sandbox:8080",
            out_dir="/run/rl1",
            n_gpus=8,
            nodes=8,
            val_files="/data/eval.parquet",
            experiment="rstar-qwen3-14b",
        )
    )
    # what main_ppo runs before it starts Ray: no critic, no reference model (no KL), sizes
    # consistent
    assert not need_critic(cfg) and not need_reference_policy(cfg)
    validate_config(cfg, use_reference_policy=False, use_critic=False)
    actor, rollout = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    assert cfg.algorithm.adv_estimator == "grpo" and cfg.algorithm.use_kl_in_reward is False
    assert (actor.clip_ratio_low, actor.clip_ratio_high, actor.loss_agg_mode) == (
        0.2,
        0.28,
        "token-mean",
    )
    assert actor.use_kl_loss is False and actor.entropy_coeff == 0 and actor.optim.lr == 1e-6
    assert actor.optim.lr_warmup_steps == 20
    # one rollout a micro-batch without GPU settings: bounded whatever the lengths
    assert not actor.use_dynamic_bsz and actor.ppo_micro_batch_size_per_gpu == 1
    assert rollout.n == 32 and rollout.response_length == 8192 and rollout.name == "vllm"
    assert rollout.agent.default_agent_loop == "rstar_agent"
    assert cfg.data.train_batch_size == 512 and cfg.trainer.nnodes == 8
    assert actor.ppo_mini_batch_size == 128  # 4 optimizer steps per rollout batch
    assert cfg.rstar.sandbox_url == "http://sandbox:8080"
    # the stage's sampling block reaches the agent loop as it is; verl samples by it too
    assert Sampling(**cfg.rstar.sampling) == STAGE.sampling
    assert (rollout.temperature, rollout.top_p) == (
        STAGE.sampling.temperature,
        STAGE.sampling.top_p,
    )
    # validation on the held-out set once, at the end; checkpoints as the recipe says, capped
    assert cfg.data.val_files == "/data/eval.parquet" and cfg.trainer.val_before_train is False
    assert cfg.trainer.test_freq == STAGE.steps
    assert (
        cfg.trainer.save_freq == STAGE.checkpoint_every and cfg.trainer.max_actor_ckpt_to_keep == 1
    )
    assert (
        list(cfg.trainer.logger) == ["console", "mlflow"]
        and cfg.trainer.project_name == "rstar-qwen3-14b"
    )
    # the reward verl loads is the project's answer-only reward, truncation scoring 0
    reward = get_custom_reward_fn(cfg)
    answer = "<reason>done</reason>\n<answer>\\boxed{42}</answer>"
    assert reward("dapo", answer, "42") == 1.0 and reward("dapo", answer, "41") == 0.0
    assert reward("dapo", answer, "42", extra_info={"rstar_truncated": True}) == 0.0


def test_build_writes_dataset_and_agent_loop_files(tmp_path):
    problems = str(tmp_path / "p.parquet")
    write_table(synth.generate(4, seed=1), problems, "problems")
    cmd = build_verl_run(
        STAGE,
        model="m",
        problems=problems,
        sandbox_url="http://s",
        out_dir=str(tmp_path / "run"),
        n_gpus=8,
    )
    assert cmd[1:3] == ["-m", "rstar.train.verl_trainer"]
    import pyarrow.parquet as pq

    rows = pq.read_table(tmp_path / "run" / "verl_train.parquet").to_pylist()
    assert rows[0]["agent_name"] == "rstar_agent" and rows[0]["prompt"][0]["role"] == "system"
    assert rows[0]["reward_model"]["ground_truth"] == synth.generate(4, seed=1)[0]["answer"]
    assert "RStarAgentLoop" in (tmp_path / "run" / "agent_loops.yaml").read_text()
    assert to_verl_rows([]) == []


def agent_loop_batch(n_prompts: int = 2, per_prompt: int = 8, width: int = 6):
    """A step's batch as verl's agent loop hands it to the trainer: rewards in `rm_scores` (at
    each response's last token), masks, and each rollout's trajectory row (ROW_FIELD), which
    holds the counts RoC reads."""
    from verl.protocol import DataProto

    from rstar.agent.verl_adapter import ROW_FIELD

    n = n_prompts * per_prompt
    rewards = torch.tensor([1, 1, 1, 0, 0, 0, 0, 0] * n_prompts, dtype=torch.float32)[:n]
    lengths = torch.tensor([3, 4, 5, 6, 2, 3, 4, 5] * n_prompts)[:n]
    mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
    scores = torch.zeros(n, width)
    scores[torch.arange(n), lengths - 1] = rewards
    # per prompt: the three correct rollouts make 2 calls each, 4 of them errors, one of which
    # the sandbox's (it never ran the call); the five wrong ones one clean call each
    calls = [["ok", "ok"], ["rejected", "error"], ["error", "error"]] + [["ok"]] * 5
    uids = np.repeat(np.array([f"p{i}" for i in range(n_prompts)], dtype=object), per_prompt)
    rows = [
        json.dumps(
            {
                "problem_id": uid,
                "prompt_text": "q",
                "answer": None,
                "response_text": "r",
                "finish_reason": "answered",
                "turns": 3,
                "num_answers": 1,
                "num_tool_calls": len(c),
                "num_tool_errors": sum(s != "ok" for s in c),
                "tool_calls": json.dumps([{"status": s} for s in c]),
                "generate_s": 0.0,
                "tool_s": 0.0,
            }
        )
        for uid, c in zip(uids, calls * n_prompts)
    ]
    return DataProto.from_dict(
        tensors={
            "rm_scores": scores,
            "prompts": torch.ones(n, 2).long(),
            "response_mask": mask,
            "attention_mask": torch.cat([torch.ones(n, 2).long(), mask], 1),
            "responses": torch.arange(n * width).view(n, width),
        },
        non_tensors={
            "uid": uids,
            ROW_FIELD: np.array(rows, dtype=object),
        },
    )


def test_roc_in_verls_step_then_verls_own_grpo_advantages(tmp_path):
    """RoCTrainer's hook on a real DataProto, then verl's compute_advantage: G of 2G kept per
    prompt, rows whole, advantages centred within each kept group, the step's trajectory file
    marking kept exactly the rows the update goes on with; the worker group (the only thing
    faked) tells the data-parallel size."""
    from types import SimpleNamespace

    from omegaconf import OmegaConf
    from verl.trainer.ppo.ray_trainer import compute_advantage

    from rstar.train.verl_trainer import RoCTrainer

    trainer = object.__new__(RoCTrainer)
    trainer.config = OmegaConf.create(
        {
            "rstar": {
                "roc_mode": "roc",
                "group_size": 4,
                "seed": 0,
                "trajectories": str(tmp_path),
            },
            "trainer": {"experiment_name": "rl1"},
            "actor_rollout_ref": {"rollout": {"n": 8}, "actor": {"ppo_mini_batch_size": 2}},
        }
    )
    trainer.global_steps = 1
    trainer._get_dp_size = lambda wg, role: 2
    trainer.actor_rollout_wg = SimpleNamespace()
    batch, metrics = agent_loop_batch(), {}
    original = {tuple(r.tolist()) for r in batch.batch["responses"]}
    trainer._balance_batch(batch, metrics)
    assert len(batch) == 8 and metrics["rollout/rollouts"] == 16 and metrics["roc/kept"] == 8
    uids = list(batch.non_tensor_batch["uid"])
    assert uids.count("p0") == 4 and uids.count("p1") == 4
    assert {
        tuple(r.tolist()) for r in batch.batch["responses"]
    } <= original  # whole rows, nothing mixed
    # 3 of 8 positives sampled per prompt -> floor(4 * 3/8 + 0.5) = 2 kept; clean ones preferred
    # (weight 10 vs 0.48)
    # the step's figures under the names the local trainer logs (rstar.train.metrics)
    assert metrics["rollout/accuracy"] == 3 / 8
    assert metrics["roc/tool_error_rate_positive"] == 4 / 6
    assert metrics["roc/tool_error_rate_positive_kept"] <= metrics["roc/tool_error_rate_positive"]
    # over all 16 sampled: 22 calls, 8 errors, 2 of them the sandbox's
    assert metrics["rollout/tool_error_rate"] == 8 / 22
    assert metrics["rollout/sandbox_failure_rate"] == 2 / 22
    assert "global_seqlen/min" in metrics  # then verl's own balancing ran on what was kept
    # the file's kept rows are the rows left to train on (each response is unique here)
    written = read_table(f"{tmp_path}/step=00001.parquet", "trajectories").to_pylist()
    trained = {
        tuple(r[m.bool()].tolist())
        for r, m in zip(batch.batch["responses"], batch.batch["response_mask"], strict=True)
    }
    assert len(written) == 16
    assert {tuple(r["response_ids"]) for r in written if r["kept"]} == trained
    batch.batch["token_level_rewards"] = batch.batch["rm_scores"]
    out = compute_advantage(batch, adv_estimator="grpo", num_repeat=4, config=OmegaConf.create({}))
    adv = out.batch["advantages"]
    for uid in ("p0", "p1"):
        rows = [i for i, u in enumerate(out.non_tensor_batch["uid"]) if u == uid]
        first = adv[rows, 0]
        assert abs(first.sum().item()) < 1e-5 and first.abs().max() > 0.5  # centred, not all zero
        positive = out.batch["rm_scores"][rows].sum(-1) > 0
        assert (first[positive] > 0).all() and (first[~positive] < 0).all()
        # masked past each response
        assert torch.equal((adv[rows] != 0).long(), out.batch["response_mask"][rows])


def test_ppo_mini_batches_count_the_kept_group_not_the_sampled_one():
    from omegaconf import OmegaConf

    from rstar.train.verl_trainer import RoCTrainer

    trainer = object.__new__(RoCTrainer)
    trainer.config = OmegaConf.create(
        {
            "rstar": {"roc_mode": "roc", "group_size": 16},
            "actor_rollout_ref": {"rollout": {"n": 32}},
        }
    )
    seen = []
    with trainer._kept_group_size():
        seen.append(trainer.config.actor_rollout_ref.rollout.n)
    assert seen == [16] and trainer.config.actor_rollout_ref.rollout.n == 32


def test_a_fresh_verl_stage_takes_the_previous_stages_optimizer_state_unless_it_resets(tmp_path):
    from types import SimpleNamespace

    import torch
    from omegaconf import OmegaConf

    from rstar.train.verl_trainer import RoCTrainer

    previous = tmp_path / "rl1" / "global_step_300" / "actor"
    previous.mkdir(parents=True)
    for rank in range(2):
        for part in ("model", "optim"):
            torch.save({part: rank}, previous / f"{part}_world_size_2_rank_{rank}.pt")
        torch.save(
            {"lr_scheduler": {"last_epoch": 300}, "rng": "rl1's"},
            previous / f"extra_state_world_size_2_rank_{rank}.pt",
        )
    carry = placeholder_overrides(optimizer_from=str(previous))
    assert compose_verl(carry).rstar.optimizer_from == str(previous)
    reset = RLConfig(name="rl3", reset_optimizer=True)
    assert not any(
        "optimizer_from" in o for o in placeholder_overrides(reset, optimizer_from=str(previous))
    )
    trainer = object.__new__(RoCTrainer)
    work = tmp_path / "rl2"
    trainer.config = OmegaConf.create(
        {
            "trainer": {
                "resume_mode": "auto",
                "default_hdfs_dir": None,
                "default_local_dir": str(work),
            },
            "rstar": {"optimizer_from": str(previous)},
        }
    )
    loaded = []
    trainer.actor_rollout_wg = SimpleNamespace(
        load_checkpoint=lambda path, del_local_after_load: loaded.append(path)
    )
    # no checkpoint of its own: a fresh start, from a view of rl1's checkpoint
    assert trainer._load_checkpoint() == 0 and len(loaded) == 1
    view = loaded[0]
    for rank in range(2):
        for part in ("model", "optim"):  # the weights and AdamW's moments, as rl1 left them
            shard = torch.load(f"{view}/{part}_world_size_2_rank_{rank}.pt")
            assert shard == {part: rank}
        # but not rl1's schedule (past its warm-up) nor its RNG: verl skips what is missing
        extra = torch.load(f"{view}/extra_state_world_size_2_rank_{rank}.pt")
        assert extra == {"lr_scheduler": None}
    # a retry makes the same view again
    trainer._load_checkpoint()
    assert loaded == [view, view]


def test_a_verl_stage_with_an_unreachable_sandbox_fails_before_verl_starts(tmp_path, monkeypatch):
    from rstar.pipeline import stages, verl_stages
    from rstar.pipeline.config import load_recipe
    from rstar.pipeline.layout import Layout
    from rstar.pipeline.records import ModelRef, StageInputs, Stored
    from rstar.sandbox.client import SandboxUnreachable
    from rstar.sandbox.process import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    recipe = load_recipe(
        "configs/tiny-verl.yaml", {"storage_root": str(tmp_path / "root"), "sandbox_url": dead}
    )
    launched = []
    monkeypatch.setattr(verl_stages, "_run", lambda *a, **k: launched.append(a))
    with pytest.raises(SandboxUnreachable, match=f"sandbox service {dead} does not answer"):
        stages.rl(
            recipe,
            Layout(recipe.storage_root),
            StageInputs(model=ModelRef("m"), problems=Stored("p")),
            None,
            stage="rl1",
        )
    assert launched == []  # verl never started


def test_the_rl_stage_hands_its_mlflow_run_to_verls_ray_job(tiny_dir, tmp_path, monkeypatch):
    """What the stage gives verl: the MLflow run in the Ray job's environment (see
    test_verls_logger_on_a_separately_started_ray_sees_the_stages_mlflow_run for why)."""
    from types import SimpleNamespace

    from rstar.pipeline import stages, verl_stages
    from rstar.pipeline.config import load_recipe
    from rstar.pipeline.layout import Layout
    from rstar.pipeline.records import ModelRef, StageInputs, Stored
    from rstar.sandbox import client
    from rstar.train.verl_launcher import external_modules

    recipe = load_recipe(
        "configs/tiny-verl.yaml",
        {"storage_root": str(tmp_path / "root"), "sandbox_url": "http://127.0.0.1:9"},
    )
    problems = write_table(synth.generate(4, seed=1), str(tmp_path / "p.parquet"), "problems")
    monkeypatch.setattr(client, "check_health", lambda url: None)
    launched = []

    def run(cmd, *args):
        launched.append(cmd)
        raise InterruptedError  # verl itself is not the point here

    monkeypatch.setattr(verl_stages, "_run", run)
    log = SimpleNamespace(run_id="r42", tracking_uri="sqlite:////x/mlflow.db")
    with pytest.raises(InterruptedError):
        stages.rl(
            recipe,
            Layout(recipe.storage_root),
            StageInputs(model=ModelRef(tiny_dir), problems=Stored(problems)),
            log,
            stage="rl1",
        )
    (cmd,) = launched
    from hydra.core.override_parser.overrides_parser import OverridesParser

    # the values as verl reads them
    got = {o.key_or_group: o.value() for o in OverridesParser.create().parse_overrides(cmd[3:])}
    job_env = {
        k.rsplit(".", 1)[1]: v
        for k, v in got.items()
        if k.startswith("ray_kwargs.ray_init.runtime_env.env_vars.")
    }
    assert job_env["MLFLOW_RUN_ID"] == "r42"
    assert job_env["MLFLOW_TRACKING_URI"] == "sqlite:////x/mlflow.db"
    # and the modules verl loads in every process, on every node (rstar.train.verl_resume...)
    assert job_env["VERL_USE_EXTERNAL_MODULES"] == external_modules("cpu")
    # each step's rollouts go where the local trainer's would
    assert got["rstar.trajectories"] == Layout(recipe.storage_root).trajectories("rl1")


def test_verls_training_processes_on_the_cpu_get_the_recipes_threads():
    """Ray starts a task without CPUs of its own on whatever thread count its environment gives
    (one, before vLLM's CPU build brought Intel's OpenMP); verl's training process is such a
    task (it holds a "GPU" slot), so the recipe's count must reach it: on 2 cores, one thread
    trained at half speed."""
    import os
    import subprocess
    import sys

    from rstar.train.verl_launcher import verl_env

    probe = (
        "import ray\nray.init(num_gpus=1, num_cpus=4, include_dashboard=False, "
        "object_store_memory=10**8)\ndef threads():\n    import torch\n    return "
        "torch.get_num_threads()\nprint('threads', ray.get(ray.remote(num_gpus=1, "
        "num_cpus=0)(threads).remote()))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "RAY_ADDRESS")}
    for given in (1, 2):  # either way round from Ray's own default
        out = subprocess.run(
            [sys.executable, "-c", probe],
            env={**env, **verl_env("cpu", given)},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert f"threads {given}" in out.stdout, out.stdout + out.stderr[-2000:]


def test_a_verl_config_that_would_skip_roc_is_refused_before_verl_starts():
    """RoC lives in verl's _balance_batch, which verl calls only with trainer.balance_batch:
    the stage pins it, and the entry point refuses a config that turns it (or use_v1) off."""
    from rstar.train.verl_trainer import check_roc_runs, main

    overrides = placeholder_overrides()
    assert "trainer.balance_batch=true" in overrides
    check_roc_runs(compose_verl(overrides))
    for bad, named in (
        ("trainer.balance_batch=false", "trainer.balance_batch=true"),
        ("trainer.use_v1=true", "trainer.use_v1=false"),
    ):
        with pytest.raises(ValueError, match=named):
            main(compose_verl([*overrides, bad]))


_ENV_PROBE = """
import os, sys
import ray
from rstar.pipeline.plan import compose_verl
from verl.trainer.main_ppo import run_ppo

@ray.remote(num_cpus=0)
class EnvProbe:
    # in place of verl's task runner, the actor where verl's MLflow logger is created
    def run(self, config):
        with open(config.rstar.probe_file, "w") as f:
            f.write(os.environ.get("MLFLOW_RUN_ID", "-"))

if __name__ == "__main__":
    run_ppo(compose_verl(sys.argv[1:]), task_runner_class=EnvProbe)
"""


def test_verls_logger_on_a_separately_started_ray_sees_the_stages_mlflow_run(tmp_path):
    """As on a cluster: a Ray head started apart (`ray start`), and verl's run_ppo joining it
    from a process whose environment names the stage's MLflow run. Ray's actors do not inherit
    that environment; the stage's overrides (`ray_job_env`) carry it into the job."""
    import os
    import shutil
    import signal
    import subprocess
    import sys
    import tempfile
    import time

    from rstar.pipeline.verl_stages import ray_job_env
    from rstar.sandbox.process import free_port

    port = free_port()
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    env = {k: v for k, v in env.items() if not k.startswith("MLFLOW_") and k != "RAY_ADDRESS"}
    ray_cli = os.path.join(os.path.dirname(sys.executable), "ray")
    # its own temp dir: with the default one the head would become this machine's "current"
    # cluster, which any plain ray.init() of a later test would join (short: socket paths)
    temp = tempfile.mkdtemp(prefix="rt-", dir="/tmp")
    head = subprocess.Popen(
        [ray_cli, "start", "--head", "--block", "--node-ip-address", "127.0.0.1"]
        + ["--port", str(port), "--num-cpus", "1", "--include-dashboard", "false"]
        + ["--object-store-memory", str(100 * 1024**2), "--disable-usage-stats"]
        + ["--temp-dir", temp],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        overrides = placeholder_overrides(n_gpus=1)
        stage_env = {
            "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db",
            "MLFLOW_RUN_ID": "r1",
        }
        # a client of a `ray start` head authenticates with the token it wrote
        driver_env = {**env, **stage_env, "RAY_ADDRESS": f"127.0.0.1:{port}"}
        driver_env["RAY_AUTH_MODE"] = "token"
        seen = {}
        for name, extra in (("without", []), ("with", ray_job_env(stage_env))):
            probe = tmp_path / f"{name}.txt"
            cmd = [sys.executable, "-c", _ENV_PROBE, *overrides, *extra]
            cmd.append(f"+rstar.probe_file={probe}")
            deadline = time.monotonic() + 120
            while True:  # the head may still be starting
                run = subprocess.run(cmd, env=driver_env, capture_output=True, text=True)
                if run.returncode == 0 or time.monotonic() > deadline:
                    break
                time.sleep(2)
            assert run.returncode == 0, run.stderr[-3000:]
            seen[name] = probe.read_text()
        # the driver's environment alone does not reach the actor; the job's does
        assert seen == {"without": "-", "with": "r1"}
    finally:
        # the head's own process group (only what this test started): ray start, its raylet and
        # GCS; SIGKILL, as `ray start --block` takes long to stop on SIGTERM
        os.killpg(head.pid, signal.SIGKILL)
        head.wait(timeout=30)
        shutil.rmtree(temp, ignore_errors=True)


def test_the_job_environment_reaches_verl_as_it_is_through_hydras_parser():
    """Values with a comma (the modules verl imports), colons, quotes and backslashes come out of
    Hydra's parser as they went in; unquoted, the comma made a sweep and verl refused the run."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from rstar.pipeline.verl_stages import ray_job_env

    env = {
        "VERL_USE_EXTERNAL_MODULES": "rstar.train.verl_cpu,rstar.train.verl_resume",
        "MLFLOW_TRACKING_URI": "http://mlflow:5000/a=b",
        "ODD": "it's a \\path\\ with \\'quote\\",
    }
    parsed = OverridesParser.create().parse_overrides(ray_job_env(env))
    assert {o.key_or_group.rsplit(".", 1)[1]: o.value() for o in parsed} == env


def test_paths_with_equals_signs_and_commas_reach_verl_as_they_are():
    """A storage root's paths hold `=` (trajectories/stage=rl1, Hive-style) and may hold commas:
    every path in the RL and SFT commands comes out of verl's composed config as it went in.
    Unquoted, `+rstar.trajectories=.../stage=rl1` was a Hydra syntax error and every RL stage
    on verl failed to start."""
    from rstar.train.config import SFTConfig
    from rstar.train.verl_sft import sft_overrides

    root = "/runs/a=b,c"
    paths = {
        "model": f"{root}/models/sft",
        "train_files": f"{root}/work/rl1/k=1/train.parquet",
        "val_files": f"{root}/work/rl1/k=1/val.parquet",
        "agent_loop_config": f"{root}/work/rl1/k=1/agent_loops.yaml",
        "router_config": f"{root}/work/rl1/k=1/router.yaml",
        "out_dir": f"{root}/work/rl1/k=1",
        "optimizer_from": f"{root}/work/rl0/global_step_2/actor",
        "trajectories": f"{root}/trajectories/stage=rl1",
        "experiment": "exp=1,2",
    }
    stage = replace(STAGE, name="rl=1,b")
    cfg = compose_verl(verl_overrides(stage, sandbox_url="http://s:1/?a=b", n_gpus=8, **paths))
    got = {
        "model": cfg.actor_rollout_ref.model.path,
        "train_files": cfg.data.train_files,
        "val_files": cfg.data.val_files,
        "agent_loop_config": cfg.actor_rollout_ref.rollout.agent.agent_loop_config_path,
        "router_config": cfg.actor_rollout_ref.rollout.router_config_path,
        "out_dir": cfg.trainer.default_local_dir,
        "optimizer_from": cfg.rstar.optimizer_from,
        "trajectories": cfg.rstar.trajectories,
        "experiment": cfg.trainer.project_name,
    }
    assert got == paths and cfg.rstar.sandbox_url == "http://s:1/?a=b"
    assert cfg.trainer.experiment_name == "rl=1,b"
    sft = compose_verl(
        sft_overrides(
            SFTConfig(),
            model=paths["model"],
            train_files=paths["train_files"],
            out_dir=paths["out_dir"],
            n_gpus=8,
            experiment=paths["experiment"],
        ),
        "sft_trainer_engine",
    )
    assert (
        sft.model.path,
        sft.data.train_files,
        sft.trainer.default_local_dir,
        sft.trainer.project_name,
    ) == (paths["model"], paths["train_files"], paths["out_dir"], paths["experiment"])


def test_verl_loads_the_projects_modules_in_every_process_on_either_device():
    from rstar.train.verl_launcher import verl_env

    mended = ["rstar.train.verl_resume", "rstar.train.verl_hsdp", "rstar.train.verl_warmup"]
    assert verl_env("gpu")["VERL_USE_EXTERNAL_MODULES"].split(",") == mended
    assert verl_env("cpu")["VERL_USE_EXTERNAL_MODULES"].split(",") == [
        "rstar.train.verl_cpu",
        *mended,
    ]


def test_on_the_cpu_vllm_gets_the_stages_context_and_a_kv_cache_sized_for_it(tmp_path):
    """SmolLM2's shape: its own 8,192-token context with the fixed 256 MiB cache made vLLM
    refuse to start; the stage's prompt + response budget and a cache sized from the model's
    shape for it is what verl's composed config hands vLLM."""
    from rstar.rollout.vllm_engine import CPU_KV_SEQUENCES
    from tests.conftest import smollm2_shaped_config

    smollm2_shaped_config(tmp_path)
    stage = replace(STAGE, sampling=replace(STAGE.sampling, max_response_tokens=4096))
    cfg = compose_verl(
        placeholder_overrides(stage, model=str(tmp_path), device="cpu", max_prompt_length=1024)
    )
    rollout = cfg.actor_rollout_ref.rollout
    assert rollout.max_model_len == 1024 + 4096
    per_token = 30 * 2 * 3 * 64 * 4  # layers x (K, V) x KV heads x head dim x float32
    kv = rollout.engine_kwargs.vllm.kv_cache_memory_bytes
    assert kv == CPU_KV_SEQUENCES * (1024 + 4096) * per_token
