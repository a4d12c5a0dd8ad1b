"""The evaluation protocol's settings, the schema of a recipe's `eval` section
(rstar.pipeline.config). Apart from the protocol so that reading a recipe loads none of it."""

from __future__ import annotations

from dataclasses import dataclass, field

from rstar.agent.sampling import EVAL_SAMPLING, Sampling


@dataclass
class EvalConfig:
    # a recipe (rstar.pipeline.config) may not add unknown keys
    __pydantic_config__ = {"extra": "forbid"}
    k: int = 16
    sampling: Sampling = field(default_factory=lambda: EVAL_SAMPLING)
    seed: int = 0
    # the pipeline also evaluates its base model: a chat model's starting point (the tiny base
    # is a language model that has never seen a chat, so its recipe leaves this off)
    include_base: bool = False
