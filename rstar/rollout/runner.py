"""Sample k rollouts per problem through the agent loop, score them, and summarise."""
from __future__ import annotations

import asyncio
import statistics
from collections.abc import Callable

from rstar.agent.loop import AgentLoop
from rstar.reward.extract import extract_answer
from rstar.reward.score import BatchScorer, ScoreItem


async def rollout(loop: AgentLoop, problems: list[dict], k: int, *, stage: str = "rollout", policy_step: int = 0,
                  scorer: BatchScorer | None = None, progress: Callable[[int], None] | None = None) -> list[dict]:
    """Rows of the trajectories schema: `k` rollouts of every problem (rows of the problems schema)."""
    own = scorer is None
    scorer = scorer or BatchScorer()

    async def one(problem: dict, i: int):
        traj = await loop.run(problem["problem"], f"{stage}/{policy_step}/{problem['id']}/{i}")
        if progress:
            progress(1)
        return problem, i, traj

    try:
        done = await asyncio.gather(*(one(p, i) for p in problems for i in range(k)))
        rewards = await asyncio.to_thread(scorer.score_many, [
            ScoreItem(t.response_text, p["answer"], t.truncated) for p, _, t in done])
    finally:
        if own:
            scorer.close()
    records = []
    for (problem, i, traj), reward in zip(done, rewards):
        records.append(traj.to_record(
            problem_id=problem["id"], group_id=f"{stage}/{policy_step}/{problem['id']}", sample_index=i, stage=stage,
            policy_step=policy_step, prompt_text=loop.tok.decode(traj.prompt_ids, skip_special_tokens=False),
            reward=reward, answer=extract_answer(traj.response_text)))
    return records


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
        "tool_error_rate": sum(r["num_tool_errors"] for r in records) / calls if calls else 0.0,
        "format_violation_rate": sum(r["num_answers"] != 1 for r in records) / n,
        "truncation_rate": sum(r["finish_reason"] == "length_limit" for r in records) / n,
        "response_len_mean": statistics.fmean(lengths),
        "response_len_p95": lengths[min(len(lengths) - 1, int(0.95 * len(lengths)))],
        "entropy": statistics.fmean(entropies) if entropies else 0.0,
        "finish_reasons": {f: sum(r["finish_reason"] == f for r in records)
                           for f in sorted({r["finish_reason"] for r in records})},
    }
    if wall_s:
        out["model_tokens_per_s"] = sum(sum(r["response_mask"]) for r in records) / wall_s
        out["wall_s"] = wall_s
    return out
