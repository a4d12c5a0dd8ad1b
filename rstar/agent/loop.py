"""The multi-turn agent loop: generate a turn, run its tool calls in the sandbox, append the
responses, repeat, until the model answers or a limit is hit. Token-level record included.

Engine-agnostic: it talks to anything with
`async generate(request_id, prompt_ids, sampling_params) -> Generation` (the local HF engine,
vLLM, or verl's server manager through the adapter in `rstar.agent.verl_adapter`), and to any
sandbox with `async run_many([ExecRequest]) -> [ExecResult]`.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Protocol

from rstar.agent.format import IM_END, parse_tool_calls, prompt_ids, tool_turn
from rstar.agent.sampling import Sampling
from rstar.sandbox.result import ExecRequest, ExecResult, Status

FINISH_REASONS = ("answered", "no_tool_call", "turn_limit", "length_limit")
TOOL_ERRORS = ("parse_error", "error", "timeout", "killed", "rejected")


@dataclass
class Generation:
    token_ids: list[int]
    log_probs: list[float]
    entropies: list[float] | None = None
    stop_reason: str = "stop"  # "stop": end of turn; "length": hit max_tokens; "aborted"


class Engine(Protocol):
    """Generates one turn. An engine that keeps state per rollout (a scheduler's homes) may also
    have `finished(rollout_id)`, which the loop calls when the rollout ends."""

    async def generate(
        self, request_id: str, prompt_ids: list[int], sampling_params: dict
    ) -> Generation: ...


def rollout_id_of(request_id: str) -> str:
    """The rollout a generation request belongs to: the loop asks for each turn as
    `<rollout id>/<turn>`, so engines and schedulers can keep a rollout's turns together."""
    return request_id.rsplit("/", 1)[0]


class Sandbox(Protocol):
    async def run_many(self, reqs: list[ExecRequest]) -> list[ExecResult]: ...


@dataclass
class ToolRecord:
    turn: int
    code: str
    status: str  # an ExecResult status, or "parse_error" for a call that could not be run
    latency_s: float
    detail: str = ""

    @property
    def is_error(self) -> bool:
        return self.status in TOOL_ERRORS


@dataclass
class Trajectory:
    request_id: str
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)  # 1: model token, 0: tool-response token
    log_probs: list[float] = field(default_factory=list)  # sampling log-prob (0.0 on tool tokens)
    entropies: list[float] = field(default_factory=list)  # per-token entropy (0.0 on tool tokens)
    turns: int = 0  # assistant turns
    tool_calls: list[ToolRecord] = field(default_factory=list)
    finish_reason: str = ""
    response_text: str = ""
    generate_s: float = 0.0
    tool_s: float = 0.0

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length_limit"

    @property
    def num_tool_errors(self) -> int:
        return sum(c.is_error for c in self.tool_calls)

    @property
    def num_answers(self) -> int:
        return self.response_text.count("<answer>")

    def to_record(
        self,
        *,
        problem_id: str,
        group_id: str,
        sample_index: int,
        stage: str,
        policy_step: int,
        prompt_text: str,
        reward: float,
        answer: str | None,
    ) -> dict:
        """A row of the trajectories schema (rstar.data.schema)."""
        return {
            "problem_id": problem_id,
            "group_id": group_id,
            "sample_index": sample_index,
            "stage": stage,
            "policy_step": policy_step,
            "prompt_text": prompt_text,
            "prompt_ids": self.prompt_ids,
            "response_ids": self.response_ids,
            "response_mask": self.response_mask,
            "log_probs": self.log_probs,
            "entropies": self.entropies,
            "reward": reward,
            "answer": answer,
            "prompt_len": len(self.prompt_ids),
            "response_len": len(self.response_ids),
            **self.outcome(),
        }

    def outcome(self) -> dict:
        """The fields of its row that the trajectory alone gives, its tokens apart (also what
        verl's agent loop hands verl's trainer for the row: rstar.train.verl_trajectories)."""
        return {
            "response_text": self.response_text,
            "finish_reason": self.finish_reason,
            "turns": self.turns,
            "num_answers": self.num_answers,
            "num_tool_calls": len(self.tool_calls),
            "num_tool_errors": self.num_tool_errors,
            "tool_calls": json.dumps([asdict(c) for c in self.tool_calls]),
            "generate_s": self.generate_s,
            "tool_s": self.tool_s,
        }

    def _append(self, ids: list[int], model: bool, log_probs=None, entropies=None) -> None:
        self.response_ids += ids
        self.response_mask += [int(model)] * len(ids)
        self.log_probs += log_probs if log_probs is not None else [0.0] * len(ids)
        self.entropies += entropies if entropies is not None else [0.0] * len(ids)


