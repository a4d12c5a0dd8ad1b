"""The cluster path: the same stage config run by verl on Ray (FSDP actor, vLLM rollouts).

What it plugs into verl:
- the agent loop `rstar_agent` (rstar.agent.verl_adapter.RStarAgentLoop), named by each
  dataset row's `agent_name` and registered through an agent-loop config file;
- the answer-only reward as verl's custom reward function (`compute_score`);
- GRPO advantages with clip-higher, token-mean loss, no KL, no entropy bonus, via config;
- RoC down-sampling: `roc_filter` on verl's DataProto, to run between reward and advantage.
  Not wired into verl's trainer yet: a launched run samples 2G rollouts and does plain GRPO
  over all of them until a trainer subclass calls `roc_filter` (tracked in the issue).

`build_verl_run` writes the dataset and agent-loop files and returns the `python -m
verl.trainer.main_ppo ...` command with its Hydra overrides; it needs GPUs to run.
"""
from __future__ import annotations

import os
import random
import sys

import numpy as np

from rstar.agent.format import problem_messages
from rstar.algo.roc import Sample, p_err, p_format, select
from rstar.data.io import read_table
from rstar.train.rl import StageConfig


def to_verl_rows(problems: list[dict], prompt_style: str = "paper") -> list[dict]:
    """Problems in the layout verl's RLHFDataset reads."""
    return [{"data_source": p["source"], "agent_name": "rstar_agent",
             "prompt": problem_messages(p["problem"], prompt_style),
             "reward_model": {"style": "rule", "ground_truth": p["answer"]},
             "extra_info": {"index": i, "problem": p["problem"], "problem_id": p["id"]}}
            for i, p in enumerate(problems)]


def roc_filter(data, cfg: StageConfig, seed: int):
    """Keep the RoC selection of each prompt's rollouts in a verl DataProto batch (rows grouped
    by `uid`; rewards in `token_level_scores`; penalty inputs in the agent loop's extra fields)."""
    rewards = data.batch["token_level_scores"].sum(-1).tolist()
    nt = data.non_tensor_batch
    groups: dict[str, list[int]] = {}
    for i, uid in enumerate(nt["uid"]):
        groups.setdefault(str(uid), []).append(i)
    rng = random.Random(seed)
    keep: list[int] = []
    for uid in sorted(groups):
        rows = groups[uid]
        samples = [Sample(rewards[i], p_err(int(nt["rstar_num_tool_calls"][i]), int(nt["rstar_num_tool_errors"][i])),
                          p_format(int(nt["rstar_num_answers"][i]), int(nt["rstar_turns"][i]))) for i in rows]
        keep += [rows[j] for j in select(samples, cfg.roc, rng)]
    return data.select_idxs(np.array(sorted(keep), dtype=np.int64))


