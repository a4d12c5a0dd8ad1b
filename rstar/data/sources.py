"""Load problems from Parquet, JSON lines or a Hugging Face dataset into raw rows.

Each source maps its own columns onto (id, problem, answer); `PRESETS` knows the public
sets the paper curated from, and any other layout is a `Columns(...)` away. Rows come out
as `(row_id, dict)`; a row that cannot even be read is yielded as a `BadRow` so curation
counts it instead of losing it.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass

from rstar.data.io import DataError, read_parquet
from rstar.data.packaged import is_packaged, packaged_rows
from rstar.storage import filesystem


@dataclass(frozen=True)
class Columns:
    problem: str = "problem"
    answer: str = "answer"
    id: str | None = "id"  # None: ids are made from the source name and row number


PRESETS = {
    "generic": Columns(),
    # DAPO-Math-17k: the prompt is a chat-message list; the label sits in reward_model.ground_truth
    "dapo": Columns(problem="prompt", answer="reward_model.ground_truth", id=None),
    "openmathreasoning": Columns(problem="problem", answer="expected_answer", id=None),
    "project_euler": Columns(problem="problem", answer="answer", id="id"),
    "aops": Columns(problem="problem", answer="answer", id=None),
}


@dataclass(frozen=True)
class BadRow:
    reason: str
    detail: str
    raw: str


def column_error(path: str, cols: Columns, have) -> str | None:
    """The file-level error when rows with these columns (`have`, top-level names) cannot give
    a problem and an answer: which are missing, which there are, and how to map them."""
    have = sorted(have)
    missing = {
        role: c
        for role, c in (("problem", cols.problem), ("answer", cols.answer))
        if c.split(".")[0] not in have
    }
    if not missing:
        return None
    return (
        f"{path}: no column {' or '.join(repr(c) for c in missing.values())} for the "
        f"{' and '.join(missing)} (its columns: {', '.join(have) or 'none'}); map yours as "
        f"'{path}:problem=<column>,answer=<column>' or name a preset ({', '.join(PRESETS)}) as "
        f"'{path}:<preset>'"
    )


def get_field(row: dict, path: str):
    """A dotted path into nested dicts; a chat-message list yields its last user message."""
    value = row
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    if (
        isinstance(value, list)
        and value
        and all(isinstance(m, dict) and "content" in m for m in value)
    ):
        users = [m["content"] for m in value if m.get("role") == "user"]
        return users[-1] if users else value[-1]["content"]
    return value


def read_rows(source: str, *, split: str = "train") -> Iterator[tuple[int, dict | BadRow]]:
    """Rows of a Parquet file, a JSONL file, a package's problems (rstar.data.packaged), or (any
    other string) a Hugging Face dataset name."""
    if is_packaged(source):
        yield from packaged_rows(source)
    elif source.endswith(".parquet"):
        yield from enumerate(read_parquet(source).to_pylist())
    elif source.endswith((".jsonl", ".json")):
        yield from _jsonl_rows(source)
    elif os.path.exists(source):
        raise DataError(f"{source}: unknown file type (expected .parquet, .jsonl or .json)")
    else:
        yield from _hub_rows(source, split)


def _jsonl_rows(path: str):
    fs, inner = filesystem(path)  # local or s3://, as Parquet is read
    if not fs.exists(inner):
        raise DataError(f"{path}: no such file")
    good = 0
    bad: list[tuple[int, BadRow]] = []
    with io.TextIOWrapper(fs.open(inner, "rb"), encoding="utf-8", errors="replace") as f:
        for i, line in enumerate(f):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                bad.append((i, BadRow("bad_json", f"line {i + 1}: {e.msg}", line[:2000])))
                continue
            if not isinstance(row, dict):
                bad.append(
                    (
                        i,
                        BadRow(
                            "wrong_type",
                            f"line {i + 1}: a JSON {type(row).__name__}, not an object",
                            line[:2000],
                        ),
                    )
                )
                continue
            good += 1
            yield i, row
    if bad and not good:
        raise DataError(
            f"{path}: not JSON lines (no line is a JSON object; line {bad[0][0] + 1}: "
            f"{bad[0][1].detail.split(': ', 1)[-1]})"
        )
    yield from bad


def _hub_rows(name: str, split: str):
    try:
        import datasets
    except ImportError as e:  # pragma: no cover - datasets is a dependency
        raise DataError(
            f"{name}: loading from the Hugging Face hub needs the `datasets` package"
        ) from e
    try:
        ds = datasets.load_dataset(name, split=split)
    except Exception as e:  # noqa: BLE001 - offline, missing, private...: say which and why
        raise DataError(
            f"{name}: not a local file and could not be loaded from the hub ({e})"
        ) from None
    yield from enumerate(ds)
