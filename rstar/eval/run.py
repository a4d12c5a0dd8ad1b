"""The evaluation protocol: k samples per question (16), temperature 0.6, a response budget and
turn limit per benchmark; avg pass@1, pass@k, majority vote, lengths, tool use and finish
reasons per benchmark; every sample kept as a trajectories-schema row."""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from collections.abc import Callable
from pathlib import PurePosixPath

from rstar.agent.loop import AgentLoop
from rstar.eval.benchmarks import chosen_option, extract_letter, shuffled_choice_prompt
from rstar.eval.config import EvalConfig
from rstar.eval.metrics import (
    avg_pass_at_1,
    majority_vote,
    overall_accuracy,
    overall_interval,
    pass_at_k,
)
from rstar.reward import verify
from rstar.rollout.runner import rollout, tool_error_rate


def _benchmark(problem: dict) -> str:
    """The benchmark a problem is reported under: its metadata's, else its source; a source
    that is a data file's path (curation's default name) by the file's stem, so that it makes a
    readable metric name (MLflow refuses names that look like absolute paths)."""
    source = json.loads(problem["metadata"]).get("benchmark", problem["source"])
    if source.endswith((".jsonl", ".json", ".parquet")):
        return PurePosixPath(source).name.split(".")[0]
    return source


async def evaluate(
    loop: AgentLoop,
    problems: list[dict],
    cfg: EvalConfig,
    *,
    stage: str = "eval",
    policy_step: int = 0,
    progress: Callable[[int], None] | None = None,
) -> tuple[list[dict], dict]:
    """Rollouts and per-benchmark metrics. Multiple-choice problems get a freshly shuffled
    prompt per sample and are scored by the letter in the boxed answer; their records' `answer`
    is the text of the chosen option, so majority votes count the same option across samples.
    `loop` samples as the protocol says (`cfg.sampling`; evaluate_model builds it so)."""
    if loop.sampling != cfg.sampling:
        raise ValueError(
            f"the agent loop samples with {loop.sampling}, the evaluation protocol says "
            f"{cfg.sampling}"
        )
    plain = [p for p in problems if "choices" not in json.loads(p["metadata"])]
    records = await rollout(
        loop, plain, cfg.k, stage=stage, policy_step=policy_step, progress=progress, seed_key="eval"
    )
    for r in records:
        r["correct"] = r["reward"] > 0
    choice_problems = []
    letters = {}
    by_id = {p["id"]: p for p in problems}
    for p in problems:
        if "choices" in json.loads(p["metadata"]):
            for i in range(cfg.k):
                text, letter = shuffled_choice_prompt(p, i, cfg.seed)
                sample_id = f"{p['id']}#{i}"
                letters[sample_id] = letter
                choice_problems.append({**p, "id": sample_id, "problem": text, "answer": letter})
    for r in await rollout(
        loop,
        choice_problems,
        1,
        stage=stage,
        policy_step=policy_step,
        progress=progress,
        seed_key="eval",
    ):
        sample_id = r["problem_id"]
        r["problem_id"], r["sample_index"] = (
            sample_id.rsplit("#", 1)[0],
            int(sample_id.rsplit("#", 1)[1]),
        )
        letter = extract_letter(r["answer"])
        r["correct"] = letter == letters[sample_id]
        r["reward"] = float(r["correct"])
        r["answer"] = chosen_option(by_id[r["problem_id"]], r["sample_index"], letter, cfg.seed)
        records.append(r)
    return records, summarize_eval(records, by_id, cfg.k)


def evaluate_model(
    model_dir: str,
    problems: list[dict],
    cfg: EvalConfig,
    *,
    prompt_style: str = "paper",
    name: str = "model",
    progress: Callable[[int], None] | None = None,
    replicas: int = 0,
    kind: str = "hf",
    sandbox_url: str | None = None,
) -> tuple[list[dict], dict]:
    """`evaluate` for a Hugging Face checkpoint directory: the local engine and an in-process
    sandbox, or `replicas` engine replicas and a sandbox service (rstar.rollout.open)."""
    import asyncio

    from rstar.rollout.open import open_agent_loop

    async def run() -> tuple[list[dict], dict]:
        async with open_agent_loop(
            model_dir,
            cfg.sampling,
            prompt_style=prompt_style,
            replicas=replicas,
            kind=kind,
            seed=cfg.seed,
            sandbox_url=sandbox_url,
        ) as loop:
            return await evaluate(loop, problems, cfg, stage=f"eval/{name}", progress=progress)

    records, summary = asyncio.run(run())
    return [{k: v for k, v in r.items() if k != "correct"} for r in records], summary