def tool_response(res: ExecResult, tokenizer, max_tokens: int) -> str:
    """What the model reads for a call's result: its output or error, cut to `max_tokens`."""
    text = res.tool_text() if res.status is not Status.REJECTED else f"Rejected: {res.reason}"
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) <= max_tokens:
        return text
    return (
        tokenizer.decode(ids[:max_tokens])
        + f"\n... [tool response truncated: {len(ids) - max_tokens} more tokens]"
    )


class AgentLoop:
    """Runs one problem to a `Trajectory`: the prompt in the model's chat template, then turns of
    generation (`engine`) and tool calls (`sandbox`, all of a turn's calls at once) with their
    responses appended as a user turn, until the model answers, a turn has no call, or the turn
    or token budget (`sampling`) runs out. It records every token with its log-prob and whether
    the model generated it (the loss mask), and each tool call's status.

    `sampling` is a recipe's block for this use (RL stage, mining, evaluation) as it is, and
    `prompt_style` the recipe's: the loop has no settings of its own."""

    def __init__(
        self,
        engine: Engine,
        tokenizer,
        sandbox: Sandbox,
        sampling: Sampling,
        prompt_style: str = "paper",
    ) -> None:
        self.engine = engine
        self.tok = tokenizer
        self.sandbox = sandbox
        self.sampling = sampling
        self.prompt_style = prompt_style  # a key of rstar.agent.format.STYLES
        self.stop_ids = [tokenizer.convert_tokens_to_ids(IM_END)]
        if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in self.stop_ids:
            self.stop_ids.append(tokenizer.eos_token_id)

    def prompt_ids(self, problem: str) -> list[int]:
        return prompt_ids(self.tok, problem, self.prompt_style)

    async def run(self, problem: str, request_id: str) -> Trajectory:
        try:
            return await self._turns(problem, request_id)
        finally:
            if finished := getattr(self.engine, "finished", None):
                finished(request_id)

    async def _turns(self, problem: str, request_id: str) -> Trajectory:
        sampling = self.sampling
        traj = Trajectory(request_id, self.prompt_ids(problem))
        texts: list[str] = []
        for turn in range(1, sampling.max_turns + 1):
            budget = sampling.max_response_tokens - len(traj.response_ids)
            if budget <= 0:
                traj.finish_reason = "length_limit"
                break
            start = time.monotonic()
            gen = await self.engine.generate(
                f"{request_id}/{turn}",
                traj.prompt_ids + traj.response_ids,
                {
                    "max_tokens": budget,
                    "temperature": sampling.temperature,
                    "top_p": sampling.top_p,
                    "stop_token_ids": self.stop_ids,
                },
            )
            traj.generate_s += time.monotonic() - start
            traj.turns = turn
            traj._append(gen.token_ids, True, gen.log_probs, gen.entropies)
            text = self.tok.decode(gen.token_ids, skip_special_tokens=False)
            texts.append(text)
            if gen.stop_reason != "stop":
                traj.finish_reason = "length_limit"
                break
            calls = parse_tool_calls(text)
            if not calls:
                traj.finish_reason = "answered" if "<answer>" in text else "no_tool_call"
                break
            if turn == sampling.max_turns:
                traj.finish_reason = "turn_limit"
                break
            responses = await self._run_tools(calls, turn, traj)
            tail = self.tok.encode(tool_turn(responses), add_special_tokens=False)
            room = sampling.max_response_tokens - len(traj.response_ids)
            traj._append(tail[:room], False)
            texts.append(self.tok.decode(tail[:room], skip_special_tokens=False))
            if len(tail) > room:
                traj.finish_reason = "length_limit"
                break
        traj.response_text = "".join(texts)
        return traj

    async def _run_tools(self, calls, turn: int, traj: Trajectory) -> list[str]:
        """Run a turn's calls concurrently; unusable calls answer with their parse error."""
        sampling = self.sampling
        runnable = [c for c in calls if c.error is None]
        start = time.monotonic()
        results = iter(
            await self.sandbox.run_many(
                [
                    ExecRequest(c.arguments["code"], c.arguments["input"], sampling.tool_timeout_s)
                    for c in runnable
                ]
            )
        )
        traj.tool_s += time.monotonic() - start
        responses = []
        for call in calls:
            if call.error is not None:
                traj.tool_calls.append(ToolRecord(turn, call.raw, "parse_error", 0.0, call.error))
                responses.append(call.error)
                continue
            res: ExecResult = next(results)
            traj.tool_calls.append(
                ToolRecord(turn, call.arguments["code"], res.status.value, res.wall_s, res.reason)
            )
            responses.append(tool_response(res, self.tok, sampling.max_tool_response_tokens))
        return responses

    async def run_many(self, problems: list[tuple[str, str]]) -> list[Trajectory]:
        """[(request_id, problem)] concurrently."""
        return list(await asyncio.gather(*(self.run(p, rid) for rid, p in problems)))
