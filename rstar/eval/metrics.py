"""Metrics of the evaluation protocol over k samples per question."""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Callable

from rstar.reward.verify import normalize_integer


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct: 1 - C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n (n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    miss = 1.0
    for i in range(n - c + 1, n + 1):  # C(n-c, k) / C(n, k) as a stable product
        miss *= 1.0 - k / i
    return 1.0 - miss


def avg_pass_at_1(correct: list[bool]) -> float:
    """The paper's headline number: the mean correctness over all samples of a question."""
    return sum(correct) / len(correct) if correct else 0.0


def _key(answer: str) -> str:
    return normalize_integer(answer) or " ".join(answer.split())


def majority_vote(
    answers: list[str | None], label: str, verify: Callable[[str, str], bool]
) -> bool:
    """Whether the most frequent answer (integers normalised, ties to the earliest seen) is
    right."""
    counted = Counter(_key(a) for a in answers if a is not None and a.strip())
    if not counted:
        return False
    best = max(counted.values())
    first = next(a for a in answers if a is not None and a.strip() and counted[_key(a)] == best)
    return verify(first, label)


def overall_accuracy(summary: dict) -> float:
    """avg pass@1 over every benchmark of one checkpoint's evaluation, each question weighing the
    same."""
    n = sum(m["questions"] for m in summary.values())
    return sum(m["avg_pass@1"] * m["questions"] for m in summary.values()) / n


def overall_interval(summary: dict) -> tuple[float, float]:
    """A 95% interval for `overall_accuracy` (normal, from the benchmarks' standard errors over
    questions)."""
    n = sum(m["questions"] for m in summary.values())
    se = math.sqrt(
        sum((m["questions"] / n) ** 2 * m.get("avg_pass@1_se", 0.0) ** 2 for m in summary.values())
    )
    mean = overall_accuracy(summary)
    return max(0.0, mean - 1.96 * se), min(1.0, mean + 1.96 * se)


def question_accuracy(records: list[dict], half: int | None = None) -> dict[str, float]:
    """avg@1 per question: evaluation records (rows of the trajectories schema) by problem id,
    a sample correct when its reward is. `half` 0 or 1: from the first or the other half of
    each question's samples (by sample index) only, two independent estimates: one can choose
    questions and the other measure them without the choice favouring the measure."""
    by: dict[str, list[tuple[int, bool]]] = {}
    for r in records:
        by.setdefault(r["problem_id"], []).append((r["sample_index"], r["reward"] > 0))
    out = {}
    for pid, samples in by.items():
        correct = [c for _, c in sorted(samples)]
        if half is not None:
            cut = len(correct) // 2
            correct = correct[:cut] if half == 0 else correct[cut:]
        out[pid] = avg_pass_at_1(correct)
    return out


def paired_gain(before: list[float], after: list[float]) -> tuple[float, float, float]:
    """(gain, low, high): the mean per-question change from `before` to `after` (each question's
    avg@1 under two checkpoints, same questions in the same order), with a 95% t interval over
    questions. Pairing removes the questions' own difficulty from the noise, so it is narrower
    than comparing the two means as if independent."""
    from scipy.stats import t

    if len(before) != len(after) or len(before) < 2:
        raise ValueError(f"a paired gain needs the same 2+ questions ({len(before)}, {len(after)})")
    diffs = [a - b for a, b in zip(after, before)]
    gain = statistics.fmean(diffs)
    half = float(t.ppf(0.975, len(diffs) - 1)) * statistics.stdev(diffs) / math.sqrt(len(diffs))
    return gain, gain - half, gain + half
