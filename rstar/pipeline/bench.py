"""`rstar bench-recipe`: the tiny recipe's figures for docs/benchmarks.md.

1. Runs the pipeline (or finds it in Prefect's cache) and reads from MLflow how long each
   stage of the run that computed it took: the recipe is SFT + the three RL stages (+ mining).
2. The held-out accuracy of the SFT checkpoint and of every RL stage.
3. The paper's ablation in miniature: RL stage 1 twice from the same SFT checkpoint, same
   seeds and steps, with RoC and with plain GRPO; the tool-error rate inside the correct
   trajectories sampled (what the policy does) per step, both curves in one PNG.
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
from dataclasses import replace

from rstar.benchreport import write_section
from rstar.pipeline.config import load_recipe
from rstar.storage import atomic_write_text
from rstar.tracking import mlflow_log as ml

RECIPE_STAGES = ("sft", "rl1", "rl2", "mine", "rl3")


def _stage_seconds(recipe, outs: dict) -> dict[str, float]:
    c = ml.client(recipe.tracking.tracking_uri)
    seconds = {}
    for stage, out in outs.items():
        if "mlflow_run_id" in out:
            info = c.get_run(out["mlflow_run_id"]).info
            seconds[stage] = (info.end_time - info.start_time) / 1000
    return seconds


def _accuracy(summary: dict) -> float:
    n = sum(m["questions"] for m in summary.values())
    return sum(m["avg_pass@1"] * m["questions"] for m in summary.values()) / n


def ablation(recipe, sft_model: str, modes=("roc", "grpo")) -> dict[str, list[dict]]:
    """Stage 1 from the SFT checkpoint once per RoC mode; per-step histories."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import torch

    from rstar.data.io import read_table
    from rstar.pipeline.stages import Layout
    from rstar.sandbox.service import embedded_sandbox
    from rstar.storage import dirs
    from rstar.train.rl import RLTrainer

    layout = Layout(recipe.storage_root)
    problems = read_table(layout.dataset("train_problems"), "problems").to_pylist()
    path = dirs.pull(sft_model)
    out = {}
    for mode in modes:
        cfg = replace(recipe.rl[0], roc=replace(recipe.rl[0].roc, mode=mode), prompt_style=recipe.prompt_style)
        work = tempfile.mkdtemp(prefix=f"ablation-{mode}-")
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)

        async def run():
            async with embedded_sandbox() as sb:
                trainer = RLTrainer(model, AutoTokenizer.from_pretrained(path), problems, sb, cfg, work,
                                    on_step=lambda s, m: print(f"[ablation {mode}] step {s}/{cfg.steps} "
                                                               f"accuracy {m['accuracy']:.3f} tool errors in "
                                                               f"correct {m['tool_error_rate_positive']:.3f}",
                                                               flush=True))
                return await trainer.run()

        out[mode] = asyncio.run(run())
        shutil.rmtree(work, ignore_errors=True)
    return out


