"""The training stages' settings, the schema of a recipe's `sft` and `rl` sections
(rstar.pipeline.config). Apart from the trainers so that reading a recipe imports no torch."""

from __future__ import annotations

from dataclasses import dataclass, field

from rstar.agent.sampling import Sampling
from rstar.algo.roc import RoCConfig


def warmup_share(update: int, warmup_steps: int) -> float:
    """The share of an RL stage's learning rate at its `update`-th update (from 0): linear from
    1/warmup_steps up to the full rate, then constant. Never 0: a first update at rate 0 would
    be a rollout batch sampled for nothing."""
    return min(1.0, (update + 1) / max(1, warmup_steps))


@dataclass
class SFTConfig:
    """The non-reasoning SFT stage: a recipe's `sft` section's training settings."""

    # a recipe (rstar.pipeline.config) may not add unknown keys
    __pydantic_config__ = {"extra": "forbid"}
    epochs: int = 3
    lr: float = 5e-6
    warmup_ratio: float = 0.04
    batch_size: int = 16  # examples per optimizer step (after accumulation)
    micro_batch_size: int = 8
    max_grad_norm: float = 1.0
    weight_decay: float = 0.0
    max_length: int = 1024
    seed: int = 0
    prompt_style: str = (
        "paper"  # the system prompt and tools block RL will use (rstar.agent.format.STYLES)
    )
    # Rows of the tiny base's pretraining text added to every step (language-modelling loss,
    # same weight): without them a few hundred steps on chats overwrite what the base learnt
    # from it, copying numbers first. 0 for a real base model.
    replay_rows: int = 0


@dataclass
class RLConfig:
    """One GRPO-RoC stage: an entry of a recipe's `rl` list (rl1, rl2, rl3 in the paper)."""

    # a recipe (rstar.pipeline.config) may not add unknown keys
    __pydantic_config__ = {"extra": "forbid"}
    name: str = "rl1"
    steps: int = 10
    prompts_per_step: int = 8
    roc: RoCConfig = field(default_factory=lambda: RoCConfig(group_size=4))
    sampling: Sampling = field(default_factory=Sampling)  # how the stage's rollouts are sampled
    lr: float = 1e-5
    warmup_steps: int = 2
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    micro_batch_size: int = 8
    # Optimizer steps per rollout batch (PPO mini-batches, verl's ppo_mini_batch_size =
    # prompts_per_step / mini_batches): each takes whole groups; old log-probs are computed once.
    mini_batches: int = 1
    clip_low: float = 0.2
    clip_high: float = 0.28
    init_from: str | None = None  # the previous stage's checkpoint directory, if any
    # start with fresh AdamW moments instead of init_from's (the paper resets before stage 3)
    reset_optimizer: bool = False
    checkpoint_every: int = 1  # steps between checkpoints (a crash redoes at most this many steps)
    checkpoints_kept: int = (
        1  # verl keeps this many (with optimizer state); the local trainer keeps the last
    )
    seed: int = 0
    prompt_style: str = "paper"  # rstar.agent.format.STYLES; a recipe sets it once for all stages
