"""Where the project's files live: a local directory or `s3://bucket/prefix` (through fsspec
and s3fs). Every write is atomic: locally a temporary file moved into place, on S3 a single
object upload that exists whole or not at all.

S3 endpoints other than AWS (MinIO, moto on loopback) come from `RSTAR_S3_ENDPOINT_URL`
or the standard `AWS_ENDPOINT_URL`; credentials from the usual AWS variables.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable


def is_remote(uri: str) -> bool:
    return "://" in uri and not uri.startswith("file://")


def filesystem(uri: str):
    """(fsspec filesystem, path within it) for a local path or a URI."""
    import fsspec

    options = {}
    endpoint = os.environ.get("RSTAR_S3_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL")
    if uri.startswith("s3://") and endpoint:
        options["client_kwargs"] = {"endpoint_url": endpoint}
    return fsspec.core.url_to_fs(uri, **options)


def remove_tree(uri: str) -> None:
    """Remove the directory (or prefix) at `uri`, local or remote, if there is one."""
    fs, path = filesystem(uri)
    if fs.exists(path):
        fs.rm(path, recursive=True)


# The process's umask, read once at import (reading it means setting it, which is not thread-safe
# later): an atomically written file gets the mode a plain open() would give it, not mkstemp's 0600.
_UMASK = os.umask(0o022)
os.umask(_UMASK)


def atomic_write(path: str, write: Callable[[str], None]) -> str:
    """Call `write(tmp_path)` for a local temporary file, then put it at `path` atomically."""
    if is_remote(path):
        fs, target = filesystem(path)
        with tempfile.TemporaryDirectory() as d:
            tmp = os.path.join(d, "upload")
            write(tmp)
            fs.put_file(tmp, target)  # one PUT (or a multipart upload completed at once)
        return path
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_UMASK)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path: str, text: str) -> str:
    def write(tmp: str) -> None:
        with open(tmp, "w") as f:
            f.write(text)

    return atomic_write(path, write)
