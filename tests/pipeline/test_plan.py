"""`rstar pipeline plan`: every stage with its resources, verl stages' commands checked by verl's
own validation, nothing run."""

import json
import os

from typer.testing import CliRunner

from flows.cli import app
from rstar.pipeline.config import load_recipe
from rstar.pipeline.layout import Layout
from rstar.pipeline.plan import check_verl, check_verl_sft
from rstar.pipeline.stage_table import stage_names
from rstar.storage import dirs


def test_the_14b_plan_lists_every_stage_and_verl_accepts_every_rl_command():
    result = CliRunner().invoke(
        app, ["pipeline", "plan", "--config", "configs/qwen3-14b.yaml", "--json"]
    )
    assert result.exit_code == 0, result.output
    stages = json.loads(result.stdout)["stages"]
    assert [s["name"] for s in stages] == [
        "base",
        "problems",
        "sft",
        "rl1",
        "rl2",
        "mine",
        "rl3",
        "evaluate",
    ]
    # no stage runs the 14B model in its own process, and no stage's driver holds a GPU
    assert {s["name"]: s["engine"] for s in stages} == {
        "base": "files",
        "problems": "local",
        "sft": "verl",
        "rl1": "verl",
        "rl2": "verl",
        "mine": "vllm-replicas",
        "rl3": "verl",
        "evaluate": "vllm-replicas",
    }
    assert all(s["resources"]["gpus"] == 0 for s in stages)
    sft = stages[2]
    assert sft["command"][1:3] == ["-m", "rstar.train.verl_sft"]
    sft_cfg = check_verl_sft(sft["command"][3:])
    assert (
        sft_cfg.trainer.n_gpus_per_node == 8
        and sft_cfg.trainer.nnodes == 8
        and sft_cfg.trainer.device == "cuda"
    )
    assert (
        sft_cfg.data.train_batch_size == 128
        and sft_cfg.optim.lr == 5e-6
        and sft_cfg.data.max_length == 8192
    )
    assert sft_cfg.data.custom_cls.name == "SFTChats" and sft_cfg.engine.strategy == "fsdp2"
    verl = [s for s in stages if s["engine"] == "verl" and s["name"] != "sft"]
    assert [s["name"] for s in verl] == ["rl1", "rl2", "rl3"]
    for s in verl:
        assert s["command"][1:3] == ["-m", "rstar.train.verl_trainer"]
        cfg = check_verl(s["command"][3:])  # composes and validates again, as main_ppo would
        assert cfg.reward.custom_reward_function.path.endswith(
            os.path.join("rstar", "agent", "verl_adapter.py")
        )
        assert os.path.exists(cfg.reward.custom_reward_function.path)
        assert cfg.trainer.experiment_name == s["name"]
        # the stage's driver holds no GPU: verl places its own workers on all 64
        assert s["resources"]["gpus"] == 0 and s["resources"]["verl_workers"] == {
            "nodes": 8,
            "gpus_per_node": 8,
        }
    # a full checkpoint (~177 GB) every 10 steps, not after every step: ~9 TB written, not ~90
    saves = 0
    for s in verl:
        cfg = check_verl(s["command"][3:])
        assert cfg.trainer.save_freq == 10 and cfg.trainer.max_actor_ckpt_to_keep == 1
        saves += -(-cfg.trainer.total_training_steps // cfg.trainer.save_freq)
    assert saves * 14.8e9 * 12 / 1e12 < 10
    # mining and evaluation serve the 14B model from 64 vLLM replicas, their drivers hold no GPU
    served = {s["name"]: s for s in stages if s["name"] in ("mine", "evaluate")}
    assert all(
        s["engine"] == "vllm-replicas"
        and s["resources"]["replicas"] == 64
        and s["resources"]["gpus"] == 0
        for s in served.values()
    )
    # each stage starts from the model of the stage before it
    layout = Layout(load_recipe("configs/qwen3-14b.yaml", check_inputs=False).storage_root)
    models = [check_verl(s["command"][3:]).actor_rollout_ref.model.path for s in verl]
    assert models == [dirs.local_dir(layout.model(stage)) for stage in ("sft", "rl1", "rl2")]


def test_a_config_verl_cannot_parse_fails_the_plan_naming_the_stage(monkeypatch):
    from rstar.train import verl_launcher

    made = verl_launcher.verl_overrides
    # an override Hydra reads as a sweep, which verl's entry point refuses
    monkeypatch.setattr(
        verl_launcher, "verl_overrides", lambda *a, **kw: [*made(*a, **kw), "trainer.seed=1,2"]
    )
    result = CliRunner().invoke(app, ["pipeline", "plan", "--config", "configs/qwen3-14b.yaml"])
    assert result.exit_code == 1
    assert "stage rl1: verl refuses its config" in result.output


def test_a_sandbox_url_hydra_would_misread_reaches_verl_as_it_is():
    """A comma in a value (a sweep, unquoted) is quoted on verl's command line."""
    result = CliRunner().invoke(
        app,
        ["pipeline", "plan", "--config", "configs/qwen3-14b.yaml", "--set",
         "sandbox_url=http://a,b:8080", "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    rl1 = next(s for s in json.loads(result.stdout)["stages"] if s["name"] == "rl1")
    assert check_verl(rl1["command"][3:]).rstar.sandbox_url == "http://a,b:8080"


def test_a_recipe_error_is_one_line_not_a_traceback():
    result = CliRunner().invoke(
        app,
        ["pipeline", "plan", "--config", "configs/qwen3-14b.yaml", "--set", "rl.0.mini_batches=7"],
    )
    assert result.exit_code == 1
    assert (
        "mini_batches (7) must divide prompts_per_step (512)" in result.output
        and "Traceback" not in result.output
    )


def test_the_tiny_plan_runs_every_stage_locally():
    recipe = load_recipe("configs/tiny.yaml")
    result = CliRunner().invoke(app, ["pipeline", "plan", "--config", "configs/tiny.yaml"])
    assert result.exit_code == 0
    lines = [line for line in result.stdout.splitlines() if not line.startswith(" ")]
    assert [line.split()[0] for line in lines] == stage_names(recipe)
    assert all(line.split()[1] == "local" for line in lines)


def test_the_tiny_verl_plan_runs_verls_trainer_on_the_cpu_and_verl_accepts_it():
    result = CliRunner().invoke(
        app, ["pipeline", "plan", "--config", "configs/tiny-verl.yaml", "--json"]
    )
    assert result.exit_code == 0, result.output
    verl = [s for s in json.loads(result.stdout)["stages"] if s["engine"] == "verl"]
    assert [s["name"] for s in verl] == ["sft", "rl1", "rl2", "rl3"]
    sft_cfg = check_verl_sft(verl[0]["command"][3:])
    assert sft_cfg.trainer.device == "cpu" and sft_cfg.data.prompt_style == "compact"
    # FSDP's default, bfloat16, is slow on CPUs
    assert sft_cfg.engine.mixed_precision.param_dtype == "fp32"
    for s in verl[1:]:
        cfg = check_verl(s["command"][3:])
        rollout = cfg.actor_rollout_ref.rollout
        # vLLM's CPU build, without the sleep mode it refuses, in float32 as the actor
        assert cfg.trainer.device == "cpu" and rollout.name == "vllm"
        assert not rollout.enable_sleep_mode and rollout.dtype == "float32"
        assert rollout.checkpoint_manager_class.endswith("WeightSyncWithDeadline")
        assert cfg.actor_rollout_ref.actor.strategy == "fsdp2" and cfg.trainer.use_v1 is False
        assert cfg.actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype == "fp32"
        # 2G sampled, G kept by RoC
        assert cfg.rstar.group_size == 4 and cfg.actor_rollout_ref.rollout.n == 8
