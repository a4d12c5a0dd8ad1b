"""verl's own SFT trainer on the recipe's chats: `python -m rstar.train.verl_sft` (verl's Ray SFT
trainer, FSDP2 training processes) trains the shipped tiny base on this machine's CPU (gloo;
rstar.train.verl_cpu), with the chats tokenized as the local SFT tokenizes them; verl's model
merger turns its checkpoint into a Hugging Face model that loads and chats."""

import json
import os
import subprocess

import pytest

from rstar.train.config import RLConfig, SFTConfig
from rstar.train.sft import encode_example
from tests.train.test_verl_run import merged_changes, metrics_by_step

BASE = "models/tiny-base"


def chats(n: int) -> list[dict]:
    from rstar.data import sft as sft_data

    return sft_data.generate(n, seed=3, tasks=["calc", "arith_tool", "arith_recover", "reverse"])


def test_chats_are_tokenized_as_the_local_sft_does(tmp_path):
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer

    from rstar.data.io import write_table
    from rstar.train.verl_sft import SFTChats

    rows = chats(8)
    path = write_table(rows, str(tmp_path / "sft.parquet"), "sft")
    tok = AutoTokenizer.from_pretrained(BASE)
    data = SFTChats(path, tok, OmegaConf.create({"max_length": 512, "prompt_style": "compact"}))
    assert len(data) == len(rows)
    for row, item in zip(rows, data):
        ids, mask = encode_example(tok, json.loads(row["messages"]), 512, "compact")
        assert item["input_ids"].tolist() == ids and item["loss_mask"].tolist() == mask
        assert item["position_ids"].tolist() == list(range(len(ids)))
        taught = tok.decode([t for t, m in zip(ids, mask) if m])
        assert "<tool_call>" in taught or "<answer>" in taught
        # never the tool's or the user's
        assert "<tool_response>" not in taught and "<|im_start|>user" not in taught

    with pytest.raises(ValueError, match="no chat has an assistant token within max_length 8"):
        SFTChats([path], tok, OmegaConf.create({"max_length": 8, "prompt_style": "compact"}))


def test_replayed_pretraining_text_is_refused_with_engine_verl():
    from rstar.train.verl_sft import sft_overrides

    with pytest.raises(ValueError, match="replay_rows"):
        sft_overrides(
            SFTConfig(replay_rows=4), model=BASE, train_files="x.parquet", out_dir="out", n_gpus=1
        )


def test_sft_on_gpus_uses_the_attention_the_gpu_lock_has():
    """verl's default attention is flash-attn, which the GPU lock does not install: SFT on GPUs
    asks for PyTorch's sdpa, padded, as the RL stages do (the first GPU stage failed to build
    its model otherwise)."""
    from rstar.train.verl_launcher import verl_overrides
    from rstar.train.verl_sft import sft_overrides

    sft = sft_overrides(SFTConfig(), model=BASE, train_files="x.parquet", out_dir="o", n_gpus=8)
    assert "+model.override_config.attn_implementation=sdpa" in sft
    assert "model.use_remove_padding=false" in sft
    rl = verl_overrides(
        RLConfig(name="rl1"),
        model=BASE,
        train_files="x.parquet",
        agent_loop_config="a.yaml",
        sandbox_url="http://s",
        out_dir="o",
        n_gpus=8,
    )
    assert "+actor_rollout_ref.model.override_config.attn_implementation=sdpa" in rl
    assert "actor_rollout_ref.model.use_remove_padding=false" in rl


@pytest.mark.parametrize("cluster", [True, False], ids=["joins-a-cluster", "ray-of-its-own"])
def test_sfts_workers_get_the_jobs_environment(monkeypatch, cluster):
    """verl's SFT workers are Ray actors, which on a cluster do not inherit the launching
    process's environment: the stage's job environment (the CPU platform, the project's
    modules, the MLflow run) goes into the Ray job, as the RL stages' does. Without it a
    rehearsal's SFT workers fell back to CUDA ('Distributed package doesn't have NCCL')."""
    import ray
    import verl.trainer.sft_trainer_ray as verl_sft_trainer

    from rstar.pipeline.plan import compose_verl
    from rstar.pipeline.verl_stages import ray_job_env
    from rstar.train.verl_sft import main, sft_overrides

    env = {"VERL_PLATFORM": "cpu", "VERL_USE_EXTERNAL_MODULES": "rstar.train.verl_cpu,x"}
    overrides = sft_overrides(
        SFTConfig(), model=BASE, train_files="x.parquet", out_dir="o", n_gpus=2, device="cpu"
    )
    config = compose_verl(overrides + ray_job_env(env), "sft_trainer_engine")
    started, fitted = [], []

    class Trainer:  # verl's trainer places its workers on the Ray main() started
        def __init__(self, config):
            self.config = config

        def fit(self):
            fitted.append(self.config)

    monkeypatch.setattr(ray, "init", lambda **kw: started.append(kw))
    # the platform is the job environment's to choose (this process has verl's CUDA default)
    monkeypatch.setattr("verl.utils.device.auto_set_device", lambda config: None)
    monkeypatch.setattr(verl_sft_trainer, "SFTTrainer", Trainer)
    if cluster:
        monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    else:
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
    main(config)
    assert started[0]["runtime_env"] == {"env_vars": env} and fitted
    assert ("num_gpus" in started[0]) is not cluster  # its own Ray declares the CPU slots


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("device", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_verls_sft_trainer_trains_the_tiny_base(tmp_path, device):
    from transformers import AutoTokenizer

    from rstar.data.io import write_table
    from rstar.train.verl_launcher import verl_env
    from rstar.train.verl_sft import last_checkpoint, sft_command

    data = write_table(chats(64), str(tmp_path / "sft.parquet"), "sft")
    cfg = SFTConfig(
        epochs=1,
        lr=5e-4,
        batch_size=16,
        micro_batch_size=16,
        warmup_ratio=0.05,
        max_length=512,
        prompt_style="compact",
    )
    work = str(tmp_path / "run")
    os.makedirs(work)
    cmd = sft_command(
        cfg, model=os.path.abspath(BASE), train_files=data, out_dir=work, n_gpus=1, device=device
    )
    cmd = [c for c in cmd if not c.startswith("trainer.logger")] + ["trainer.logger=[console]"]
    env = {**os.environ, **verl_env(device)}
    env.pop("RAY_ADDRESS", None)
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200, cwd=work)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-6000:]
    steps = metrics_by_step(log)
    assert sorted(steps) == [1, 2, 3, 4], log[-3000:]  # 64 chats, 16 a step, one epoch
    print({s: round(m["train/loss"], 3) for s, m in steps.items()}, flush=True)
    assert steps[4]["train/loss"] < steps[1]["train/loss"]  # it learns the format

    checkpoint = last_checkpoint(work)
    assert checkpoint.endswith("global_step_4")
    merged = str(tmp_path / "hf")
    moved, parameters = merged_changes(checkpoint, BASE, merged, env)
    assert len(moved) == parameters  # SFT moved every weight
    assert AutoTokenizer.from_pretrained(
        merged
    ).chat_template  # the next stage renders the same chats

    # a retry after the last epoch's checkpoint resumes there and trains nothing more
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200, cwd=work)
    assert again.returncode == 0, (again.stdout + again.stderr)[-4000:]
    assert not metrics_by_step(again.stdout + again.stderr)
