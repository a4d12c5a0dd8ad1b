"""Content digests: what caches are keyed on and what MLflow records for datasets and models."""

from __future__ import annotations

import hashlib

from rstar.storage import filesystem


def digest(uri: str, skip: tuple[str, ...] = ()) -> str:
    """sha256 (first 16 hex digits) of a file's bytes, or of a directory's files (relative
    names and bytes, hidden files and files named in `skip` left out); local or s3://."""
    fs, root = filesystem(uri)
    h = hashlib.sha256()
    if fs.isdir(root):
        files = sorted(
            p
            for p in fs.find(root)
            if not p.rsplit("/", 1)[-1].startswith(".") and p.rsplit("/", 1)[-1] not in skip
        )
    else:
        files = [root]
    for path in files:
        h.update(path[len(root) :].encode())
        with fs.open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()[:16]
