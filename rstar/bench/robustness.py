"""`rstar bench-recipe --robustness`: does the tiny recipe learn on other seeds and other CPUs?

One run of the recipe is one draw: a seed, and a floating-point path (the CPU's kernels, the
thread count). Another CPU changes the path, and with it every weight after a few steps. This
benchmark runs the whole recipe from scratch several times, each a `rstar pipeline run` in its
own process and storage root, varying what a user's machine varies:

- the seeds of SFT (its data and order) and of every RL stage (prompts, sampling, RoC draws),
  and with `--rebuild-base` the pretraining seed too (the base is otherwise the shipped one);
- torch's CPU kernel set (`ATEN_CPU_CAPABILITY`: `default`, `avx2`, and `avx512` where the CPU
  has it), standing in for other CPU models;
- the thread count (`resources.cpus` 1 instead of 2: another reduction order in every matmul).

It reports per run the copy probes, held-out accuracy after SFT and each RL stage, the
verdict, and the recipe's time, and checks the targets on every run, not on the mean.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import time
from dataclasses import dataclass, field

import rstar
from rstar.bench.report import publish
from rstar.pipeline.config import load_recipe, seed_overrides
from rstar.pipeline.verdict import failed_lines

log = logging.getLogger(__name__)
TARGETS = {"sft_max": 0.30, "final_min": 0.75, "gain_min": 0.40}


@dataclass
class Variant:
    label: str
    seed: int = 0
    env: dict = field(default_factory=dict)
    overrides: dict = field(default_factory=dict)


def native_capability() -> str:
    """torch's kernel set on this CPU ("default", "avx2" or "avx512")."""
    import torch

    return torch.backends.cpu.get_cpu_capability().lower()


def variants(recipe, seeds: int, rebuild_base: bool) -> list[Variant]:
    """Seeds 0..seeds-1 on this CPU's own path, then seed 0 under each other kernel set this CPU
    can run, then seed 0 on one thread."""
    native = native_capability()
    kernels = ["default", "avx2"] + (["avx512"] if native == "avx512" else [])
    out = [
        Variant(f"seed {s}, {native}, {int(recipe.resources.cpus)} threads", s)
        for s in range(seeds)
    ]
    out += [
        Variant(f"seed 0, {k}, {int(recipe.resources.cpus)} threads", 0, {"ATEN_CPU_CAPABILITY": k})
        for k in kernels
        if k != native
    ]
    out.append(Variant(f"seed 0, {native}, 1 thread", 0, overrides={"resources.cpus": 1}))
    for v in out:
        v.overrides.update(seed_overrides(recipe, v.seed, rebuild_base))
    return out


def run_variant(config: str, variant: Variant, root: str, rstar_command: list[str]) -> dict:
    """One whole pipeline run in a fresh process (the kernel set is fixed when torch loads),
    through `rstar_command ... pipeline run`; returns its report (`--report-json`)."""
    report = os.path.join(root, "report.json")
    sets = {
        **variant.overrides,
        "storage_root": root,
        "tracking.tracking_uri": f"sqlite:///{os.path.abspath(root)}/mlruns.db",
    }
    cmd = [*rstar_command, "pipeline", "run", "--config", config, "--report-json", report]
    for key, value in sets.items():
        cmd += ["--set", f"{key}={json.dumps(value)}"]
    subprocess.run(cmd, check=True, env={**os.environ, **variant.env})
    with open(report) as f:
        return json.load(f)


def meets(report: dict) -> dict[str, bool]:
    acc = report["accuracy"]
    sft, final = acc["sft"], list(acc.values())[-1]
    return {
        "sft": sft <= TARGETS["sft_max"],
        "final": final >= TARGETS["final_min"],
        "gain": final - sft >= TARGETS["gain_min"],
        # the recipe's own verdict: its expect section, each stage on what it is for included
        "verdict": report["learnt"] is True,
    }


def table(results: list[tuple[Variant, dict]]) -> list[str]:
    stages = list(results[0][1]["accuracy"])
    rows = [
        "| run | base repeat | SFT into_call / read_back | "
        + " | ".join(stages)
        + " | recipe s | targets |",
        "|---|---|---|" + "---|" * len(stages) + "---|---|",
    ]
    for v, r in results:
        m, ok = r["metrics"], meets(r)
        missed = ", ".join(k for k, v in ok.items() if not v)
        verdict = f"NOT met: {missed}" if missed else "met"
        rows.append(
            f"| {v.label} | {m['base'].get('copy_repeat', float('nan')):.2f} | "
            f"{m['sft'].get('copy_into_call', float('nan')):.2f} / "
            f"{m['sft'].get('copy_read_back', float('nan')):.2f} | "
            + " | ".join(f"{r['accuracy'][s]:.3f}" for s in stages)
            + f" | {r['recipe_seconds']:.0f} | {verdict} |"
        )
    return rows


def failures(results: list[tuple[Variant, dict]]) -> list[str]:
    """What a run's verdict did not show, per run (the table says only "verdict")."""
    return [f"- {v.label}: {line}" for v, r in results for line in failed_lines(r["verdict"])]


def run_robustness(
    config: str, out: str, seeds: int, rebuild_base: bool, root: str, rstar_command: list[str]
) -> str:
    """Every variant's run (`rstar_command`: how to start the `rstar` command line), checked
    against the targets, as section `tiny-robustness` of `out`."""
    import torch
    import transformers

    from rstar.machine import cpu_model

    recipe = load_recipe(config)
    results = []
    for i, v in enumerate(variants(recipe, seeds, rebuild_base)):
        log.info("[robustness] run %d: %s", i + 1, v.label)
        r = run_variant(config, v, os.path.join(root, f"run{i}"), rstar_command)
        results.append((v, r))
        log.info("[robustness] %s: accuracy %s, targets %s", v.label, r["accuracy"], meets(r))
    every = all(all(meets(r).values()) for _, r in results)
    failed = failures(results)
    base = (
        "pretrained in each run (its seed moved with the run's)"
        if rebuild_base
        else f"the shipped one ({recipe.base.shipped})"
    )
    lines = [
        "## Tiny recipe robustness (`rstar bench-recipe --robustness`)",
        "",
        f"`rstar bench-recipe --config {config} --robustness --seeds "
        f"{seeds}{' --rebuild-base' if rebuild_base else ''}` on {cpu_model()} ({os.cpu_count()} "
        f"CPUs), torch {torch.__version__}, transformers {transformers.__version__} "
        f"(constraints.txt), code version {rstar.__version__}, {time.strftime('%Y-%m-%d')}. Each "
        "run is the whole recipe from the base in a fresh process and storage root; the base is "
        f"{base}. A seed moves SFT's data and order and every RL stage's prompts, sampling and RoC "
        "draws; the kernel set (`ATEN_CPU_CAPABILITY`) and thread count stand in for other CPUs. "
        "Held-out accuracy is avg pass@1 over the "
        f"{recipe.eval_problems.synthetic.n if recipe.eval_problems.synthetic else ''} held-out "
        f"problems, k={recipe.eval.k}.",
        "",
        *table(results),
        "",
        *(["Verdict lines that did not hold:", "", *failed, ""] if failed else []),
        f"Targets for every run: SFT <= {TARGETS['sft_max']}, stage 3 >= {TARGETS['final_min']} "
        f"and at least +{TARGETS['gain_min']} over SFT, and the recipe's verdict (its `expect`, "
        "each stage on the questions it is for): "
        f"{'met by every run' if every else 'NOT met by every run'}.",
    ]
    return publish(out, "tiny-robustness", lines)
