"""`rstar bench-peers`: this project's RL trainer against TRL's GRPOTrainer on the same work.

From the recipe's SFT checkpoint (what `make run` leaves under the storage root), each side
trains `steps` steps of RL stage 1 per seed, with the same problems, prompts, G, temperature,
token and turn limits, optimizer, schedule, sandbox and reward:

- rstar GRPO-RoC: the local trainer as the recipe runs it (2G sampled, G kept by RoC);
- rstar GRPO: the local trainer with RoC off (G sampled, all kept): TRL's algorithm, so the
  throughput comparison is at equal settings;
- TRL GRPO: `trl.GRPOTrainer` with the sandbox as its tool (rstar.bench.peers.trl_grpo says what it
  cannot express).

Then the agent loop against verl's ToolAgentLoop over one engine and sandbox
(rstar.bench.peers.verl_loop), and the sandbox against code-judge, the release's own, through
code-judge's API (rstar.bench.peers.code_judge; its row needs a checkout, `--code-judge PATH`).

Per step it records the wall time split into rollout (generation with tool calls inside),
tool calls (the sum of their latencies), reward and update, and the model tokens generated;
after the last step the same evaluator scores each side's model on the held-out set.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import replace

from rstar.bench.report import publish

log = logging.getLogger(__name__)
SIDES = ("rstar GRPO-RoC", "rstar GRPO", "TRL GRPO")
TARGET_SPEEDUP = 1.5  # the local trainer's generated tokens/s over TRL's, at equal settings
LOOP_PROBLEMS = 64  # rollouts of the agent-loop comparison


def _train_rstar(model_dir: str, problems: list[dict], cfg, on_step) -> tuple[list[dict], str]:
    from rstar.train.rl import train_from

    work = tempfile.mkdtemp(prefix="peers-rstar-")
    history = asyncio.run(train_from(model_dir, problems, cfg, work, on_step)).history
    for h in history:  # the same names as the TRL side's
        h["tokens"] = h["tokens_per_s"] * h["time_rollout_s"]
        h["time_step_s"] = h["time_rollout_s"] + h["time_reward_s"] + h["time_update_s"]
    return history, os.path.join(work, "checkpoint")


def run_side(side: str, model_dir: str, problems: list[dict], cfg) -> tuple[list[dict], str]:
    """Train one side; returns its per-step history and its model directory."""

    def progress(step: int, m: dict) -> None:
        seconds = m.get(
            "time_step_s", m["time_rollout_s"] + m["time_reward_s"] + m["time_update_s"]
        )
        log.info(
            "[%s seed %d] step %d/%d: accuracy %.3f, %.1f s",
            side,
            cfg.seed,
            step,
            cfg.steps,
            m["accuracy"],
            seconds,
        )

    if side == "TRL GRPO":
        from rstar.bench.peers.trl_grpo import train_trl

        out = tempfile.mkdtemp(prefix="peers-trl-")
        return train_trl(model_dir, problems, cfg, out, on_step=progress), out
    mode = "roc" if side == "rstar GRPO-RoC" else "grpo"
    return _train_rstar(
        model_dir, problems, replace(cfg, roc=replace(cfg.roc, mode=mode)), progress
    )


def settings(recipe, cfg) -> dict:
    """What both sides share, printed beside the table."""
    return {
        "model": "the recipe's SFT checkpoint",
        "steps": cfg.steps,
        "prompts per step": cfg.prompts_per_step,
        "G (rollouts kept per prompt)": cfg.roc.group_size,
        "temperature": cfg.sampling.temperature,
        "top_p": cfg.sampling.top_p,
        "max response tokens": cfg.sampling.max_response_tokens,
        "max turns": cfg.sampling.max_turns,
        "tool timeout s": cfg.sampling.tool_timeout_s,
        "max tool response tokens": cfg.sampling.max_tool_response_tokens,
        "optimizer": f"AdamW lr {cfg.lr}, weight decay {cfg.weight_decay}, warm-up "
        f"{cfg.warmup_steps} steps, grad clip {cfg.max_grad_norm}",
        "loss": f"clipped surrogate eps {cfg.clip_low}/{cfg.clip_high}, token mean, no KL",
        "advantage": "(r - mean) / std per group",
        "reward": "answer-only (rstar.reward)",
        "sandbox": "rstar's embedded sandbox",
        "prompt style": recipe.prompt_style,
        "evaluation": f"held-out set, k={recipe.eval.k}, "
        f"temperature {recipe.eval.sampling.temperature}",
    }


def summarize(runs: dict[str, dict[int, dict]]) -> dict[str, dict]:
    """Per side: means over every seed's steps (the first step, which warms caches, left out)."""
    out = {}
    for side, by_seed in runs.items():
        steps = [h for r in by_seed.values() for h in r["history"][1:]] or [
            h for r in by_seed.values() for h in r["history"]
        ]

        def mean(k: str, steps=steps) -> float:
            return statistics.fmean(h[k] for h in steps)

        out[side] = {
            "step_s": mean("time_step_s"),
            "rollout_s": mean("time_rollout_s"),
            "tool_s": mean("time_tool_s"),
            "reward_s": mean("time_reward_s"),
            "update_s": mean("time_update_s"),
            "tokens": mean("tokens"),
            "tokens_per_s": sum(h["tokens"] for h in steps) / sum(h["time_step_s"] for h in steps),
            "held_out": {seed: r["held_out"] for seed, r in by_seed.items()},
        }
        out[side]["held_out_mean"] = statistics.fmean(out[side]["held_out"].values())
    return out


