"""The agent loop against verl's own `ToolAgentLoop`, over one engine and one sandbox.

Both loops run the same problems through the same HF engine (one continuous batch, the same
server interface verl's rollout replicas have) and the same sandbox service (this project's
tool as a verl tool: verl 0.9.1 ships no SandboxFusion tool of its own). Measured per loop:
rollouts/s, and the time each turn spends outside generation and tool calls (the loop's own
work: rendering, tokenizing, parsing), from each rollout's own timeline; with greedy decoding,
whether the two record the same response token ids and loss masks.

verl's loop renders the prompt with its tools listed on every prompt; like TRL's, it gets this
project's template with the tools block switched off (rstar.bench.peers.trl_grpo.trl_chat_template),
so both send the compact prompt the tiny model learnt.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import time
from dataclasses import dataclass

from rstar.agent.format import EOS, IM_END, STYLES
from rstar.agent.loop import AgentLoop
from rstar.train.config import RLConfig


class TimedEngine:
    """An engine that adds up, per rollout, the time its generate calls took."""

    def __init__(self, engine) -> None:
        self.engine, self.generate_s = engine, 0.0

    async def generate(self, request_id: str, prompt_ids: list[int], sampling_params: dict):
        start = time.monotonic()
        try:
            return await self.engine.generate(request_id, prompt_ids, sampling_params)
        finally:
            self.generate_s += time.monotonic() - start


class VerlServer:
    """verl's token-in/token-out server interface (what its rollout replicas offer) over an engine;
    like verl's servers, a turn may use what is left of the context."""

    def __init__(self, engine: TimedEngine, max_model_len: int) -> None:
        self.engine, self.max_model_len = engine, max_model_len

    async def generate(self, request_id: str, prompt_ids: list[int], sampling_params: dict, **_):
        from rstar.agent.verl_adapter import engine_token_output

        return await engine_token_output(
            self.engine,
            request_id,
            prompt_ids,
            sampling_params,
            self.max_model_len - len(prompt_ids),
        )


@dataclass
class LoopResult:
    loop: str
    rollouts: int
    wall_s: float
    turns: int
    own_s_per_turn: float  # outside generation and tool calls
    response_ids: list[list[int]]
    response_masks: list[list[int]]


def _verl_config(cfg: RLConfig, prompt_length: int):
    from omegaconf import OmegaConf

    return OmegaConf.create(
        {
            "actor_rollout_ref": {
                "rollout": {
                    "prompt_length": prompt_length,
                    "response_length": cfg.sampling.max_response_tokens,
                    "full_determinism": False,
                    "multi_turn": {
                        "max_user_turns": cfg.sampling.max_turns - 1,
                        "max_assistant_turns": cfg.sampling.max_turns,
                        "max_parallel_calls": 1,
                        "max_tool_response_length": cfg.sampling.max_tool_response_tokens,
                        "tool_response_truncate_side": "right",
                        "format": "hermes",
                    },
                }
            }
        }
    )


