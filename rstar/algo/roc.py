"""Resample-on-Correct (RoC): oversample 2G rollouts per prompt, keep G.

Paper semantics (the default, `mode="roc"`):
- negatives (reward 0) keep their share uniformly at random;
- positives (reward 1) keep their share by weighted sampling without replacement, weight
  w = 1 / (p_total + 0.1) with p_total = p_err + p_format in [0, 2]. A clean positive
  (p_total = 0) weighs 10, one with every call failing and no tool at all about 0.5: clean
  ones are strongly preferred, none is excluded;
- shares: of `target = min(G, n)` kept, positives get floor(target * n_pos / n + 0.5) (half
  of each kind when n = 2G, so the kept group has the sampled accuracy), but at least one of
  each kind when both were sampled; when one kind has fewer than its share, the other kind
  fills the rest, so the group always keeps `target`.

`mode="released"` reproduces the public code: groups whose rewards are all equal are dropped,
at least `min_each` of each kind is kept when available, and the lowest-penalty positives
are taken deterministically. `mode="grpo"` keeps everything (plain GRPO; sample G, not 2G).

Penalties: p_err = erroneous tool calls / tool calls (parse errors, errors, timeouts, kills),
0.5 with no tool call at all; p_format = 1 without an <answer>, else min(1, (answers-1)/turns),
where turns counts assistant turns (a lone answer without tools: 0). `released_penalties`
counts a call as an error when its response mentions "error", and the turn count off by one.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass

POSITIVE_WEIGHT_EPS = 0.1
_RESPONSE = re.compile(r"<tool_response>(.*?)</tool_response>", re.DOTALL)


def p_err(num_tool_calls: int, num_tool_errors: int) -> float:
    return 0.5 if num_tool_calls == 0 else num_tool_errors / num_tool_calls


def p_format(num_answers: int, turns: int) -> float:
    if num_answers == 0:
        return 1.0
    return min(1.0, (num_answers - 1) / max(turns, 1))


def released_penalties(response_text: str, num_answers: int, turns: int) -> tuple[float, float]:
    """The public release's p_err (text search for "error") and p_format (turns off by one)."""
    responses = _RESPONSE.findall(response_text)
    err = 0.5 if not responses else sum("error" in r.lower() for r in responses) / len(responses)
    tool_turns = turns - 1
    fmt = 1.0 if num_answers == 0 or tool_turns <= 0 else min(1.0, (num_answers - 1) / tool_turns)
    return err, fmt


@dataclass(frozen=True)
class Sample:
    reward: float
    p_err: float
    p_format: float

    @property
    def p_total(self) -> float:
        return self.p_err + self.p_format

    @property
    def positive(self) -> bool:
        return self.reward > 0


@dataclass
class RoCConfig:
    # a recipe (rstar.pipeline.config) may not add unknown keys
    __pydantic_config__ = {"extra": "forbid"}
    mode: str = "roc"  # "roc" (paper), "released" (public code), "grpo" (keep all)
    group_size: int = 16  # G: rollouts kept per prompt (2G are sampled for roc/released)
    min_each: int = 2  # released: at least this many of each kind when available

    def __post_init__(self) -> None:
        if self.mode not in ("roc", "released", "grpo"):
            raise ValueError(f"RoC mode must be 'roc', 'released' or 'grpo', not {self.mode!r}")

    @property
    def oversample(self) -> int:
        return 1 if self.mode == "grpo" else 2


def _weighted_without_replacement(
    items: list[int], weights: list[float], k: int, rng: random.Random
) -> list[int]:
    # Efraimidis-Spirakis: the k largest u^(1/w) are a weighted sample without replacement
    keyed = sorted(items, key=lambda i: rng.random() ** (1.0 / weights[i]), reverse=True)
    return keyed[:k]


def select(group: list[Sample], cfg: RoCConfig, rng: random.Random) -> list[int]:
    """Indices of the rollouts of one prompt to keep, in their original order."""
    n = len(group)
    if cfg.mode == "grpo":
        return list(range(n))
    pos = [i for i, s in enumerate(group) if s.positive]
    neg = [i for i, s in enumerate(group) if not s.positive]
    if cfg.mode == "released" and (not pos or not neg):
        return []  # all rewards equal: no signal, the group is dropped
    target = min(cfg.group_size, n)
    k_pos = min(len(pos), math.floor(target * len(pos) / n + 0.5))
    if cfg.mode == "released":
        k_pos = max(k_pos, min(cfg.min_each, len(pos)))
        k_pos = min(k_pos, target - min(cfg.min_each, len(neg)))
    if pos and neg and target >= 2:  # a group with both kinds keeps both: its learning signal
        k_pos = min(max(k_pos, 1), target - 1)
    k_neg = min(len(neg), target - k_pos)
    k_pos = min(len(pos), target - k_neg)
    if cfg.mode == "released":
        kept_pos = sorted(pos, key=lambda i: (group[i].p_total, i))[:k_pos]
    else:
        weights = {i: 1.0 / (group[i].p_total + POSITIVE_WEIGHT_EPS) for i in pos}
        kept_pos = _weighted_without_replacement(pos, weights, k_pos, rng)
    kept_neg = rng.sample(neg, k_neg)
    return sorted(kept_pos + kept_neg)


@dataclass(frozen=True)
class Rollout:
    """What RoC reads of one rollout: its prompt group, reward and the penalty counts."""

    group: str
    reward: float
    num_tool_calls: int
    num_tool_errors: int
    num_answers: int
    turns: int

    def sample(self) -> Sample:
        return Sample(
            self.reward,
            p_err(self.num_tool_calls, self.num_tool_errors),
            p_format(self.num_answers, self.turns),
        )


def keep_indices(rollouts: list[Rollout], cfg: RoCConfig, rng: random.Random) -> list[int]:
    """Indices of the rollouts RoC keeps from a batch of several prompts' groups: each group's
    `select`, groups taken in sorted order (so a seeded `rng` draws the same whatever order the
    groups arrive in), rows of a group in their batch order. The local trainer and verl's both
    call this."""
    groups: dict[str, list[int]] = {}
    for i, r in enumerate(rollouts):
        groups.setdefault(r.group, []).append(i)
    kept: list[int] = []
    for gid in sorted(groups):
        rows = groups[gid]
        kept += [rows[j] for j in select([rollouts[i].sample() for i in rows], cfg, rng)]
    return kept
