"""Did the recipe learn? The plain answer printed under the pipeline's final table.

A run whose stages all finish can still have learnt nothing: on the tiny recipe the SFT model
may stop reading the tool's output back into \\boxed{}, and RL then has almost no positive to
learn from (docs/benchmarks.md, "robustness"). The evaluation already holds what is needed to
say so: held-out accuracy after SFT and after each RL stage. The recipe has learnt when its first
RL stage beats SFT by `first_stage_gain` and its last stage beats SFT by `final_gain` (the
recipe's `expect` section); later stages' changes are shown beside. A recipe may also say which
held-out questions each RL stage is for (`expect.stage_for`: stage 2 the problems that need its
longer budget, stage 3 the hard ones); that stage has then learnt when its gain over the stage
before on those questions has a paired 95% interval above zero. When it did not, the verdict
names the copy probes of the base and SFT models and where to look.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from rstar.eval.metrics import overall_accuracy, paired_gain

# how a judged line that failed begins (a line that held begins "ok:")
NOT_LEARNT, NO_GAIN = "DID NOT LEARN", "NO GAIN SHOWN"


@dataclass
class Subset:
    """Held-out questions by their metadata (synthetic problems carry family and level); a
    field left out matches every question. `hard`: only those the stage before did not always
    solve, as mining chooses problems for stage 3; judged on the first half of that stage's
    samples of each question and measured on the other half of both stages' samples, so that
    questions picked for a bad draw do not rise by chance (regression to the mean)."""

    __pydantic_config__ = {"extra": "forbid"}
    families: list[str] | None = None
    levels: list[int] | None = None
    hard: bool = False

    def holds(self, problem: dict) -> bool:
        meta = json.loads(problem["metadata"])
        return (self.families is None or meta.get("family") in self.families) and (
            self.levels is None or meta.get("level") in self.levels
        )

    def describe(self, before: str = "the stage before") -> str:
        parts = [f"families {'/'.join(self.families)}"] if self.families else []
        parts += [f"levels {'/'.join(map(str, self.levels))}"] if self.levels else []
        if self.hard:
            parts.append(f"hard ({before} wrong in its first half of samples; scored on the other)")
        return ", ".join(parts) or "all questions"


@dataclass
class Expect:
    # a recipe (rstar.pipeline.config) may not add unknown keys
    __pydantic_config__ = {"extra": "forbid"}
    first_stage_gain: float = 0.0  # held-out accuracy the first RL stage must add to SFT's
    final_gain: float = 0.0  # ... and the last RL stage
    # RL stage name -> the held-out questions it is for: its paired gain there must be above 0
    stage_for: dict[str, Subset] = field(default_factory=dict)


def verdict(
    summaries: dict[str, dict],
    expect: Expect,
    copying: dict[str, dict] | None = None,
    questions: dict[str, dict[str, float]] | None = None,
    problems: list[dict] | None = None,
    halves: tuple[dict, dict] | None = None,
) -> tuple[bool, list[str]]:
    """(learnt, lines): `summaries` are the evaluation's, SFT first then the RL stages in order;
    `copying` the copy_* metrics of the base and SFT stages ({"base": {...}, "sft": {...}});
    `questions` each checkpoint's avg@1 per held-out problem id and `problems` the held-out rows
    (needed when the recipe names what a stage is for); `halves` the same avg@1 from the first
    and from the other half of each question's samples (for a `hard` subset; None with one
    sample a question)."""
    names = list(summaries)
    acc = {n: overall_accuracy(summaries[n]) for n in names}
    lines, learnt = [], True
    for i, (before, after) in enumerate(zip(names, names[1:])):
        gain = acc[after] - acc[before]
        line = f"{after} held-out {acc[before]:.3f} -> {acc[after]:.3f} ({gain:+.3f})"
        if i == 0:
            ok = gain >= expect.first_stage_gain
            learnt &= ok
            mark = "ok" if ok else NOT_LEARNT
            line = f"{mark}: {line}, expected at least {expect.first_stage_gain:+.2f}"
        lines.append(line)
        if after in expect.stage_for:
            ok, line = _stage_for(
                after, before, expect.stage_for[after], questions, problems, halves
            )
            learnt &= ok
            lines.append(line)
    final = acc[names[-1]] - acc[names[0]]
    ok = final >= expect.final_gain
    learnt &= ok
    lines.append(
        f"{'ok' if ok else NOT_LEARNT}: the recipe, {names[0]} {acc[names[0]]:.3f} -> "
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


def _stage_for(
    stage: str,
    before: str,
    subset: Subset,
    questions: dict | None,
    problems: list[dict] | None,
    halves: tuple[dict, dict] | None,
) -> tuple[bool, str]:
    """Whether `stage` lifted the questions it is for over `before`, and the line saying so."""
    ids = [p["id"] for p in problems or [] if subset.holds(p)]
    if subset.hard:
        if halves is None:  # one sample a question: nothing left to score what it chose
            return False, (
                f"{NO_GAIN}: {stage} on {subset.describe(before)}: needs eval.k >= 2 (half "
                "the samples choose the questions, the other half score them)"
            )
        choose, questions = halves
        ids = [i for i in ids if choose[before].get(i, 1.0) < 1.0]
    if len(ids) < 2 or questions is None:
        return False, (
            f"{NO_GAIN}: {stage} on {subset.describe(before)}: {len(ids)} held-out questions "
            "match, too few to measure"
        )
    gain, low, high = paired_gain(
        [questions[before][i] for i in ids], [questions[stage][i] for i in ids]
    )
    a = sum(questions[before][i] for i in ids) / len(ids)
    ok = low > 0
    return ok, (
        f"{'ok' if ok else NO_GAIN}: {stage} on {subset.describe(before)} ({len(ids)} "
        f"questions) {a:.3f} -> {a + gain:.3f} ({gain:+.3f}, 95% interval {low:+.3f} to "
        f"{high:+.3f}), expected above zero"
    )


def failed_lines(verdict: list[str]) -> list[str]:
    """The judged lines of a verdict that did not hold."""
    return [line for line in verdict if line.startswith((NOT_LEARNT, NO_GAIN))]
