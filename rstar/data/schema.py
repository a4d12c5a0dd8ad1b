"""The project's Parquet schemas, versioned in one place (documented in docs/schemas.md).

Every file carries its schema name and version in the Parquet key-value metadata
(`rstar.schema`, `rstar.schema_version`), so a reader can refuse a file that is not what
it claims to be with a message naming the file and the problem.
"""
from __future__ import annotations

import pyarrow as pa

VERSION = "1"

_PROBLEM_FIELDS = [
    pa.field("id", pa.string(), nullable=False),        # unique within a dataset
    pa.field("problem", pa.string(), nullable=False),   # the question as the model sees it
    pa.field("answer", pa.string(), nullable=False),    # the label, verified by rstar.reward.verify
    pa.field("source", pa.string(), nullable=False),    # where it came from (file, hub name, generator)
    pa.field("metadata", pa.string(), nullable=False),  # JSON object: everything else the source had
]

SCHEMAS: dict[str, pa.Schema] = {
    "problems": pa.schema(_PROBLEM_FIELDS),
    "hard_problems": pa.schema(_PROBLEM_FIELDS + [
        pa.field("n_samples", pa.int32(), nullable=False),   # rollouts seen for the problem
        pa.field("n_correct", pa.int32(), nullable=False),
        pa.field("pass_rate", pa.float64(), nullable=False),
    ]),
    "rejects": pa.schema([
        pa.field("row_id", pa.int64(), nullable=False),      # 0-based row (JSONL: line) in its source
        pa.field("source", pa.string(), nullable=False),
        pa.field("reason", pa.string(), nullable=False),     # one of rstar.data.curate.REASONS
        pa.field("detail", pa.string(), nullable=False),
        pa.field("raw", pa.string(), nullable=False),        # the row as JSON, cut to 2,000 chars
    ]),
    "sft": pa.schema([
        pa.field("id", pa.string(), nullable=False),
        pa.field("task", pa.string(), nullable=False),       # what the example teaches
        pa.field("source", pa.string(), nullable=False),
        pa.field("messages", pa.string(), nullable=False),   # JSON list of chat messages (see docs)
    ]),
}


def schema(name: str) -> pa.Schema:
    try:
        base = SCHEMAS[name]
    except KeyError:
        raise KeyError(f"unknown schema {name!r}; known: {sorted(SCHEMAS)}") from None
    return base.with_metadata({"rstar.schema": name, "rstar.schema_version": VERSION})
