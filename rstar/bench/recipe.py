"""`rstar bench-recipe`: a recipe's figures for docs/benchmarks.md (the tiny recipe's below; a
recipe on a real base model's in `write_real_model_benchmark`).

1. From a run of the pipeline (the command runs it, or finds it in Prefect's cache), how long
   each stage of the run that computed it took, read from MLflow: the recipe is SFT + the three
   RL stages (+ mining).
2. The held-out accuracy of the SFT checkpoint and of every RL stage.
3. The paper's ablation in miniature: RL stage 1 twice from the same SFT checkpoint, same
   seeds and steps, with RoC and with plain GRPO; the tool-error rate inside the correct
   trajectories sampled (what the policy does) per step, both curves in one PNG. It runs
   under overrides of its own (configs/roc-ablation.yaml: an SFT mix with repairs and room
   for them, where slips are common), or on the recipe's own stage 1.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, replace

import rstar
from rstar.bench.report import publish
from rstar.bench.robustness import native_capability
from rstar.eval.metrics import overall_accuracy
from rstar.pipeline.config import ConfigError, load_recipe
from rstar.pipeline.records import StageOutput
from rstar.pipeline.report import stage_seconds
from rstar.pipeline.stage_table import stage_names, trained_stages
from rstar.storage import atomic_write_text

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AblationResult:
    """What `run_ablation` measured: the setting it ran (`what`), its table's rows, whether RoC
    was lower with p < 0.05."""

    what: str
    steps: int
    seeds: int
    png: str
    table: list[str]
    met: bool

    @property
    def window(self) -> int:
        """The final steps compared (`end_window`)."""
        return end_window(self.steps)


def ablation_recipe(config: str, path: str, values: dict):
    """(the recipe the ablation runs, its overrides): the recipe in `config` with `values` (the
    command's --set) and, over them, the overrides in the YAML file at `path` (KEY: VALUE, keys
    as --set takes them); `values` alone when `path` is empty. Checked before any work starts:
    an error names the file and the key."""
    import yaml

    if not path:
        return load_recipe(config, values), dict(values)
    try:
        with open(path) as f:
            extra = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"{path}: cannot read the ablation's overrides ({e})") from None
    if not isinstance(extra, dict) or not all(isinstance(k, str) for k in extra):
        raise ConfigError(f"{path}: expected a mapping of recipe keys to values (KEY: VALUE)")
    merged = {**values, **extra}
    try:
        return load_recipe(config, merged), merged
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def ablation(
    recipe, sft_model: str, seeds: int = 3, modes=("roc", "grpo")
) -> dict[str, dict[int, list[dict]]]:
    """Stage 1 from the SFT checkpoint once per RoC mode and seed: {mode: {seed: per-step history}}.
    Seeds count up from the stage's; a seed fixes the prompts, the sampling and RoC's draws."""
    from transformers.utils import logging as hf_logging

    from rstar.data.io import read_table
    from rstar.pipeline.layout import Layout
    from rstar.storage import dirs
    from rstar.train.rl import train_from

    hf_logging.disable_progress_bar()  # a bar per checkpoint written: hundreds in the log
    layout = Layout(recipe.storage_root)
    problems = read_table(layout.dataset("train_problems"), "problems").to_pylist()
    path = dirs.pull(sft_model)
    stage = recipe.rl[0]
    out = {mode: {} for mode in modes}
    for seed in range(stage.seed, stage.seed + seeds):
        for mode in modes:
            cfg = replace(
                stage,
                roc=replace(stage.roc, mode=mode),
                seed=seed,
                prompt_style=recipe.prompt_style,
            )
            work = tempfile.mkdtemp(prefix=f"ablation-{mode}-{seed}-")

            def progress(step, m, mode=mode, seed=seed):
                log.info(
                    "[ablation %s seed %d] step %d/%d accuracy %.3f tool errors in correct %.3f",
                    mode,
                    seed,
                    step,
                    stage.steps,
                    m["accuracy"],
                    m["tool_error_rate_positive"],
                )

            out[mode][seed] = asyncio.run(train_from(path, problems, cfg, work, progress)).history
            shutil.rmtree(work, ignore_errors=True)
    return out


def run_ablation(recipe, sft_model: str, seeds: int, png: str, what: str) -> AblationResult:
    """`ablation` compared over the end of the stage: its curves at `png`, the per-step
    histories beside them (.json, to re-plot or re-read)."""
    histories = ablation(recipe, sft_model, seeds)
    atomic_write_text(
        os.path.splitext(png)[0] + ".json", json.dumps(histories, indent=1, default=str)
    )
    plot_ablation(histories, png)
    steps = recipe.rl[0].steps
    table, met = ablation_table(histories, end_window(steps))
    return AblationResult(what, steps, seeds, png, table, met)


def end_window(steps: int) -> int:
    """How many final steps stand for "the end of stage 1": its last third, so that one step's
    handful of correct trajectories with an error (0 or 0.1 a step at the tiny scale) does
    not decide the comparison."""
    return max(1, steps // 3)


def pooled_error_rate(steps: list[dict], kind: str = "positive") -> float:
    """Tool errors per tool call in the correct trajectories (`kind` "positive": all sampled,
    "positive_kept": those kept for the update) of `steps`, pooled: each call weighs the same,
    whichever step or seed made it."""
    calls = sum(h[f"tool_calls_{kind}"] for h in steps)
    return sum(h[f"tool_errors_{kind}"] for h in steps) / calls if calls else 0.0


def per_step(runs: dict[int, list[dict]]) -> list[tuple[int, float, float]]:
    """(step, pooled tool-error rate in correct trajectories, mean accuracy) across seeds."""
    by_step: dict[int, list[dict]] = {}
    for hist in runs.values():
        for h in hist:
            by_step.setdefault(h["step"], []).append(h)
    return [
        (step, pooled_error_rate(hs), sum(h["accuracy"] for h in hs) / len(hs))
        for step, hs in sorted(by_step.items())
    ]


def plot_ablation(histories: dict[str, dict[int, list[dict]]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(8, 3.2))
    last = 0
    for i, (mode, runs) in enumerate(histories.items()):
        rows = per_step(runs)
        steps = [r[0] for r in rows]
        last = max(last, steps[-1])
        for ax, values in zip(axes, ([r[1] for r in rows], [r[2] for r in rows])):
            # each step (over seeds) as a faint dot, the trend as a 5-step trailing mean
            ax.plot(steps, values, ".", color=f"C{i}", alpha=0.35)
            ax.plot(
                steps,
                [
                    sum(values[max(0, j - 4) : j + 1]) / len(values[max(0, j - 4) : j + 1])
                    for j in range(len(values))
                ],
                color=f"C{i}",
                label=f"{mode} ({len(runs)} seeds)",
            )
    window = end_window(last)
    axes[0].set_title("tool errors per call in correct trajectories", fontsize=9)
    axes[1].set_title("rollout accuracy", fontsize=9)
    for ax in axes:
        # the compared end window
        ax.axvspan(last - window + 0.5, last + 0.5, color="0.9", zorder=0)
        ax.set_xlabel("RL stage 1 step")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def seed_paired_test(
    histories: dict[str, dict[int, list[dict]]], window: int
) -> tuple[float, float]:
    """(mean over seeds of RoC's minus GRPO's tool-error rate in correct trajectories over the
    last `window` steps, one-sided p that RoC's is lower): an exact paired permutation test over
    the seeds (each seed's two runs share prompts and draws; the sign of each seed's difference
    is flipped in every way). With n seeds the smallest p is 1/2^n: 5 seeds to reach 0.05."""
    import numpy as np
    from scipy.stats import permutation_test

    seeds = sorted(set(histories["roc"]) & set(histories["grpo"]))
    roc, grpo = (
        np.array([pooled_error_rate(histories[m][s][-window:]) for s in seeds])
        for m in ("roc", "grpo")
    )
    test = permutation_test(
        (roc, grpo),
        lambda x, y, axis: np.mean(x - y, axis=axis),
        permutation_type="samples",
        alternative="less",
        vectorized=True,
    )
    return float(np.mean(roc - grpo)), float(test.pvalue)


def ablation_table(
    histories: dict[str, dict[int, list[dict]]], window: int
) -> tuple[list[str], bool]:
    """Markdown rows comparing the modes over each run's last `window` steps, the seed-paired
    test under them, and whether RoC's tool-error rate in correct trajectories is lower with
    p < 0.05 (`seed_paired_test`)."""

    def steps(runs, last=None):  # every seed's steps, or its last `last` ones
        return [h for hist in runs.values() for h in (hist[-last:] if last else hist)]

    rows = [
        f"| mode | tool errors per call in correct trajectories, last {window} steps (pooled) | "
        "per seed | the same, kept for the update | the same, whole stage | accuracy, last steps "
        "| response tokens, last steps |",
        "|---|---|---|---|---|---|---|",
    ]
    end = {}
    for mode, runs in histories.items():
        tail = steps(runs, window)
        end[mode] = pooled_error_rate(tail)
        seeds = ", ".join(f"{pooled_error_rate(hist[-window:]):.3f}" for hist in runs.values())
        rows.append(
            f"| {mode} | {end[mode]:.3f} | {seeds} | "
            f"{pooled_error_rate(tail, 'positive_kept'):.3f} | "
            f"{pooled_error_rate(steps(runs)):.3f} | "
            f"{sum(h['accuracy'] for h in tail) / len(tail):.3f} | "
            f"{sum(h['response_len_mean'] for h in tail) / len(tail):.0f} |"
        )
    diff, p = seed_paired_test(histories, window)
    seeds = len(set(histories["roc"]) & set(histories["grpo"]))
    rows += [
        "",
        f"RoC minus GRPO, per seed then averaged over {seeds} seeds: {diff:+.4f} errors per call; "
        f"one-sided exact paired permutation test over seeds (RoC lower): p = {p:.3f}.",
    ]
    return rows, p < 0.05


def write_recipe_benchmark(
    config: str,
    outs: dict[str, StageOutput],
    wall: float,
    ablation: AblationResult,
    out: str = "docs/benchmarks.md",
    values: dict | None = None,
) -> str:
    """The section for one finished run of the recipe in `config` with overrides `values`
    (`outs`: the pipeline's outputs, `wall`: how long the run that returned them took) and the
    RoC ablation beside it."""
    from rstar.machine import cpu_model

    recipe = load_recipe(config, values)
    seconds = stage_seconds(recipe, outs)
    summaries = outs["evaluate"].evaluation.summaries
    acc = {name: overall_accuracy(s) for name, s in summaries.items()}

    recipe_s = sum(seconds.get(s, 0.0) for s in trained_stages(recipe))
    lines = [
        "## Tiny recipe (`rstar bench-recipe`)",
        "",
        f"`{config}` on {cpu_model()} ({os.cpu_count()} CPUs, torch's {native_capability()} "
        f"kernels), code version {rstar.__version__}, {time.strftime('%Y-%m-%d')}, measured by "
        f"`rstar bench-recipe --config {config}`.",
        "Stage times are those of the MLflow runs that computed each stage (a cached re-run costs "
        "seconds).",
        "",
        "| stage | seconds |",
        "|---|---|",
        *(f"| {s} | {seconds[s]:.0f} |" for s in stage_names(recipe) if s in seconds),
        f"| **recipe (SFT + 3 RL stages + mining)** | **{recipe_s:.0f}** (target <= 900) |",
        "",
        f"This invocation's wall time (cached stages included): {wall:.0f} s.",
        "",
        f"Held-out accuracy (avg pass@1 over all held-out problems, k={recipe.eval.k}, temperature "
        f"{recipe.eval.sampling.temperature}):",
        "",
        "| checkpoint | accuracy |",
        "|---|---|",
        *(f"| {name} | {a:.3f} |" for name, a in acc.items()),
        "",
        f"Targets: SFT <= 0.30 ({'met' if acc['sft'] <= 0.30 else 'NOT met'}); after stage 3 >= "
        f"0.80 ({'met' if acc[recipe.rl[-1].name] >= 0.80 else 'NOT met'}) and +0.40 over SFT "
        f"({'met' if acc[recipe.rl[-1].name] - acc['sft'] >= 0.40 else 'NOT met'}).",
        "",
        f"Ablation on {ablation.what}: RL stage 1 from one SFT checkpoint, {ablation.steps} "
        f"steps, both modes with the same {ablation.seeds} seeds (prompts, sampling and RoC "
        f"draws), compared over the last {ablation.window} steps "
        f"(![curves]({os.path.basename(ablation.png)})):",
        "",
        *ablation.table,
        "",
        "Target: RoC below GRPO in the correct trajectories sampled, p < 0.05 over at least 5 "
        f"seeds ({'met' if ablation.met else 'NOT met'}; the kept ones are lower under RoC by "
        "selection alone).",
    ]
    return publish(out, "tiny-recipe", lines)


def _gain(before: dict, after: dict) -> tuple[float, float, float]:
    """(gain, low, high): `after`'s avg@1 minus `before`'s on one benchmark, with a 95% interval
    from the two standard errors as if independent (the questions are the same, so this is
    wider than a paired interval: conservative)."""
    gain = after["avg_pass@1"] - before["avg_pass@1"]
    se = (after["avg_pass@1_se"] ** 2 + before["avg_pass@1_se"] ** 2) ** 0.5
    return gain, gain - 1.96 * se, gain + 1.96 * se


def _training_rollouts(trajectories: str) -> tuple[list[dict], float, float, float]:
    """A stage's rollouts from its trajectory files (one per step): (rows, accuracy, tool errors
    per call, mean response tokens)."""
    from rstar.data.io import read_parquet
    from rstar.storage import filesystem

    fs, path = filesystem(trajectories)
    files = sorted(p for p in fs.ls(path, detail=False) if p.endswith(".parquet"))
    columns = ["reward", "num_tool_calls", "num_tool_errors", "response_len"]
    rows = [
        r
        for f in files
        for r in read_parquet(f"{trajectories}/{f.rsplit('/', 1)[-1]}", columns).to_pylist()
    ]
    n = max(len(rows), 1)
    calls = sum(r["num_tool_calls"] for r in rows)
    return (
        rows,
        sum(r["reward"] > 0 for r in rows) / n,
        sum(r["num_tool_errors"] for r in rows) / calls if calls else 0.0,
        sum(r["response_len"] for r in rows) / n,
    )


def write_real_model_benchmark(
    config: str,
    outs: dict[str, StageOutput],
    wall: float,
    out: str = "docs/benchmarks.md",
    overrides: dict | None = None,
) -> str:
    """The section for one finished run of a recipe on a real base model: time per stage,
    held-out accuracy per benchmark with 95% intervals, tool use per checkpoint, the gain of the
    last stage over the base and over SFT per benchmark, and the verdict."""
    from rstar.machine import cpu_model

    recipe = load_recipe(config, overrides)
    seconds = stage_seconds(recipe, outs)
    ev = outs["evaluate"].evaluation
    names = list(ev.summaries)
    benches = sorted({b for s in ev.summaries.values() for b in s})
    first, last = names[0], names[-1]

    def cell(s: dict) -> str:
        mean, half = s["avg_pass@1"], 1.96 * s["avg_pass@1_se"]
        return f"{mean:.3f} ({max(0.0, mean - half):.3f}-{min(1.0, mean + half):.3f})"

    lines = [
        f"## Real model: {recipe.name} (`rstar bench-recipe --config {config}`)",
        "",
        f"`{config}` on {cpu_model()} ({os.cpu_count()} CPUs, torch's {native_capability()} "
        f"kernels), code version {rstar.__version__}, {time.strftime('%Y-%m-%d')}. Base: "
        f"`{recipe.base.gguf or recipe.base.path}`. Stage times are those of the MLflow runs "
        f"that computed each stage; this invocation took {wall:.0f} s.",
        "",
        "| stage | seconds |",
        "|---|---|",
        *(f"| {s} | {seconds[s]:.0f} |" for s in outs if s in seconds),
        f"| **all** | **{sum(seconds.values()):.0f}** |",
        "",
        f"Held-out avg@1 (k={recipe.eval.k}, temperature {recipe.eval.sampling.temperature}, at "
        f"most {recipe.eval.sampling.max_response_tokens} tokens and "
        f"{recipe.eval.sampling.max_turns} turns) with 95% "
        "intervals over questions, and tool use over all held-out answers:",
        "",
        "| checkpoint | "
        + " | ".join(f"{b} ({ev.summaries[first][b]['questions']} q.)" for b in benches)
        + " | tool calls per answer | tool errors per call | response tokens |",
        "|---|" + "---|" * (len(benches) + 3),
    ]
    for name in names:
        s = ev.summaries[name]
        samples = sum(m["samples"] for m in s.values())
        calls = sum(m["tool_calls_per_answer"] * m["samples"] for m in s.values())
        errors = sum(
            m["tool_error_rate"] * m["tool_calls_per_answer"] * m["samples"] for m in s.values()
        )
        length = sum(m["response_len_mean"] * m["samples"] for m in s.values()) / samples
        lines.append(
            f"| {name} | "
            + " | ".join(cell(s[b]) if b in s else "" for b in benches)
            + f" | {calls / samples:.2f} | {errors / calls if calls else 0.0:.3f} | {length:.0f} |"
        )
    lines += ["", f"Gains of {last} (the recipe's last stage), 95% intervals:", ""]
    for b in benches:
        for ref in dict.fromkeys([first, "sft"]):
            if ref in ev.summaries and ref != last:
                gain, lo, hi = _gain(ev.summaries[ref][b], ev.summaries[last][b])
                excludes = "excludes zero" if lo > 0 or hi < 0 else "includes zero"
                lines.append(f"- {b}, over {ref}: {gain:+.3f} ({lo:+.3f} to {hi:+.3f}; {excludes})")
    rl_rows = [
        f"| {r.name} | {len(rows)} | {acc:.3f} | {errors:.3f} | {length:.0f} |"
        for r in recipe.rl
        if r.name in outs and outs[r.name].trajectories
        for rows, acc, errors, length in [_training_rollouts(outs[r.name].trajectories)]
    ]
    lines += [
        "",
        "Training rollouts per RL stage (every step's, sampled before RoC):",
        "",
        "| stage | rollouts | accuracy | tool errors per call | response tokens |",
        "|---|---|---|---|---|",
        *rl_rows,
        "",
        "Verdict (`expect` in the recipe):",
        "",
        *(f"- {line}" for line in ev.verdict),
    ]
    return publish(out, f"recipe-{recipe.name}", lines)