def plot(runs: dict[str, dict[int, dict]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (acc, wall) = plt.subplots(1, 2, figsize=(9, 3.2))
    for side, by_seed in runs.items():
        n = min(len(r["history"]) for r in by_seed.values())
        steps = range(1, n + 1)
        acc.plot(
            steps,
            [
                statistics.fmean(r["history"][i]["accuracy"] for r in by_seed.values())
                for i in range(n)
            ],
            marker=".",
            label=side,
        )
        wall.plot(
            steps,
            [
                statistics.fmean(r["history"][i]["time_step_s"] for r in by_seed.values())
                for i in range(n)
            ],
            marker=".",
            label=side,
        )
    acc.set_title("training accuracy (mean over seeds)", fontsize=9)
    wall.set_title("seconds per step", fontsize=9)
    for ax in (acc, wall):
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run_peer_benchmark(
    config: str,
    steps: int,
    seeds: int,
    root: str | None,
    out: str,
    png: str,
    code_judge_checkout: str | None = None,
) -> str:
    import torch
    from transformers.utils import logging as hf_logging

    from rstar.data.io import read_table
    from rstar.eval.metrics import overall_accuracy
    from rstar.eval.run import evaluate_model
    from rstar.pipeline.config import load_recipe
    from rstar.pipeline.layout import Layout

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    hf_logging.disable_progress_bar()  # a bar per checkpoint written or loaded
    recipe = load_recipe(config)
    layout = Layout(root or recipe.storage_root)
    sft = layout.finished_sft()
    problems = read_table(layout.dataset("train_problems"), "problems").to_pylist()
    held_out = read_table(layout.dataset("eval_problems"), "problems").to_pylist()
    stage = recipe.rl[0]
    base_cfg = replace(stage, steps=steps, prompt_style=recipe.prompt_style)

    def held_out_accuracy(model_dir: str, name: str) -> float:
        _, summary = evaluate_model(
            model_dir, held_out, recipe.eval, prompt_style=recipe.prompt_style, name=name
        )
        return overall_accuracy(summary)

    start = time.monotonic()
    sft_acc = held_out_accuracy(sft, "sft")
    runs: dict[str, dict[int, dict]] = {side: {} for side in SIDES}
    for seed in range(stage.seed, stage.seed + seeds):
        for side in SIDES:
            history, model_dir = run_side(side, sft, problems, replace(base_cfg, seed=seed))
            runs[side][seed] = {"history": history, "held_out": held_out_accuracy(model_dir, side)}
            shutil.rmtree(
                os.path.dirname(model_dir) if side != "TRL GRPO" else model_dir, ignore_errors=True
            )
    wall = time.monotonic() - start
    atomic_json(os.path.splitext(png)[0] + ".json", runs)
    plot(runs, png)
    lines = report(
        recipe,
        config,
        runs,
        sft_acc,
        settings(recipe, base_cfg),
        wall,
        steps,
        seeds,
        os.path.basename(png),
    )
    from rstar.bench.peers import code_judge, verl_loop

    greedy = replace(base_cfg, sampling=replace(base_cfg.sampling, temperature=0.0))
    lines += [
        "",
        *verl_loop.report(
            asyncio.run(verl_loop.compare_loops(sft, problems[:LOOP_PROBLEMS], greedy)), greedy
        ),
    ]
    lines += ["", *code_judge.report(code_judge.compare(code_judge_checkout), code_judge_checkout)]
    return publish(out, "peers", lines)


def atomic_json(path: str, obj) -> None:
    from rstar.storage import atomic_write_text

    atomic_write_text(path, json.dumps(obj, indent=1, default=str))


def report(
    recipe,
    config: str,
    runs,
    sft_acc: float,
    shared: dict,
    wall: float,
    steps: int,
    seeds: int,
    png: str,
) -> list[str]:
    import transformers
    import trl

    from rstar.machine import cpu_model

    s = summarize(runs)
    speedup = s["rstar GRPO"]["tokens_per_s"] / s["TRL GRPO"]["tokens_per_s"]
    not_lower = s["rstar GRPO-RoC"]["held_out_mean"] >= s["TRL GRPO"]["held_out_mean"]
    lines = [
        "## Against TRL's GRPOTrainer (`rstar bench-peers`)",
        "",
        f"`rstar bench-peers --config {config} --steps {steps} --seeds {seeds} [--code-judge "
        f"PATH]` on this machine ({cpu_model()}, {os.cpu_count()} CPUs), TRL {trl.__version__}, "
        f"transformers {transformers.__version__}; {wall:.0f} s in all. Both sides start from the "
        f"same SFT checkpoint (held-out {sft_acc:.3f}) and train RL stage 1 for {steps} steps per "
        "seed. Means over seeds and steps (the first step of each run left out: it warms caches). "
        "Tool time is the sum of the calls' latencies (the local trainer overlaps them with other "
        f"rollouts' generation; TRL runs a batch's calls one after another). ![curves]({png})",
        "",
        "| side | s / step | rollout s | tool s | reward s | update s | tokens / step | tokens / "
        f"s | held-out after {steps} steps |",
        "|---|---|---|---|---|---|---|---|---|",
        *(
            f"| {side} | {m['step_s']:.2f} | {m['rollout_s']:.2f} | {m['tool_s']:.2f} | "
            f"{m['reward_s']:.3f} | {m['update_s']:.2f} | {m['tokens']:.0f} | "
            f"{m['tokens_per_s']:.0f} | {m['held_out_mean']:.3f} ("
            + ", ".join(f"{v:.3f}" for v in m["held_out"].values())
            + ") |"
            for side, m in s.items()
        ),
        "",
        "Targets: the local trainer's generated tokens/s at equal settings (rstar GRPO vs TRL "
        f"GRPO) at least {TARGET_SPEEDUP}x TRL's: {speedup:.2f}x, "
        f"{'met' if speedup >= TARGET_SPEEDUP else 'NOT met'}; held-out accuracy after {steps} "
        "steps of the recipe's trainer (GRPO-RoC) not lower than TRL's: "
        f"{s['rstar GRPO-RoC']['held_out_mean']:.3f} vs {s['TRL GRPO']['held_out_mean']:.3f}, "
        f"{'met' if not_lower else 'NOT met'}.",
        "",
        "What TRL cannot express, run as TRL does it: no RoC (plain GRPO); tool calls parsed by "
        "its Qwen-style response schema, so a malformed call ends the turn instead of being "
        "answered with its parse error; calls run one at a time.",
        "",
        "Settings shared by every side:",
        "",
        "| setting | value |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in shared.items()),
    ]
    return lines
