"""Errors that another attempt cannot fix: a recipe, a data file, a permission, a server that is
not there. Stages failing with one are not retried (tasks/stage.py), and the CLI prints them as
one line. Everything else (a killed worker, a lost node, a flaky network) is retried."""

from __future__ import annotations

import errno


class NotRetryable(Exception):
    """Mixed into the project's own error classes for what a person has to fix."""


_PERMANENT_ERRNO = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EISDIR}


def retry_pointless(exc: BaseException | None) -> bool:
    """True for errors another attempt would meet again."""
    if isinstance(exc, NotRetryable):
        return True
    return (
        isinstance(exc, OSError)
        and not isinstance(exc, ConnectionError)
        and exc.errno in _PERMANENT_ERRNO
    )
