"""Where the project's files live. Every write is atomic: a crash leaves the old file or none."""
from __future__ import annotations

import os
import tempfile
from collections.abc import Callable


def atomic_write(path: str, write: Callable[[str], None]) -> str:
    """Call `write(tmp_path)` for a temporary file beside `path`, then move it into place."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
    os.close(fd)
    try:
        write(tmp)
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
