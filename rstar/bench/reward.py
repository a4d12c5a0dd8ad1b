"""`rstar reward bench`: how fast answers are verified, inline and across cores."""

from __future__ import annotations

import os
import random
import time

from rich.console import Console


def _integer_items(n: int, rng: random.Random):
    from rstar.reward.score import ScoreItem

    fmts = ["{:,}", "{}", "+{}", "{}.0", "\\text{{{}}}", "${}$"]
    items = []
    for _ in range(n):
        v = rng.randint(0, 10**12)
        shown = v if rng.random() < 0.5 else v + rng.randint(1, 9)
        items.append(
            ScoreItem(
                f"<reason>...</reason><answer>\\boxed{{{rng.choice(fmts).format(shown)}}}</answer>",
                str(v),
            )
        )
    return items


def _symbolic_items(n: int, rng: random.Random):
    from rstar.reward.score import ScoreItem

    items = []
    for _ in range(n):
        a, b = rng.randint(1, 50), rng.randint(2, 60)
        pred = rng.choice(
            [
                f"\\frac{{{2 * a}}}{{{2 * b}}}",
                f"{a}/{b}",
                f"\\frac{{{a + 1}}}{{{b}}}",
                f"\\frac{{{a}\\sqrt{{2}}}}{{{b}}}",
            ]
        )
        items.append(ScoreItem(f"<answer>\\boxed{{{pred}}}</answer>", f"\\frac{{{a}}}{{{b}}}"))
    return items


def run_reward_benchmark(integer_items: int, symbolic_items: int, out: str) -> list[tuple]:
    """Integer and symbolic verification rates on this machine, as section `reward` of `out`."""
    from rstar.bench.report import write_section
    from rstar.reward.score import BatchScorer, score

    console = Console()
    rng = random.Random(0)
    ints, syms = _integer_items(integer_items, rng), _symbolic_items(symbolic_items, rng)
    cores = os.cpu_count() or 1
    rows = []

    t = time.perf_counter()
    for it in ints:
        score(it.response, it.ground_truth)
    rows.append(
        ("integer", "score() one by one", integer_items, integer_items / (time.perf_counter() - t))
    )
    with BatchScorer(workers=cores) as scorer:
        t = time.perf_counter()
        scorer.score_many(ints)
        rows.append(
            (
                "integer",
                f"BatchScorer, {cores} workers",
                integer_items,
                integer_items / (time.perf_counter() - t),
            )
        )
    for workers in sorted({1, cores}):
        with BatchScorer(workers=workers) as scorer:
            scorer.score_many(syms[:4])  # start the pool before timing
            t = time.perf_counter()
            scorer.score_many(syms)
            rows.append(
                (
                    "symbolic (math-verify)",
                    f"BatchScorer, {workers} worker(s)",
                    symbolic_items,
                    symbolic_items / (time.perf_counter() - t),
                )
            )
    for r in rows:
        console.print(f"{r[0]:24s} {r[1]:28s} {r[2]:>7} items  {r[3]:>10,.0f}/s")
    int_rate = max(r[3] for r in rows if r[0] == "integer")
    lines = [
        "## Reward verification (`rstar reward bench`)",
        "",
        f"Measured {time.strftime('%Y-%m-%d')} on {cores} cores. Integer items: boxed answers in "
        f"mixed formats (`1,000`, `+1000`, `1000.0`, `\\text{{}}`), half of them wrong. Symbolic "
        "items: fractions and radicals that need math-verify. Each symbolic verification is "
        "bounded by a 5 s limit inside math-verify and a hard deadline outside it.",
        "",
        "| answers | how | items | verifications/s |",
        "|---|---|---|---|",
        *[f"| {a} | {b} | {c} | {d:,.0f} |" for a, b, c, d in rows],
        "",
        f"Target: >= 2,000 integer verifications/s: measured {int_rate:,.0f}/s "
        f"({'met' if int_rate >= 2000 else 'not met'}).",
        "",
        "Reproduce: `.venv/bin/rstar reward bench`.",
    ]
    write_section(out, "reward", "\n".join(lines))
    console.print(f"wrote {out}")
    return rows
