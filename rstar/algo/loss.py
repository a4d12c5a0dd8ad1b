"""Advantages and the policy loss, through verl's own core_algos (the same code verl's trainer
runs on GPUs): GRPO advantage (r - mean) / std over each kept group; clipped surrogate with
clip-higher (eps_low 0.2, eps_high 0.28), token-mean over all kept model tokens (tool tokens
are masked out), no KL term, no entropy bonus.

verl is imported where it is used: `import verl` takes ~10 s, and the recipe's schema imports
this module's trainer, so a recipe check would otherwise wait for it."""

from __future__ import annotations

import numpy as np
import torch
from omegaconf import OmegaConf


def grpo_advantages(
    rewards: torch.Tensor, response_mask: torch.Tensor, group_ids: list[str]
) -> torch.Tensor:
    """rewards: (batch,), response_mask: (batch, T) -> advantages (batch, T), zero off the mask."""
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    token_rewards = torch.zeros_like(response_mask, dtype=torch.float32)
    # an outcome reward: verl sums each row, the position is moot
    token_rewards[:, 0] = rewards.float()
    adv, _ = compute_grpo_outcome_advantage(
        token_rewards, response_mask.float(), np.array(group_ids)
    )
    return adv


def policy_loss(
    old_log_probs: torch.Tensor,
    log_probs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    batch_num_tokens: int | None = None,
) -> tuple[torch.Tensor, dict]:
    """Clipped surrogate, token-mean over the mask. `batch_num_tokens`: the whole batch's token
    count when the loss is computed in micro-batches (so accumulation gives the batch mean)."""
    from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla

    cfg = OmegaConf.create(
        {
            "clip_ratio": clip_low,
            "clip_ratio_low": clip_low,
            "clip_ratio_high": clip_high,
            "clip_ratio_c": 3.0,
            "global_batch_info": {"batch_num_tokens": batch_num_tokens} if batch_num_tokens else {},
        }
    )
    loss, metrics = compute_policy_loss_vanilla(
        old_log_probs,
        log_probs,
        advantages,
        response_mask.float(),
        loss_agg_mode="token-mean",
        config=cfg,
    )
    return loss, {"clip_fraction": metrics["actor/pg_clipfrac"]}