def summarize_eval(records: list[dict], problems: dict[str, dict], k: int) -> dict:
    by_problem: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        by_problem[r["problem_id"]].append(r)
    by_bench: dict[str, list[str]] = defaultdict(list)
    for pid in by_problem:
        by_bench[_benchmark(problems[pid])].append(pid)
    out = {}
    for bench, pids in sorted(by_bench.items()):
        rows = [r for pid in pids for r in by_problem[pid]]
        lengths = sorted(r["response_len"] for r in rows)
        calls = sum(r["num_tool_calls"] for r in rows)

        def maj(pid: str) -> bool:
            p, answers = problems[pid], [r["answer"] for r in by_problem[pid]]
            if "choices" in json.loads(p["metadata"]):  # votes on the chosen option's text
                return majority_vote(answers, p["answer"], lambda a, b: a == b)
            return majority_vote(answers, p["answer"], verify)

        per_question = [avg_pass_at_1([r["correct"] for r in by_problem[p]]) for p in pids]
        out[bench] = {
            "questions": len(pids),
            "samples": len(rows),
            "avg_pass@1": statistics.fmean(per_question),
            # its standard error over questions (the samples of one question are not independent)
            "avg_pass@1_se": statistics.stdev(per_question) / math.sqrt(len(pids))
            if len(pids) > 1
            else 0.0,
            f"pass@{k}": statistics.fmean(
                pass_at_k(
                    len(by_problem[p]),
                    sum(r["correct"] for r in by_problem[p]),
                    min(k, len(by_problem[p])),
                )
                for p in pids
            ),
            f"maj@{k}": statistics.fmean(maj(p) for p in pids),
            "response_len_mean": statistics.fmean(lengths),
            "response_len_p95": lengths[min(len(lengths) - 1, int(0.95 * len(lengths)))],
            "tool_calls_per_answer": calls / len(rows),
            "tool_error_rate": tool_error_rate(rows),
            "finish_reasons": {
                f: sum(r["finish_reason"] == f for r in rows)
                for f in sorted({r["finish_reason"] for r in rows})
            },
        }
    return out


def markdown_table(summaries: dict[str, dict], k: int, groups: str = "") -> str:
    """One overall score per model (or stage) with its sample size and 95% interval, then the
    benchmarks side by side (a column triple per model) and a key to the columns; then
    `groups`, the by-group table (rstar.eval.groups), if there is one."""
    names = list(summaries)
    overall = [
        "| checkpoint | avg@1, all questions | 95% interval | questions x samples |",
        "|---|---|---|---|",
    ]
    for n in names:
        lo, hi = overall_interval(summaries[n])
        questions = sum(m["questions"] for m in summaries[n].values())
        samples = sum(m["samples"] for m in summaries[n].values())
        overall.append(
            f"| {n} | **{overall_accuracy(summaries[n]):.3f}** | {lo:.3f}-{hi:.3f} | {questions} x "
            f"{samples // max(questions, 1)} |"
        )
    benches = sorted({b for s in summaries.values() for b in s})
    head = (
        "| benchmark | " + " | ".join(f"{n} avg@1 | {n} pass@{k} | {n} len" for n in names) + " |"
    )
    lines = [head, "|---|" + "---|---|---|" * len(names)]
    for b in benches:
        cells = []
        for n in names:
            s = summaries[n].get(b)
            cells += (
                [f"{s['avg_pass@1']:.3f}", f"{s[f'pass@{k}']:.3f}", f"{s['response_len_mean']:.0f}"]
                if s
                else ["", "", ""]
            )
        lines.append(f"| {b} | " + " | ".join(cells) + " |")
    key = (
        f"avg@1: per question, the fraction of its {k} samples that are correct, averaged over "
        f"questions; pass@{k}: questions solved by at least one of {k} samples (unbiased "
        "estimate); len: mean response tokens."
    )
    return "\n".join([*overall, "", *lines, "", key, *(["", groups] if groups else [])])
