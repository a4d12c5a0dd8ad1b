"""Sample k rollouts per problem through the agent loop, score them, and summarise."""

from __future__ import annotations

import asyncio
import json
import statistics
from collections.abc import Callable

from rstar.agent.loop import AgentLoop, Trajectory
from rstar.reward.extract import extract_answer
from rstar.reward.score import BatchScorer, ScoreItem
from rstar.sandbox.result import Status


async def sample(
    loop: AgentLoop,
    problems: list[dict],
    k: int,
    *,
    stage: str = "rollout",
    policy_step: int = 0,
    progress: Callable[[int], None] | None = None,
    seed_key: str | None = None,
) -> list[tuple[dict, int, Trajectory]]:
    """`k` trajectories of every problem (rows of the problems schema), unscored. Each request's
    id seeds its sampling (rstar.rollout.hf_engine): `seed_key` (default: the stage), the
    policy step, the problem and the sample index."""

    async def one(problem: dict, i: int):
        traj = await loop.run(
            problem["problem"], f"{seed_key or stage}/{policy_step}/{problem['id']}/{i}"
        )
        if progress:
            progress(1)
        return problem, i, traj

    return await asyncio.gather(*(one(p, i) for p in problems for i in range(k)))


async def score(
    loop: AgentLoop,
    sampled: list[tuple[dict, int, Trajectory]],
    scorer: BatchScorer,
    *,
    stage: str = "rollout",
    policy_step: int = 0,
) -> list[dict]:
    """Rows of the trajectories schema for what `sample` returned, each with its reward."""
    rewards = await asyncio.to_thread(
        scorer.score_many,
        [ScoreItem(t.response_text, p["answer"], t.truncated) for p, _, t in sampled],
    )
    return [
        traj.to_record(
            problem_id=problem["id"],
            group_id=f"{stage}/{policy_step}/{problem['id']}",
            sample_index=i,
            stage=stage,
            policy_step=policy_step,
            prompt_text=loop.tok.decode(traj.prompt_ids, skip_special_tokens=False),
            reward=reward,
            answer=extract_answer(traj.response_text),
        )
        for (problem, i, traj), reward in zip(sampled, rewards)
    ]


async def rollout(
    loop: AgentLoop,
    problems: list[dict],
    k: int,
    *,
    stage: str = "rollout",
    policy_step: int = 0,
    scorer: BatchScorer | None = None,
    progress: Callable[[int], None] | None = None,
    seed_key: str | None = None,
) -> list[dict]:
    """Rows of the trajectories schema: `k` rollouts of every problem (rows of the problems
    schema), scored (`seed_key`: see `sample`)."""
    own = scorer is None
    scorer = scorer or BatchScorer()
    try:
        sampled = await sample(
            loop,
            problems,
            k,
            stage=stage,
            policy_step=policy_step,
            progress=progress,
            seed_key=seed_key,
        )
        return await score(loop, sampled, scorer, stage=stage, policy_step=policy_step)
    finally:
        if own:
            scorer.close()


def tool_error_rate(records: list[dict]) -> float:
    """Tool errors per tool call over `records` (0 when they made no call)."""
    calls = sum(r["num_tool_calls"] for r in records)
    return sum(r["num_tool_errors"] for r in records) / calls if calls else 0.0


def sandbox_failure_rate(records: list[dict]) -> float:
    """Calls the sandbox never ran (unreachable, overloaded, refused: status `rejected`) per
    tool call: the infrastructure failing, apart from errors in the model's code. Above zero,
    the model is being trained on error responses it did not cause."""
    calls = sum(r["num_tool_calls"] for r in records)
    failed = sum(
        c["status"] == Status.REJECTED.value for r in records for c in json.loads(r["tool_calls"])
    )
    return failed / calls if calls else 0.0


def summarize(records: list[dict], wall_s: float | None = None) -> dict:
    """The headline numbers of a set of rollouts (trajectories-schema rows)."""
    n = len(records) or 1
    calls = sum(r["num_tool_calls"] for r in records)
    lengths = sorted(r["response_len"] for r in records) or [0]
    entropies = [e for r in records for e, m in zip(r["entropies"], r["response_mask"]) if m]
    out = {
        "rollouts": len(records),
        "reward_mean": sum(r["reward"] for r in records) / n,
        "accuracy": sum(r["reward"] > 0 for r in records) / n,
        "tool_calls_per_rollout": calls / n,
        "tool_error_rate": tool_error_rate(records),
        "sandbox_failure_rate": sandbox_failure_rate(records),
        "format_violation_rate": sum(r["num_answers"] != 1 for r in records) / n,
        "truncation_rate": sum(r["finish_reason"] == "length_limit" for r in records) / n,
        "response_len_mean": statistics.fmean(lengths),
        "response_len_p95": lengths[min(len(lengths) - 1, int(0.95 * len(lengths)))],
        "entropy": statistics.fmean(entropies) if entropies else 0.0,
        "finish_reasons": {
            f: sum(r["finish_reason"] == f for r in records)
            for f in sorted({r["finish_reason"] for r in records})
        },
    }
    if wall_s:
        out["model_tokens_per_s"] = sum(sum(r["response_mask"]) for r in records) / wall_s
        out["wall_s"] = wall_s
    return out


def consistency_sampler(
    model_dir: str,
    k: int,
    *,
    max_response_tokens: int = 1024,
    max_turns: int = 10,
    temperature: float = 1.0,
    seed: int = 0,
):
    """An `AnswerSampler` for curation's consistency filter: k rollouts of each problem by the
    model in `model_dir` (local engine, in-process sandbox), returning their final answers."""
    from rstar.agent.loop import LoopConfig
    from rstar.rollout.open import open_agent_loop

    def sample(problems: list[dict]) -> list[list[str | None]]:
        async def main() -> list[dict]:
            loop_cfg = LoopConfig(
                max_turns=max_turns,
                max_response_tokens=max_response_tokens,
                temperature=temperature,
            )
            async with open_agent_loop(model_dir, loop_cfg, seed=seed) as loop:
                return await rollout(loop, problems, k, stage="consistency")

        answers: dict[str, list[str | None]] = {}
        for r in asyncio.run(main()):
            answers.setdefault(r["problem_id"], []).append(r["answer"])
        return [answers[p["id"]] for p in problems]

    return sample
