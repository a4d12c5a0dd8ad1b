"""`rstar bench-engines`: the embedded engine (HF transformers in the caller's process) against
vLLM's CPU build on the tiny recipe's rollouts.

Both engines serve the same SFT checkpoint through the same agent loop and sandbox, with RL
stage 1's settings (temperature, token and turn limits, 2G rollouts per prompt) on the prompts
the trainer draws at each step (`rstar.train.rl.step_prompts`). The two take turns step by step,
so whatever else loads the machine loads both. Per step: wall time, model tokens generated (tool
tokens are not generated), turns, and the share of rollouts whose answer is right (the same
policy sampled by two engines: equal within noise). The first step of each engine is left out:
it warms caches.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from contextlib import AsyncExitStack
from dataclasses import replace

from rstar.bench.report import publish

ENGINES = ("hf", "vllm")


async def _step(loop, prompts: list[dict], k: int, scorer) -> dict:
    from rstar.rollout.runner import sample, score

    t0 = time.monotonic()
    sampled = await sample(loop, prompts, k, stage="bench")
    seconds = time.monotonic() - t0
    records = await score(loop, sampled, scorer, stage="bench")
    return {
        "seconds": seconds,
        "tokens": sum(sum(t.response_mask) for _, _, t in sampled),
        "turns": sum(t.turns for _, _, t in sampled),
        "rollouts": len(sampled),
        "correct": sum(r["reward"] for r in records),
    }


async def compare_engines(model_dir: str, problems: list[dict], stage, steps: int):
    """Per engine, one dict per step (`_step`'s), the engines alternating step by step."""
    from rstar.reward.score import BatchScorer
    from rstar.rollout.open import open_agent_loop
    from rstar.train.rl import step_prompts

    k = stage.roc.group_size * stage.roc.oversample
    history: dict[str, list[dict]] = {e: [] for e in ENGINES}
    async with AsyncExitStack() as stack:
        loops = {
            e: await stack.enter_async_context(
                open_agent_loop(
                    model_dir,
                    stage.sampling,
                    prompt_style=stage.prompt_style,
                    kind=e,
                    seed=stage.seed,
                )
            )
            for e in ENGINES
        }
        scorer = stack.enter_context(BatchScorer(workers=1))
        for step in range(1, steps + 1):
            prompts = step_prompts(problems, stage, step)
            for e in ENGINES:
                history[e].append(await _step(loops[e], prompts, k, scorer))
    return history


def summarize(history: dict[str, list[dict]]) -> dict[str, dict]:
    out = {}
    for e, steps in history.items():
        kept = steps[1:] or steps

        def total(key: str, kept=kept) -> float:
            return sum(s[key] for s in kept)

        out[e] = {
            "step_s": statistics.fmean(s["seconds"] for s in kept),
            "tokens_per_step": total("tokens") / len(kept),
            "tokens_per_s": total("tokens") / total("seconds"),
            "turns_per_rollout": total("turns") / total("rollouts"),
            "accuracy": total("correct") / total("rollouts"),
        }
    return out


def run_engine_benchmark(config: str, steps: int, root: str | None, out: str) -> str:
    import torch
    import vllm

    from rstar.data.io import read_table
    from rstar.machine import cpu_model
    from rstar.pipeline.config import load_recipe
    from rstar.pipeline.layout import Layout

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    recipe = load_recipe(config)
    layout = Layout(root or recipe.storage_root)
    sft = layout.finished_sft()
    problems = read_table(layout.dataset("train_problems"), "problems").to_pylist()
    stage = replace(recipe.rl[0], prompt_style=recipe.prompt_style)
    start = time.monotonic()
    s = summarize(asyncio.run(compare_engines(sft, problems, stage, steps)))
    wall = time.monotonic() - start
    ratio = s["vllm"]["tokens_per_s"] / s["hf"]["tokens_per_s"]
    k = stage.roc.group_size * stage.roc.oversample
    names = {"hf": "HF engine (in process)", "vllm": f"vLLM {vllm.__version__} (CPU build)"}
    lines = [
        "## Rollout engines on the CPU (`rstar bench-engines`)",
        "",
        f"`rstar bench-engines --config {config} --steps {steps}` on {cpu_model()} "
        f"({len(os.sched_getaffinity(0))} cores), torch {torch.__version__}; {wall:.0f} s in all. "
        f"The recipe's SFT checkpoint samples RL stage 1's rollouts ({stage.prompts_per_step} "
        f"prompts x {k}, temperature {stage.sampling.temperature}, at most "
        f"{stage.sampling.max_response_tokens} tokens and {stage.sampling.max_turns} turns) "
        "through one agent loop and sandbox per engine, the "
        "engines taking turns step by step on the same prompts; means over the steps after the "
        "first (it warms caches). vLLM runs float32, eager, its compute threads on every core "
        "(rstar.rollout.vllm_cpu).",
        "",
        "| engine | s / step | model tokens / step | tokens / s | turns / rollout | correct |",
        "|---|---|---|---|---|---|",
        *(
            f"| {names[e]} | {m['step_s']:.2f} | {m['tokens_per_step']:.0f} | "
            f"{m['tokens_per_s']:.0f} | {m['turns_per_rollout']:.2f} | {m['accuracy']:.3f} |"
            for e, m in s.items()
        ),
        "",
        f"vLLM's CPU build generates {ratio:.2f}x the HF engine's tokens/s on this host.",
    ]
    return publish(out, "engines", lines)
