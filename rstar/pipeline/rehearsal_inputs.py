"""A rehearsal's input files (rstar.pipeline.rehearsal): every file a recipe names,
written in the layout its recipe entry reads (a source's columns or preset, a benchmark's public
layout, chats), filled with generated problems (rstar.data.synth) and chats (rstar.data.sft).

Training and held-out problems come from different problem families, so curation's 8-gram
decontamination keeps the training set (the families' phrasings share words within a family).
"""

from __future__ import annotations

import io
import json

import pyarrow as pa
import pyarrow.parquet as pq

from rstar.data import sft, synth
from rstar.data.curate import SourceSpec
from rstar.data.sources import Columns
from rstar.eval.benchmarks import _GPQA_WRONG, BENCHMARKS

TRAIN_FAMILIES = ["power_mod", "big_product", "divisor_count", "prime_sum", "committee"]
HELD_OUT_FAMILIES = ["long_sum", "arrangements", "bounded_sum", "digit_sum_power"]


def _put(row: dict, dotted: str, value) -> None:
    *parents, last = dotted.split(".")
    for key in parents:
        row = row.setdefault(key, {})
    row[last] = value


def problem_rows(problems: list[dict], columns: Columns, chat_prompt: bool = False) -> list[dict]:
    """Problems in a source's columns (dotted names nest); `chat_prompt`: the problem as a chat
    whose last user message it is (DAPO's `prompt`)."""
    rows = []
    for p in problems:
        row: dict = {}
        text = p["problem"]
        _put(row, columns.problem, [{"role": "user", "content": text}] if chat_prompt else text)
        _put(row, columns.answer, p["answer"])
        if columns.id:
            _put(row, columns.id, p["id"])
        rows.append(row)
    return rows


def benchmark_rows(name: str, problems: list[dict]) -> list[dict]:
    """Problems in a benchmark's public layout (rstar.eval.benchmarks); multiple choice gets
    three wrong options."""
    bench = BENCHMARKS[name]
    rows = problem_rows(problems, bench.columns)
    if bench.multiple_choice:
        for row, p in zip(rows, problems, strict=True):
            for k, column in enumerate(_GPQA_WRONG):
                row[column] = str(int(p["answer"]) + k + 1)
    return rows


def write_rows(fs, path: str, rows: list[dict]) -> None:
    """Parquet or JSON lines by the path's suffix, through the filesystem `fs`."""
    with fs.open(path, "wb") as f:
        if path.endswith(".jsonl"):
            f.write("".join(json.dumps(r) + "\n" for r in rows).encode())
        else:
            buffer = io.BytesIO()
            pq.write_table(pa.Table.from_pylist(rows), buffer)
            f.write(buffer.getvalue())


def write_inputs(recipe, per_file: int = 24, held_out: int = 4, chats: int = 48) -> list[str]:
    """Write every input file `recipe` names with `per_file` problems (a training source),
    `held_out` (a benchmark) or `chats` chats (SFT); returns their URIs."""
    from rstar.storage import filesystem

    written = []

    def write(uri: str, rows: list[dict]) -> None:
        fs, path = filesystem(uri)
        write_rows(fs, path, rows)
        written.append(uri)

    for i, text in enumerate(recipe.train_problems.files):
        spec = SourceSpec.parse(text)
        problems = synth.generate(per_file, seed=i, levels=[1], families=TRAIN_FAMILIES)
        write(spec.path, problem_rows(problems, spec.columns, spec.columns.problem == "prompt"))
    for i, (name, uri) in enumerate(sorted(recipe.eval_problems.benchmarks.items())):
        if uri:
            problems = synth.generate(
                held_out, seed=100 + i, levels=[1], families=HELD_OUT_FAMILIES, prefix=name
            )
            write(uri, benchmark_rows(name, problems))
    for i, uri in enumerate(recipe.sft.files):
        rows = sft.generate(chats, seed=i)
        write(uri, [{"messages": r["messages"]} for r in rows])
    return written
