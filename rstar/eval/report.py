"""Evaluation reports people read: a markdown and an HTML table of models (or stages) side by
side, and PNG plots of accuracy and response length per stage."""

from __future__ import annotations

import html
import os

from rstar.eval.run import markdown_table
from rstar.storage import atomic_write, atomic_write_text


def html_table(summaries: dict[str, dict], k: int) -> str:
    names = list(summaries)
    benches = sorted({b for s in summaries.values() for b in s})
    head = "".join(
        f"<th>{html.escape(n)} avg pass@1</th><th>{html.escape(n)} "
        f"pass@{k}</th><th>{html.escape(n)} mean length</th>"
        for n in names
    )
    rows = []
    for b in benches:
        cells = ""
        for n in names:
            s = summaries[n].get(b)
            values = (s["avg_pass@1"], s[f"pass@{k}"], s["response_len_mean"]) if s else None
            cells += (
                "".join(f"<td>{v:.{p}f}</td>" for v, p in zip(values, (3, 3, 0)))
                if s
                else "<td></td><td></td><td></td>"
            )
        rows.append(f"<tr><th>{html.escape(b)}</th>{cells}</tr>")
    return (
        "<!doctype html><meta charset='utf-8'><title>rstar evaluation</title>"
        "<style>body{font-family:sans-serif}td,th{padding:4px 10px;border-bottom:1px solid #ddd}"
        "td{text-align:right}</style><h1>Evaluation</h1>"
        f"<table><tr><th>benchmark</th>{head}</tr>{''.join(rows)}</table>"
    )


def plot(summaries: dict[str, dict], key: str, ylabel: str, path: str) -> str:
    """A grouped bar chart: one group per benchmark, one bar per model/stage."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(summaries)
    benches = sorted({b for s in summaries.values() for b in s})
    fig, ax = plt.subplots(figsize=(max(5, 1.6 * len(benches) + 2), 3.6))
    width = 0.8 / max(1, len(names))
    for i, n in enumerate(names):
        ax.bar(
            [x + i * width for x in range(len(benches))],
            [summaries[n].get(b, {}).get(key, 0.0) for b in benches],
            width,
            label=n,
        )
    ax.set_xticks(
        [x + width * (len(names) - 1) / 2 for x in range(len(benches))],
        benches,
        rotation=20,
        ha="right",
    )
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    plt.close(fig)
    return path


def write_report(summaries: dict[str, dict], k: int, out_dir: str, groups: str = "") -> list[str]:
    """report.md, report.html, accuracy.png and length.png under `out_dir`; returns the paths.
    `groups`: the by-group table (rstar.eval.groups), if any, under the main one in report.md."""
    md = atomic_write_text(
        os.path.join(out_dir, "report.md"),
        f"# Evaluation\n\n{markdown_table(summaries, k, groups)}\n",
    )
    page = atomic_write_text(os.path.join(out_dir, "report.html"), html_table(summaries, k))
    acc = plot(summaries, "avg_pass@1", "avg pass@1", os.path.join(out_dir, "accuracy.png"))
    length = plot(
        summaries, "response_len_mean", "mean response tokens", os.path.join(out_dir, "length.png")
    )
    return [md, page, acc, length]
