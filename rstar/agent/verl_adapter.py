"""verl integration: the same agent loop, tool and reward, plugged into verl's extension points.

- `RStarAgentLoop` (registered as "rstar_agent"): a verl `AgentLoopBase` that runs
  `rstar.agent.loop.AgentLoop` against verl's server manager (vLLM replicas on GPUs).
- `ServerManagerEngine`: the token-in/token-out `Engine` over verl's server manager, and
  `engine_token_output` the other way round (an engine answering as a verl rollout server).
- `SandboxTool`: a verl `BaseTool` backed by the sandbox service, for verl's own tool loop.
- `compute_score`: the answer-only reward in verl's custom reward-function signature (the
  agent loop scores its own rollouts with the same function, so a rollout arrives at the
  trainer with its reward, `rm_scores`, and its RoC penalty counts in `rstar_*` fields).

The loop reads its settings from the `rstar` section of verl's config (written by
`rstar.train.verl_launcher`): sandbox_url, prompt_style and the stage's whole sampling block
(rstar.agent.sampling); temperature and top-p come with each request from verl, whose
validation samples at its own.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    register,
)
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

from rstar.agent.format import TOOL_SCHEMA
from rstar.agent.loop import AgentLoop, Generation, rollout_id_of
from rstar.agent.sampling import Sampling
from rstar.reward.extract import extract_answer
from rstar.reward.score import score
from rstar.sandbox.client import SandboxClient

# the extra field that carries a rollout's trajectory row, its tokens apart, to verl's trainer
ROW_FIELD = "rstar_row"


class ServerManagerEngine:
    """Every turn of a rollout goes to verl under the rollout's id (the agent loop's request id
    without its `/turn`), so verl's router sends it back to the replica that caches its prefix;
    vLLM is asked for the sampled tokens' log-probs (verl's `rollout_log_probs`)."""

    def __init__(self, server_manager) -> None:
        self.server_manager = server_manager

    async def generate(
        self, request_id: str, prompt_ids: list[int], sampling_params: dict
    ) -> Generation:
        out = await self.server_manager.generate(
            request_id=rollout_id_of(request_id),
            prompt_ids=prompt_ids,
            sampling_params={**sampling_params, "logprobs": True},
        )
        ids = list(out.token_ids)
        if out.stop_reason == "aborted":
            stop = "aborted"
        elif (
            len(ids) >= sampling_params["max_tokens"]
            and ids[-1:] != sampling_params.get("stop_token_ids", [])[:1]
        ):
            stop = "length"
        else:
            stop = "stop"
        return Generation(
            ids, list(out.log_probs) if out.log_probs is not None else [0.0] * len(ids), None, stop
        )


async def engine_token_output(
    engine,
    request_id: str,
    prompt_ids: list[int],
    sampling_params: dict,
    max_tokens: int,
    **extra_fields,
):
    """What verl's rollout servers answer to `generate` (a TokenOutput), from one of this
    project's engines (the peers bench: verl's agent loop over the HF engine)."""
    from verl.workers.rollout.replica import TokenOutput

    params = {
        k: sampling_params[k]
        for k in ("temperature", "top_p", "stop_token_ids")
        if k in sampling_params
    }
    gen = await engine.generate(request_id, prompt_ids, {**params, "max_tokens": max_tokens})
    return TokenOutput(
        token_ids=gen.token_ids,
        log_probs=gen.log_probs,
        stop_reason="completed",
        extra_fields=extra_fields,
    )


_clients: dict[str, SandboxClient] = {}


async def sandbox_client(url: str) -> SandboxClient:
    """One batching client per sandbox URL per process (verl runs many loops concurrently)."""
    if url not in _clients:
        _clients[url] = await SandboxClient(url).__aenter__()
    return _clients[url]


async def close_sandbox_clients() -> None:
    while _clients:
        await _clients.popitem()[1].close()


@register("rstar_agent")
class RStarAgentLoop(AgentLoopBase):
    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        rcfg = self.config["rstar"]
        response_length = self.rollout_config.response_length
        sampling = Sampling(**rcfg["sampling"])
        sampling = replace(  # verl's own where it has them: its validation samples its way
            sampling,
            temperature=sampling_params.get("temperature", sampling.temperature),
            top_p=sampling_params.get("top_p", sampling.top_p),
            max_response_tokens=response_length,
        )
        sandbox = await sandbox_client(rcfg["sandbox_url"])
        loop = AgentLoop(
            ServerManagerEngine(self.server_manager),
            self.tokenizer,
            sandbox,
            sampling,
            rcfg["prompt_style"],
        )
        extra = kwargs.get("extra_info") or {}
        traj = await loop.run(extra["problem"], uuid4().hex)
        # verl pads prompts to this width, never cuts
        if len(traj.prompt_ids) > self.rollout_config.prompt_length:
            raise ValueError(
                f"problem {extra.get('problem_id')}: its prompt has {len(traj.prompt_ids)} tokens, "
                f"more than rollout.prompt_length={self.rollout_config.prompt_length}"
            )
        return AgentLoopOutput(
            prompt_ids=traj.prompt_ids,
            response_ids=traj.response_ids[:response_length],
            response_mask=traj.response_mask[:response_length],
            response_logprobs=traj.log_probs[:response_length],
            num_turns=2 * traj.turns + 1,
            # answer-only, scored here (verl then skips its reward workers): truncated -> 0
            reward_score=reward_of(traj, kwargs.get("reward_model")),
            metrics=AgentLoopMetrics(generate_sequences=traj.generate_s, tool_calls=traj.tool_s),
            extra_fields={
                # read by the reward function (verl hands it the extra fields)
                "rstar_truncated": traj.truncated,
                ROW_FIELD: json.dumps(
                    {
                        "problem_id": str(extra.get("problem_id")),
                        "prompt_text": self.tokenizer.decode(
                            traj.prompt_ids, skip_special_tokens=False
                        ),
                        "answer": extract_answer(traj.response_text),
                        **traj.outcome(),
                    }
                ),
            },
        )


def reward_of(traj, reward_model: dict | None) -> float | None:
    """The rollout's answer-only reward, when its row names the ground truth (else verl's reward
    workers score it, with `compute_score`)."""
    if not reward_model or reward_model.get("ground_truth") is None:
        return None
    return score(traj.response_text, str(reward_model["ground_truth"]), truncated=traj.truncated)


class SandboxTool(BaseTool):
    """execute_python_code_with_standard_io for verl's ToolAgentLoop. Config: sandbox_url,
    timeout_s."""

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | None = None) -> None:
        super().__init__(
            config, tool_schema or OpenAIFunctionToolSchema.model_validate(TOOL_SCHEMA)
        )

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs
    ) -> tuple[ToolResponse, float, dict]:
        code, stdin = parameters.get("code"), parameters.get("input", "")
        if not isinstance(code, str) or not isinstance(stdin, str):
            return (
                ToolResponse(text='Invalid arguments: "code" and "input" must be strings.'),
                0.0,
                {"status": "parse_error"},
            )
        client = await sandbox_client(self.config["sandbox_url"])
        res = await client.run(code, stdin, timeout_s=self.config.get("timeout_s"))
        return (
            ToolResponse(text=res.tool_text()),
            0.0,
            {"status": res.status.value, "latency_s": res.wall_s},
        )


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None, **kwargs
) -> float:
    """verl's custom_reward_function signature; truncated rollouts (extra_info) score 0."""
    return score(
        solution_str,
        str(ground_truth),
        truncated=bool((extra_info or {}).get("rstar_truncated", False)),
    )
