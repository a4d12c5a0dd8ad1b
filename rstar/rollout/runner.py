"""Sample k rollouts per problem through the agent loop, score them, and summarise."""

from __future__ import annotations

import asyncio
import json
import statistics
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from typing import TypeVar

from rstar.agent.loop import AgentLoop, Trajectory
from rstar.agent.sampling import Sampling
from rstar.reward.extract import extract_answer
from rstar.reward.score import BatchScorer, ScoreItem
from rstar.sandbox.result import Status
from rstar.storage import filesystem

T, R = TypeVar("T"), TypeVar("R")
_END = object()


async def stream(
    loop: AgentLoop,
    problems: Iterable[dict],
    k: int,
    *,
    in_flight: int | None = None,
    stage: str = "rollout",
    policy_step: int = 0,
    progress: Callable[[int], None] | None = None,
    seed_key: str | None = None,
) -> AsyncIterator[list[tuple[dict, int, Trajectory]]]:
    """`k` trajectories of every problem (rows of the problems schema), unscored, one problem's
    group at a time as it finishes, with at most `in_flight` rollouts running (rounded up to
    whole groups; None: all at once), so a long run holds only what is running. Each request's
    id seeds its sampling (rstar.rollout.hf_engine): `seed_key` (default: the stage), the
    policy step, the problem and the sample index."""

    async def one(problem: dict, i: int) -> Trajectory:
        traj = await loop.run(
            problem["problem"], f"{seed_key or stage}/{policy_step}/{problem['id']}/{i}"
        )
        if progress:
            progress(1)
        return traj

    async def group(problem: dict) -> list[tuple[dict, int, Trajectory]]:
        trajs = await asyncio.gather(*(one(problem, i) for i in range(k)))
        return [(problem, i, t) for i, t in enumerate(trajs)]

    groups = max(1, -(-in_flight // k)) if in_flight else None
    async for done in as_finished(group, problems, groups):
        yield done


async def as_finished(
    make: Callable[[T], Awaitable[R]], items: Iterable[T], limit: int | None
) -> AsyncIterator[R]:
    """`make(item)` for every item, at most `limit` running at once (None: all), results as
    they finish; items are drawn only as room frees, so a long iterable is never held whole."""
    todo = iter(items)
    running: set[asyncio.Task] = set()
    finished: asyncio.Queue[asyncio.Task] = asyncio.Queue()  # O(1) per task, however many run

    def settle(task: asyncio.Task) -> None:
        running.discard(task)
        finished.put_nowait(task)

    outstanding = 0  # started and not yet yielded
    try:
        while True:
            while limit is None or outstanding < limit:
                item = next(todo, _END)
                if item is _END:
                    break
                task = asyncio.ensure_future(make(item))
                task.add_done_callback(settle)
                running.add(task)
                outstanding += 1
            if not outstanding:
                return
            task = await finished.get()
            outstanding -= 1
            yield task.result()
    finally:  # an error, or the caller stopped reading: nothing keeps running behind it
        for task in list(running):
            task.cancel()


async def sample(
    loop: AgentLoop, problems: list[dict], k: int, **kw
) -> list[tuple[dict, int, Trajectory]]:
    """All of `stream`'s trajectories, in the order of `problems`."""
    order = {id(p): n for n, p in enumerate(problems)}
    out = [s async for g in stream(loop, problems, k, **kw) for s in g]
    return sorted(out, key=lambda s: (order[id(s[0])], s[1]))


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


def _parts(out_dir: str) -> list[str]:
    fs, path = filesystem(out_dir)
    if not fs.exists(path):
        return []
    names = sorted(p.rsplit("/", 1)[-1] for p in fs.ls(path, detail=False))
    return [f"{out_dir}/{n}" for n in names if n.startswith("part-") and n.endswith(".parquet")]


def read_parts(out_dir: str, columns: list[str], parts: list[str] | None = None) -> Iterator[dict]:
    """Rows (only `columns`) of the parts `rollout_parts` wrote (or of `parts`, already listed),
    part by part."""
    from rstar.data.io import read_parquet

    for part in _parts(out_dir) if parts is None else parts:
        yield from read_parquet(part, columns).to_pylist()


async def rollout_parts(
    loop: AgentLoop,
    problems: list[dict],
    k: int,
    out_dir: str,
    *,
    scorer: BatchScorer,
    in_flight: int,
    part_rollouts: int = 1024,
    stage: str = "rollout",
    policy_step: int = 0,
    progress: Callable[[int], None] | None = None,
) -> int:
    """`rollout` for runs too large to hold: `k` scored rollouts of every problem, written to
    `out_dir` (local or remote) as they finish, in Parquet parts of whole groups of about
    `part_rollouts` rows, each written atomically, with at most `in_flight` rollouts running.
    Problems already in `out_dir`'s parts are skipped, so an interrupted run resumes where it
    stopped. Returns the number of problems sampled now."""
    from rstar.data.io import write_table

    written = _parts(out_dir)
    done = {r["problem_id"] for r in read_parts(out_dir, ["problem_id"], written)}
    todo = [p for p in problems if p["id"] not in done]
    if progress and len(todo) < len(problems):
        progress((len(problems) - len(todo)) * k)
    number = len(written)
    part: list[tuple[dict, int, Trajectory]] = []

    async def flush() -> None:
        nonlocal number, part
        number += 1
        rows = await score(loop, part, scorer, stage=stage, policy_step=policy_step)
        write_table(rows, f"{out_dir}/part-{number:05d}.parquet", "trajectories")
        part = []

    async for group in stream(
        loop, todo, k, in_flight=in_flight, stage=stage, policy_step=policy_step, progress=progress
    ):
        part += group
        if len(part) >= part_rollouts:
            await flush()
    if part:
        await flush()
    return len(todo)


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
    # over model tokens of the rows that carry entropies (verl's rollout gives none)
    entropies = [
        e
        for r in records
        if r["entropies"]
        for e, m in zip(r["entropies"], r["response_mask"])
        if m
    ]
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
    sampling: Sampling,
    *,
    seed: int = 0,
):
    """An `AnswerSampler` for curation's consistency filter: k rollouts of each problem by the
    model in `model_dir` (local engine, in-process sandbox), returning their final answers."""
    from rstar.rollout.open import open_agent_loop

    def sample(problems: list[dict]) -> list[list[str | None]]:
        async def main() -> list[dict]:
            async with open_agent_loop(model_dir, sampling, seed=seed) as loop:
                return await rollout(loop, problems, k, stage="consistency")

        answers: dict[str, list[str | None]] = {}
        for r in asyncio.run(main()):
            answers.setdefault(r["problem_id"], []).append(r["answer"])
        return [answers[p["id"]] for p in problems]

    return sample
