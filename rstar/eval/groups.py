"""Held-out accuracy by difficulty group (a synthetic problem's family and level), each
checkpoint beside the one before with its paired gain: where each stage of a recipe helped,
which one table over all questions hides (stage 2's longer budget lifts only the problems
that need it; stage 3 the hard ones)."""

from __future__ import annotations

import json
import statistics

from rstar.eval.metrics import paired_gain


def group_of(problem: dict) -> str | None:
    """`<family> L<level>` for a problem whose metadata has both, else None."""
    meta = json.loads(problem["metadata"])
    if "family" in meta and "level" in meta:
        return f"{meta['family']} L{meta['level']}"
    return None


def group_table(questions: dict[str, dict[str, float]], problems: list[dict]) -> str:
    """Markdown: one row per group, per checkpoint (in `questions`' order) its avg@1 and, from
    the second on, its paired gain over the one before with a 95% interval. Empty when the
    problems form fewer than two groups or there are fewer than two checkpoints."""
    groups: dict[str, list[str]] = {}
    for p in problems:
        if (g := group_of(p)) is not None:
            groups.setdefault(g, []).append(p["id"])
    names = list(questions)
    if len(groups) < 2 or len(names) < 2:
        return ""
    lines = [
        "| group | questions | " + " | ".join(names) + " |",
        "|---|---|" + "---|" * len(names),
    ]
    for g, ids in sorted(groups.items()):
        cells = [f"{statistics.fmean(questions[names[0]][i] for i in ids):.3f}"]
        for before, after in zip(names, names[1:]):
            acc = statistics.fmean(questions[after][i] for i in ids)
            if len(ids) < 2:
                cells.append(f"{acc:.3f}")
                continue
            gain, low, high = paired_gain(
                [questions[before][i] for i in ids], [questions[after][i] for i in ids]
            )
            mark = "**" if low > 0 or high < 0 else ""
            cells.append(f"{acc:.3f} ({mark}{gain:+.3f}{mark}, {low:+.3f} to {high:+.3f})")
        lines.append(f"| {g} | {len(ids)} | " + " | ".join(cells) + " |")
    return "\n".join(
        [
            *lines,
            "",
            "By family and level: avg@1, and in brackets the paired change from the column "
            "before with its 95% interval (bold: the interval excludes zero).",
        ]
    )
