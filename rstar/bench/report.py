"""Benchmarks write their own section of docs/benchmarks.md, between HTML comment markers,
so each benchmark command can be re-run alone without clobbering the others."""

from __future__ import annotations

import os
import re

from rstar.storage import atomic_write_text

HEADER = (
    "# Benchmarks\n\nMeasured figures, each section written by the command named in it. Machines "
    "are noisy: every comparison is made against a baseline measured in the same run.\n"
)


def write_section(path: str, name: str, markdown: str) -> None:
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    block = f"{start}\n{markdown.strip()}\n{end}"
    if os.path.exists(path):
        with open(path) as f:
            text = f.read()
    else:
        text = HEADER
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.DOTALL)
    text = (
        pattern.sub(lambda _: block, text)
        if pattern.search(text)
        else text.rstrip() + "\n\n" + block + "\n"
    )
    atomic_write_text(path, text)


def publish(path: str, name: str, lines: list[str]) -> str:
    """Print a benchmark's markdown and write it as section `name` of `path`; returns it."""
    markdown = "\n".join(lines)
    write_section(path, name, markdown)
    print(markdown)  # noqa: T201 - a benchmark prints its figures
    return markdown
