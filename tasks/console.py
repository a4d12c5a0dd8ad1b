"""Progress bars in a terminal while a stage runs, with Prefect's log lines above them."""

from __future__ import annotations

import logging
import sys
from contextlib import contextmanager

from rstar.pipeline.progress import Bars


class LinesAbove:
    """Stands in for a Prefect console handler's rich console while bars are shown: its log
    lines are printed through the bars' console, so they land above the bars, not across them."""

    def __init__(self, console) -> None:
        self.console = console

    def print(self, message, **kwargs) -> None:
        from rich.text import Text

        self.console.print(Text(str(message)), **kwargs)


@contextmanager
def progress_bars():
    """In a terminal, a progress bar per task of the stage, fed by its worker
    (rstar.pipeline.progress); piped, nothing (the worker logs plain lines)."""
    if not sys.stdout.isatty():
        yield None
        return
    from prefect.logging.handlers import PrefectConsoleHandler

    loggers = [logging.getLogger()] + [
        lg for lg in logging.root.manager.loggerDict.values() if isinstance(lg, logging.Logger)
    ]
    handlers = [h for lg in loggers for h in lg.handlers if isinstance(h, PrefectConsoleHandler)]
    with Bars() as bars:
        saved = [(h, h.console) for h in handlers]
        for h in handlers:
            h.console = LinesAbove(bars.progress.console)
        try:
            yield bars.update
        finally:
            for h, console in saved:
                h.console = console
