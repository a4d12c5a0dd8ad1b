"""Where rstar's log lines go. The library logs through `logging` (a logger per module, under
"rstar") and never decides where its lines go; the `rstar` command does, with `configure`:
one plain line per record on standard error, at the level `--log-level` names.

A stage runs in a Ray worker and verl in processes of its own: the level travels to them in
`RSTAR_LOG_LEVEL` (forwarded like every RSTAR_ variable) and their entry points call
`configure()` again. The "rstar" logger does not pass its records on to the root logger, where
Prefect's console handler would print them a second time in the flow's process.
"""

from __future__ import annotations

import logging
import os
import sys

LEVEL_ENV = "RSTAR_LOG_LEVEL"


class _Stderr(logging.StreamHandler):
    """Writes to whatever `sys.stderr` is when a record comes: above rich's progress bars while
    they redirect it, into a test's capture."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler sets it once; the property above wins
        pass


def configure(level: str | None = None) -> None:
    """rstar's records at `level` (default: RSTAR_LOG_LEVEL, else INFO) and above, to stderr."""
    level = (level or os.environ.get(LEVEL_ENV) or "INFO").upper()
    os.environ[LEVEL_ENV] = level
    logger = logging.getLogger("rstar")
    logger.setLevel(level)
    if not any(isinstance(h, _Stderr) for h in logger.handlers):
        handler = _Stderr()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    logger.propagate = False
