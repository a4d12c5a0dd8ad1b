"""Did the recipe learn? The plain answer printed under the pipeline's final table.

A run whose stages all finish can still have learnt nothing: on the tiny recipe the SFT model
may stop reading the tool's output back into \\boxed{}, and RL then has almost no positive to
learn from (docs/benchmarks.md, "robustness"). The evaluation already holds what is needed to
say so: held-out accuracy after SFT and after each RL stage. The recipe has learnt when its first
RL stage beats SFT by `first_stage_gain` and its last stage beats SFT by `final_gain` (the
recipe's `expect` section); later stages' changes are shown beside. When it did not, the verdict
names the copy probes of the base and SFT models and where to look.
"""

from __future__ import annotations

from dataclasses import dataclass

from rstar.eval.metrics import overall_accuracy


@dataclass
class Expect:
    # a recipe (rstar.pipeline.config) may not add unknown keys
    __pydantic_config__ = {"extra": "forbid"}
    first_stage_gain: float = 0.0  # held-out accuracy the first RL stage must add to SFT's
    final_gain: float = 0.0  # ... and the last RL stage


def verdict(
    summaries: dict[str, dict], expect: Expect, copying: dict[str, dict] | None = None
) -> tuple[bool, list[str]]:
    """(learnt, lines): `summaries` are the evaluation's, SFT first then the RL stages in order;
    `copying` the copy_* metrics of the base and SFT stages ({"base": {...}, "sft": {...}})."""
    names = list(summaries)
    acc = {n: overall_accuracy(summaries[n]) for n in names}
    lines, learnt = [], True
    for i, (before, after) in enumerate(zip(names, names[1:])):
        gain = acc[after] - acc[before]
        line = f"{after} held-out {acc[before]:.3f} -> {acc[after]:.3f} ({gain:+.3f})"
        if i == 0:
            ok = gain >= expect.first_stage_gain
            learnt &= ok
            mark = "ok" if ok else "DID NOT LEARN"
            line = f"{mark}: {line}, expected at least {expect.first_stage_gain:+.2f}"
        lines.append(line)
    final = acc[names[-1]] - acc[names[0]]
    ok = final >= expect.final_gain
    learnt &= ok
    lines.append(
        f"{'ok' if ok else 'DID NOT LEARN'}: the recipe, {names[0]} {acc[names[0]]:.3f} -> "
        f"{names[-1]} {acc[names[-1]]:.3f} ({final:+.3f}), expected at least "
        f"{expect.final_gain:+.2f}"
    )
    if not learnt:
        probes = "; ".join(
            f"{stage} " + ", ".join(f"{k.removeprefix('copy_')} {v:.2f}" for k, v in m.items())
            for stage, m in (copying or {}).items()
            if m
        )
        if probes:
            lines.append(
                f"copy probes (greedy, 1.00 = every number copied exactly): {probes}. A read_back "
                "well below 1 means the SFT model does not copy the tool's output into "
                f"\\boxed{{}}: RL then has few correct rollouts to learn from."
            )
        lines.append(
            "where to look: each RL stage's MLflow run (accuracy and tool-error curves, "
            "<stage>_curves.png), the held-out samples in "
            "reports/eval/<checkpoint>.samples.parquet, and docs/benchmarks.md (robustness) for "
            "what was measured on which CPUs."
        )
    return learnt, lines
