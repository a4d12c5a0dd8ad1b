"""How rollouts are sampled: the one home of these settings and their defaults. A recipe has a
`sampling:` block per use (each RL stage, mining, evaluation: rstar.pipeline.config), passed
as it is to the agent loop (rstar.agent.loop.AgentLoop) and, on the cluster path, to verl."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Sampling:
    # a recipe (rstar.pipeline.config) may not add unknown keys
    __pydantic_config__ = {"extra": "forbid"}
    temperature: float = 1.0
    top_p: float = 1.0
    max_response_tokens: int = 8192  # model and tool tokens together, over all turns
    max_turns: int = 10  # model turns; each but the last may call the tool
    max_tool_response_tokens: int = 1024  # a longer tool response is cut, with a mark
    tool_timeout_s: float = 10.0  # per tool call, in the sandbox


# The paper's evaluation protocol: temperature 0.6, budgets large enough not to cut a solution
EVAL_SAMPLING = Sampling(temperature=0.6, max_response_tokens=30_000, max_turns=30)