async def run_verl_loop(
    model_dir: str,
    problems: list[dict],
    cfg: RLConfig,
    sandbox_url: str,
    engine,
    *,
    model_type: bool = True,
) -> LoopResult:
    """verl's ToolAgentLoop; `model_type=False` leaves verl to pick its token builder without the
    model's type (what a config that does not pass it gets)."""
    from transformers import AutoTokenizer
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
    from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop

    from rstar.agent.verl_adapter import SandboxTool
    from rstar.bench.peers.trl_grpo import trl_chat_template

    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.chat_template = trl_chat_template()
    timed = TimedEngine(engine)
    prompt_length = 1024
    server = VerlServer(timed, prompt_length + cfg.sampling.max_response_tokens)
    with contextlib.redirect_stdout(io.StringIO()):  # verl's BaseTool prints its schema
        tool = SandboxTool({"sandbox_url": sandbox_url, "timeout_s": cfg.sampling.tool_timeout_s})
    timed_tool = _timed_tool(tool)
    from transformers import AutoConfig

    agent = ToolAgentLoop(
        DictConfigWrap(_verl_config(cfg, prompt_length)),
        server,
        tok,
        None,
        None,
        DictConfigWrap({}),
        hf_model_type=AutoConfig.from_pretrained(model_dir).model_type if model_type else None,
        tools=ToolListWrap([timed_tool]),
    )
    params = {
        "temperature": cfg.sampling.temperature,
        "top_p": cfg.sampling.top_p,
        "stop_token_ids": [tok.convert_tokens_to_ids(IM_END), tok.convert_tokens_to_ids(EOS)],
    }
    style = STYLES[cfg.prompt_style]

    async def one(p: dict):
        start = time.monotonic()
        out = await agent.run(params, raw_prompt=style.messages(p["problem"]))
        return out, time.monotonic() - start

    start = time.monotonic()
    outs = await asyncio.gather(*(one(p) for p in problems))
    wall = time.monotonic() - start
    # verl counts user, assistant and tool turns
    turns = sum(o.num_turns // 2 for o, _ in outs) or 1
    own = sum(w for _, w in outs) - timed.generate_s - timed_tool.spent_s
    name = "verl ToolAgentLoop" + ("" if model_type else " (no model_type)")
    return LoopResult(
        name,
        len(outs),
        wall,
        turns,
        own / turns,
        [list(o.response_ids) for o, _ in outs],
        [list(o.response_mask) for o, _ in outs],
    )


def _timed_tool(tool):
    execute = tool.execute
    tool.spent_s = 0.0

    async def timed(instance_id, parameters, **kw):
        start = time.monotonic()
        try:
            return await execute(instance_id, parameters, **kw)
        finally:
            tool.spent_s += time.monotonic() - start

    tool.execute = timed
    return tool


async def run_rstar_loop(
    tokenizer, problems: list[dict], cfg: RLConfig, sandbox, engine
) -> LoopResult:
    timed = TimedEngine(engine)
    agent = AgentLoop(timed, tokenizer, sandbox, cfg.sampling, cfg.prompt_style)

    async def one(i: int, p: dict):
        start = time.monotonic()
        traj = await agent.run(p["problem"], f"r{i}")
        return traj, time.monotonic() - start

    start = time.monotonic()
    outs = await asyncio.gather(*(one(i, p) for i, p in enumerate(problems)))
    wall = time.monotonic() - start
    turns = sum(t.turns for t, _ in outs) or 1
    own = sum(w for _, w in outs) - timed.generate_s - sum(t.tool_s for t, _ in outs)
    return LoopResult(
        "rstar AgentLoop",
        len(outs),
        wall,
        turns,
        own / turns,
        [t.response_ids for t, _ in outs],
        [t.response_mask for t, _ in outs],
    )


async def compare_loops(model_dir: str, problems: list[dict], cfg: RLConfig) -> list[LoopResult]:
    """Both loops, one after the other, over one engine and one sandbox service."""
    from transformers import AutoTokenizer

    from rstar.agent.verl_adapter import close_sandbox_clients
    from rstar.rollout.hf_engine import HFEngine
    from rstar.sandbox.client import SandboxClient
    from rstar.sandbox.process import SandboxProcess

    engine = HFEngine.from_pretrained(model_dir)
    try:
        with SandboxProcess() as service:
            async with SandboxClient(service.url) as client:
                ours = await run_rstar_loop(
                    AutoTokenizer.from_pretrained(model_dir), problems, cfg, client, engine
                )
            theirs = await run_verl_loop(model_dir, problems, cfg, service.url, engine)
            untyped = await run_verl_loop(
                model_dir, problems, cfg, service.url, engine, model_type=False
            )
            await close_sandbox_clients()
    finally:
        await engine.close()
    return [ours, theirs, untyped]


def _same(a: LoopResult, b: LoopResult) -> tuple[int, int]:
    return (
        sum(x == y for x, y in zip(a.response_ids, b.response_ids)),
        sum(x == y for x, y in zip(a.response_masks, b.response_masks)),
    )


def report(results: list[LoopResult], cfg: RLConfig) -> list[str]:
    ours, theirs, untyped = results
    same_ids, same_masks = _same(ours, theirs)
    met = ours.own_s_per_turn <= theirs.own_s_per_turn
    return [
        "### The agent loop against verl's ToolAgentLoop",
        "",
        f"{ours.rollouts} training problems, one rollout each, greedy (so the two can be compared "
        f"token for token), at most {cfg.sampling.max_turns} turns and "
        f"{cfg.sampling.max_response_tokens} response tokens, through one HF engine (verl's "
        "server interface for verl's loop) and one sandbox "
        "service (this project's tool as a verl tool). Own time per turn: each rollout's wall "
        "time less its generate calls and tool calls, summed, over the turns.",
        "",
        "| loop | rollouts/s | turns | own ms per turn |",
        "|---|---|---|---|",
        *(
            f"| {r.loop} | {r.rollouts / r.wall_s:.1f} | {r.turns} | {r.own_s_per_turn * 1e3:.2f} |"
            for r in (ours, theirs)
        ),
        "",
        f"Same response token ids: {same_ids} of {ours.rollouts}; same loss masks: {same_masks} of "
        f"{ours.rollouts}. Target: the agent loop's own time per turn no higher than verl's: "
        f"{ours.own_s_per_turn * 1e3:.2f} vs {theirs.own_s_per_turn * 1e3:.2f} ms, "
        f"{'met' if met else 'NOT met'}.",
        "verl's loop is given the model's `model_type`; without it (verl's default token builder) "
        f"{_same(ours, untyped)[0]} of {ours.rollouts} rollouts have the same token ids: that "
        "builder drops the newline after the model's `<|im_end|>` before a tool turn, a context "
        "the chat template never renders.",
    ]
