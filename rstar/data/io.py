"""Reading and writing the project's Parquet files: atomic writes, checked reads."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq

from rstar.data.schema import VERSION, schema
from rstar.errors import NotRetryable
from rstar.storage import atomic_write, atomic_write_text, filesystem, is_remote


class DataError(NotRetryable, ValueError):
    """A file or row that is not what it claims to be; the message names it and the problem."""


def write_table(rows: list[dict] | pa.Table, path: str, schema_name: str) -> str:
    """Write rows as Parquet with the named schema, atomically (a crash leaves the old file or
    none, never half a file)."""
    table = (
        rows
        if isinstance(rows, pa.Table)
        else pa.Table.from_pylist(rows, schema=schema(schema_name))
    )
    table = table.cast(schema(schema_name))
    return atomic_write(path, lambda tmp: pq.write_table(table, tmp))


def read_parquet(path: str, columns: list[str] | None = None) -> pa.Table:
    """Any Parquet file, local or s3:// (only `columns`, if given); a missing or non-Parquet one
    raises DataError naming it."""
    fs, inner = filesystem(path)
    if not fs.exists(inner):
        raise DataError(f"{path}: no such file")
    try:
        if not is_remote(path):
            # natively, not through a Python file object: pyarrow's I/O threads then never wait
            # on the GIL, which at interpreter exit aborted the process ("terminate called
            # without an active exception")
            return pq.read_table(inner, columns=columns)
        with fs.open(inner, "rb") as f:
            return pq.read_table(f, columns=columns)
    except (pa.ArrowInvalid, OSError) as e:
        raise DataError(f"{path}: not a readable Parquet file ({e})") from None


def read_table(path: str, schema_name: str | tuple[str, ...]) -> pa.Table:
    """Read a file written by `write_table` with (one of) the named schema(s), refusing
    anything else with a clear error."""
    names = (schema_name,) if isinstance(schema_name, str) else schema_name
    table = read_parquet(path)
    meta = table.schema.metadata or {}
    found = meta.get(b"rstar.schema", b"").decode()
    if found not in names:
        raise DataError(
            f"{path}: expected a {' or '.join(map(repr, names))} file, found "
            f"{found or 'no rstar schema'!r}"
        )
    version = meta.get(b"rstar.schema_version", b"").decode()
    if version != VERSION:
        raise DataError(f"{path}: schema version {version!r}, this code reads version {VERSION!r}")
    missing = set(schema(found).names) - set(table.schema.names)
    if missing:
        raise DataError(f"{path}: missing columns {sorted(missing)}")
    return table


def write_json(obj, path: str) -> str:
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True))
