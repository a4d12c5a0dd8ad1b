"""Is a predicted answer equal to the label? An integer fast path, then symbolic equivalence.

The fast path normalises both sides (thousands separators, `+`, `.0`, `\\text{}`, `$`, `\\!`,
spacing) and compares integer digit strings, so huge integers cost no parsing. Anything else
goes to the `math-verify` package (fractions, radicals, pi, intervals, sets, LaTeX), bounded
by a time limit so one pathological answer cannot stall a batch. A relation `x = 3` is
compared by its value (`math-verify` does that), so it equals `3`.

math-verify's own time limit is SIGALRM: only the main thread may arm it (elsewhere math-verify
raises, which would read as "not equal"), and an alarm that lands inside a C call can surface
later as a `SystemError`. So the limit is armed only in the main thread; `BatchScorer` runs
checks in worker processes without it and enforces its own deadline from outside.
"""

from __future__ import annotations

import logging
import re
import threading


class _NoDisabledTimeoutWarning(logging.Filter):
    """math-verify warns on every call made without its SIGALRM limit; ours are bounded from
    outside."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_NoDisabledTimeoutWarning())

_WRAPPERS = re.compile(r"\\(?:text|textbf|mathrm|mathbf|mbox)\s*\{([^{}]*)\}")
_SPACING = re.compile(r"\\[!,;: ]|\\quad|\\qquad|~|\s+")
_THOUSANDS = re.compile(r"^[+-]?\d{1,3}(,\d{3})+(\.0*)?$")
_INTEGER = re.compile(r"^([+-]?)0*(\d+)(?:\.0*)?$")


def normalize_integer(text: str) -> str | None:
    """'1,000', '+1000', '1000.0', '\\text{1000}', '$1000$' -> '1000'; None if not an integer."""
    s = text.strip().strip("$")
    for _ in range(3):
        s = _WRAPPERS.sub(r"\1", s)
    s = _SPACING.sub("", s).rstrip(".")
    if _THOUSANDS.match(s):
        s = s.replace(",", "")
    m = _INTEGER.match(s)
    if not m:
        return None
    sign, digits = m.groups()
    return digits if sign != "-" or digits == "0" else "-" + digits


def verify(prediction: str | None, ground_truth: str, *, timeout_s: int | None = 5) -> bool:
    """True when `prediction` is mathematically equal to `ground_truth`."""
    if prediction is None or not prediction.strip():
        return False
    a, b = normalize_integer(prediction), normalize_integer(ground_truth)
    if a is not None and b is not None:
        return a == b
    return symbolic_equal(prediction, ground_truth, timeout_s=timeout_s)


def symbolic_equal(prediction: str, ground_truth: str, *, timeout_s: int | None = 5) -> bool:
    """`timeout_s=None`: no SIGALRM (the caller bounds the time); off the main thread always so."""
    from math_verify import parse
    from math_verify import verify as mv_verify

    if threading.current_thread() is not threading.main_thread():
        timeout_s = None

    try:
        gold = parse(f"${ground_truth}$", parsing_timeout=timeout_s)
        pred = parse(f"${prediction}$", parsing_timeout=timeout_s)
        return bool(gold and pred and mv_verify(gold, pred, timeout_seconds=timeout_s))
    except Exception:  # noqa: BLE001 - a malformed or pathological answer is simply not equal
        return False
