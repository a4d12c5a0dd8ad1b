"""The cluster path on CPU: stage config -> verl's Hydra config (composed with verl's own
schema), dataset rows, RoC on verl's DataProto. The GPU run itself is marked `gpu`."""

import numpy as np
import pytest
import torch

pytest.importorskip("verl")

from rstar.algo.roc import RoCConfig  # noqa: E402
from rstar.data import synth  # noqa: E402
from rstar.data.io import write_table  # noqa: E402
from rstar.train.rl import StageConfig  # noqa: E402
from rstar.pipeline.plan import compose_verl  # noqa: E402
from rstar.train.verl_launcher import build_verl_run, roc_filter, to_verl_rows, verl_overrides  # noqa: E402

STAGE = StageConfig(name="rl1", steps=300, prompts_per_step=512, roc=RoCConfig(group_size=16),
                    max_response_tokens=8192, max_turns=10, lr=1e-6, warmup_steps=20, mini_batches=4)


def test_overrides_compose_and_pass_verls_own_validation(tmp_path):
    from verl.trainer.ppo.reward import get_custom_reward_fn
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    cfg = compose_verl(verl_overrides(STAGE, model="/models/qwen3-14b-base", train_files="/data/train.parquet",
                                  agent_loop_config="/run/agent_loops.yaml", sandbox_url="http://sandbox:8080",
                                  out_dir="/run/rl1", n_gpus=8, nodes=8, val_files="/data/eval.parquet",
                                  experiment="rstar-qwen3-14b"))
    # what main_ppo runs before it starts Ray: no critic, no reference model (no KL), sizes consistent
    assert not need_critic(cfg) and not need_reference_policy(cfg)
    validate_config(cfg, use_reference_policy=False, use_critic=False)
    actor, rollout = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    assert cfg.algorithm.adv_estimator == "grpo" and cfg.algorithm.use_kl_in_reward is False
    assert (actor.clip_ratio_low, actor.clip_ratio_high, actor.loss_agg_mode) == (0.2, 0.28, "token-mean")
    assert actor.use_kl_loss is False and actor.entropy_coeff == 0 and actor.optim.lr == 1e-6
    assert actor.optim.lr_warmup_steps == 20
    assert actor.use_dynamic_bsz and actor.ppo_max_token_len_per_gpu >= 2048 + 8192
    assert rollout.n == 32 and rollout.response_length == 8192 and rollout.name == "vllm"
    assert rollout.agent.default_agent_loop == "rstar_agent"
    assert cfg.data.train_batch_size == 512 and cfg.trainer.nnodes == 8
    assert actor.ppo_mini_batch_size == 128   # 4 optimizer steps per rollout batch
    assert cfg.rstar.sandbox_url == "http://sandbox:8080" and cfg.rstar.max_turns == 10
    # validation on the held-out set once, at the end; checkpoints as the recipe says, capped
    assert cfg.data.val_files == "/data/eval.parquet" and cfg.trainer.val_before_train is False
    assert cfg.trainer.test_freq == STAGE.steps
    assert cfg.trainer.save_freq == STAGE.checkpoint_every and cfg.trainer.max_actor_ckpt_to_keep == 1
    assert list(cfg.trainer.logger) == ["console", "mlflow"] and cfg.trainer.project_name == "rstar-qwen3-14b"
    # the reward verl loads is the project's answer-only reward, truncation scoring 0
    reward = get_custom_reward_fn(cfg)
    answer = "<reason>done</reason>\n<answer>\\boxed{42}</answer>"
    assert reward("dapo", answer, "42") == 1.0 and reward("dapo", answer, "41") == 0.0
    assert reward("dapo", answer, "42", extra_info={"rstar_truncated": True}) == 0.0


def test_build_writes_dataset_and_agent_loop_files(tmp_path):
    problems = str(tmp_path / "p.parquet")
    write_table(synth.generate(4, seed=1), problems, "problems")
    cmd = build_verl_run(STAGE, model="m", problems=problems, sandbox_url="http://s", out_dir=str(tmp_path / "run"),
                         n_gpus=8)
    assert cmd[1:3] == ["-m", "verl.trainer.main_ppo"]
    import pyarrow.parquet as pq

    rows = pq.read_table(tmp_path / "run" / "verl_train.parquet").to_pylist()
    assert rows[0]["agent_name"] == "rstar_agent" and rows[0]["prompt"][0]["role"] == "system"
    assert rows[0]["reward_model"]["ground_truth"] == synth.generate(4, seed=1)[0]["answer"]
    assert "RStarAgentLoop" in (tmp_path / "run" / "agent_loops.yaml").read_text()
    assert to_verl_rows([]) == []


def test_roc_filter_on_a_dataproto():
    from verl.protocol import DataProto

    uids = np.array(["a"] * 8 + ["b"] * 8, dtype=object)
    rewards = torch.tensor([1, 1, 1, 0, 0, 0, 0, 0] + [1] * 8, dtype=torch.float32)
    scores = torch.zeros(16, 5)
    scores[:, -1] = rewards
    n_calls = np.array([2, 2, 2, 1, 1, 1, 1, 1] * 2)
    n_err = np.array([0, 2, 2, 0, 0, 0, 0, 0] * 2)
    data = DataProto.from_dict(tensors={"token_level_scores": scores, "responses": torch.arange(80).view(16, 5)},
                               non_tensors={"uid": uids, "rstar_num_tool_calls": n_calls, "rstar_num_tool_errors": n_err,
                                            "rstar_num_answers": np.ones(16, dtype=int), "rstar_turns": np.full(16, 3)})
    cfg = StageConfig(roc=RoCConfig(group_size=4))
    kept = roc_filter(data, cfg, seed=0)
    assert len(kept) == 8  # 4 of each prompt's 8
    kept_uids = list(kept.non_tensor_batch["uid"])
    assert kept_uids.count("a") == 4 and kept_uids.count("b") == 4
    a_rewards = kept.batch["token_level_scores"][:4].sum(-1).tolist()
    assert sorted(a_rewards) == [0.0, 0.0, 1.0, 1.0]  # floor(4 * 3/8 + 0.5) = 2 positives
    # rows stay whole: each kept row's tensors are the original row's
    for row in kept.batch["responses"]:
        assert row[0].item() % 5 == 0 and torch.equal(row, torch.arange(row[0].item(), row[0].item() + 5))


@pytest.mark.gpu
def test_verl_smoke_run_on_gpu(tiny_dir, tmp_path):
    import subprocess

    from rstar.sandbox.process import SandboxProcess

    problems = str(tmp_path / "p.parquet")
    write_table(synth.generate(16, seed=1, levels=(1,)), problems, "problems")
    stage = StageConfig(name="smoke", steps=1, prompts_per_step=4, roc=RoCConfig(group_size=2),
                        max_response_tokens=128, max_turns=2)
    with SandboxProcess("--executors", "1") as sandbox:
        cmd = build_verl_run(stage, model=tiny_dir, problems=problems, sandbox_url=sandbox.url,
                             out_dir=str(tmp_path / "run"), n_gpus=1)
        assert subprocess.run(cmd, timeout=1200).returncode == 0