def end_window(steps: int) -> int:
    """How many final steps stand for "the end of stage 1": its last third, so that one step's
    handful of correct trajectories with an error (0 or 0.1 a step at the tiny scale) does
    not decide the comparison."""
    return max(1, steps // 3)


def plot_ablation(histories: dict[str, list[dict]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(8, 3.2))
    for i, (mode, hist) in enumerate(histories.items()):
        steps = [h["step"] for h in hist]
        for ax, key in zip(axes, ("tool_error_rate_positive", "accuracy")):
            values = [h[key] for h in hist]
            # each step as a faint dot, the trend as a 5-step trailing mean
            ax.plot(steps, values, ".", color=f"C{i}", alpha=0.35)
            ax.plot(steps, [sum(values[max(0, j - 4):j + 1]) / len(values[max(0, j - 4):j + 1])
                            for j in range(len(values))], color=f"C{i}", label=mode)
    window = end_window(max(len(h) for h in histories.values()))
    last = max(h[-1]["step"] for h in histories.values())
    axes[0].set_title("tool-error rate in correct trajectories", fontsize=9)
    axes[1].set_title("rollout accuracy", fontsize=9)
    for ax in axes:
        ax.axvspan(last - window + 0.5, last + 0.5, color="0.9", zorder=0)  # the compared end window
        ax.set_xlabel("RL stage 1 step")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run_recipe_benchmark(config: str, out: str = "docs/benchmarks.md", png: str = "docs/tiny_ablation.png") -> str:
    import time

    from flows.pipeline import pipeline

    recipe = load_recipe(config)
    start = time.monotonic()
    outs = pipeline(config)
    wall = time.monotonic() - start
    seconds = _stage_seconds(recipe, outs)
    summaries = outs["evaluate"]["summaries"]
    acc = {name: _accuracy(s) for name, s in summaries.items()}
    histories = ablation(recipe, outs["sft"]["model"])
    # the per-step histories beside the plot, to re-plot or re-read
    atomic_write_text(os.path.splitext(png)[0] + ".json", json.dumps(histories, indent=1, default=str))
    plot_ablation(histories, png)

    window = end_window(recipe.rl[0].steps)

    def tail(mode: str, key: str) -> float:
        last = histories[mode][-window:]
        return sum(h[key] for h in last) / len(last)

    recipe_s = sum(seconds.get(s, 0.0) for s in RECIPE_STAGES)
    lines = [
        "## Tiny recipe (`rstar bench-recipe`)", "",
        f"`{config}` on this machine ({os.cpu_count()} CPUs), measured by `rstar bench-recipe --config {config}`.",
        "Stage times are those of the MLflow runs that computed each stage (a cached re-run costs seconds).", "",
        "| stage | seconds |", "|---|---|",
        *(f"| {s} | {seconds[s]:.0f} |" for s in ("base", "problems", *RECIPE_STAGES, "evaluate") if s in seconds),
        f"| **recipe (SFT + 3 RL stages + mining)** | **{recipe_s:.0f}** (target <= 900) |", "",
        f"This invocation's wall time (cached stages included): {wall:.0f} s.", "",
        "Held-out accuracy (avg pass@1 over all held-out problems, "
        f"k={recipe.eval.k}, temperature {recipe.eval.temperature}):", "",
        "| checkpoint | accuracy |", "|---|---|",
        *(f"| {name} | {a:.3f} |" for name, a in acc.items()), "",
        f"Targets: SFT <= 0.30 ({'met' if acc['sft'] <= 0.30 else 'NOT met'}); "
        f"after stage 3 >= 0.80 ({'met' if acc[recipe.rl[-1].name] >= 0.80 else 'NOT met'}) and +0.40 over SFT "
        f"({'met' if acc[recipe.rl[-1].name] - acc['sft'] >= 0.40 else 'NOT met'}).", "",
        f"Ablation, RL stage 1 from the same SFT checkpoint, {recipe.rl[0].steps} steps, same seeds "
        f"(![curves]({os.path.basename(png)})):", "",
        f"| mode | tool errors in correct trajectories (last {window} steps) | "
        "the same, kept for the update | accuracy (same steps) |", "|---|---|---|---|",
        *(f"| {m} | {tail(m, 'tool_error_rate_positive'):.3f} | {tail(m, 'tool_error_rate_positive_kept'):.3f} | "
          f"{tail(m, 'accuracy'):.3f} |" for m in histories),
        "",
        "Target: RoC below GRPO in the correct trajectories sampled "
        f"({'met' if tail('roc', 'tool_error_rate_positive') < tail('grpo', 'tool_error_rate_positive') else 'NOT met'}; "
        "the kept ones are lower under RoC by selection alone).",
    ]
    markdown = "\n".join(lines)
    write_section(out, "tiny-recipe", markdown)
    print(markdown)
    return markdown