def verl_overrides(cfg: StageConfig, *, model: str, train_files: str, agent_loop_config: str, sandbox_url: str,
                   out_dir: str, n_gpus: int, nodes: int = 1, max_prompt_length: int = 2048,
                   val_files: str | None = None, experiment: str = "rstar") -> list[str]:
    """Hydra overrides for verl's main_ppo that reproduce `cfg` (paper defaults otherwise).

    Micro-batches are sized by tokens (dynamic batch size: a GPU's batch holds up to two full
    sequences' worth), so no per-GPU micro-batch count needs guessing for 8K-12K responses.
    Validation runs on `val_files` (the held-out set) after the last step only; without it,
    never. Metrics go to the console and to MLflow (the run named by MLFLOW_RUN_ID, the
    stage's own, when the launcher sets it)."""
    reward_file = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "agent", "verl_adapter.py")
    tokens_per_gpu = 2 * (max_prompt_length + cfg.max_response_tokens)
    return [
        "algorithm.adv_estimator=grpo", "algorithm.use_kl_in_reward=false",
        f"data.train_files={train_files}", f"data.val_files={val_files or train_files}",
        f"data.train_batch_size={cfg.prompts_per_step}", f"data.max_prompt_length={max_prompt_length}",
        f"data.max_response_length={cfg.max_response_tokens}", "data.return_raw_chat=true",
        f"actor_rollout_ref.model.path={model}",
        f"actor_rollout_ref.actor.optim.lr={cfg.lr}", f"actor_rollout_ref.actor.optim.lr_warmup_steps={cfg.warmup_steps}",
        f"actor_rollout_ref.actor.optim.weight_decay={cfg.weight_decay}",
        f"actor_rollout_ref.actor.grad_clip={cfg.max_grad_norm}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={cfg.prompts_per_step // cfg.mini_batches}",
        f"actor_rollout_ref.actor.clip_ratio_low={cfg.clip_low}", f"actor_rollout_ref.actor.clip_ratio_high={cfg.clip_high}",
        "actor_rollout_ref.actor.loss_agg_mode=token-mean", "actor_rollout_ref.actor.use_kl_loss=false",
        "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.actor.use_dynamic_bsz=true", f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={tokens_per_gpu}",
        "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true",
        f"actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu={tokens_per_gpu}",
        "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.mode=async",
        f"actor_rollout_ref.rollout.n={cfg.roc.group_size * cfg.roc.oversample}",
        f"actor_rollout_ref.rollout.temperature={cfg.temperature}",
        f"actor_rollout_ref.rollout.response_length={cfg.max_response_tokens}",
        f"actor_rollout_ref.rollout.prompt_length={max_prompt_length}",
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={agent_loop_config}",
        "actor_rollout_ref.rollout.agent.default_agent_loop=rstar_agent",
        f"reward.custom_reward_function.path={os.path.abspath(reward_file)}",
        "reward.custom_reward_function.name=compute_score",
        f"+rstar.sandbox_url={sandbox_url}", f"+rstar.max_turns={cfg.max_turns}",
        f"+rstar.roc_mode={cfg.roc.mode}", f"+rstar.group_size={cfg.roc.group_size}",
        f"trainer.total_training_steps={cfg.steps}", f"trainer.default_local_dir={out_dir}",
        f"trainer.n_gpus_per_node={n_gpus}", f"trainer.nnodes={nodes}", f"trainer.save_freq={cfg.checkpoint_every}",
        f"trainer.max_actor_ckpt_to_keep={cfg.checkpoints_kept}", "trainer.resume_mode=auto",
        "trainer.val_before_train=false", f"trainer.test_freq={cfg.steps if val_files else -1}",
        f"trainer.project_name={experiment}", f"trainer.experiment_name={cfg.name}", "trainer.logger=[console,mlflow]",
    ]


def verl_command(cfg: StageConfig, **kwargs) -> list[str]:
    """`python -m verl.trainer.main_ppo` with the overrides for `cfg` (kwargs: verl_overrides')."""
    return [sys.executable, "-m", "verl.trainer.main_ppo", *verl_overrides(cfg, **kwargs)]


def build_verl_run(cfg: StageConfig, *, model: str, problems: str, sandbox_url: str, out_dir: str,
                   n_gpus: int, nodes: int = 1, val_problems: str | None = None, experiment: str = "rstar") -> list[str]:
    """Write verl's dataset files (training, and validation from `val_problems`) and agent-loop
    file under `out_dir`; return the command to run."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(out_dir, exist_ok=True)

    def dataset(source: str, name: str) -> str:
        path = os.path.join(out_dir, name)
        rows = read_table(source, ("problems", "hard_problems")).to_pylist()
        pq.write_table(pa.Table.from_pylist(to_verl_rows(rows, cfg.prompt_style)), path)
        return path

    train_files = dataset(problems, "verl_train.parquet")
    val_files = dataset(val_problems, "verl_val.parquet") if val_problems else None
    agent_cfg = os.path.join(out_dir, "agent_loops.yaml")
    with open(agent_cfg, "w") as f:
        f.write("- name: rstar_agent\n  _target_: rstar.agent.verl_adapter.RStarAgentLoop\n")
    return verl_command(cfg, model=model, train_files=train_files, agent_loop_config=agent_cfg,
                        sandbox_url=sandbox_url, out_dir=out_dir, n_gpus=n_gpus, nodes=nodes, val_files=val_files,
                        experiment=experiment)
