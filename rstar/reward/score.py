"""Answer-only reward: 1 when the extracted answer verifies against the label, else 0.

Truncated trajectories score 0 and are kept (the paper found dropping them, "overlong
filtering", made answers longer and more repetitive). `BatchScorer` scores many at once:
integer answers inline (a string comparison), the rest on a pool of processes, each item
bounded by a deadline from outside (`timeout_s` + 2 s; a worker past it is replaced), never
by a signal inside the worker (rstar.reward.verify).
"""

from __future__ import annotations

import multiprocessing as mp
import os
from dataclasses import dataclass

from rstar.reward.extract import extract_answer
from rstar.reward.verify import normalize_integer, symbolic_equal


@dataclass(frozen=True)
class ScoreItem:
    response: str
    ground_truth: str
    truncated: bool = False


def score(
    response: str,
    ground_truth: str,
    *,
    truncated: bool = False,
    fallback_to_any_boxed: bool = True,
    timeout_s: int = 5,
) -> float:
    if truncated:
        return 0.0
    from rstar.reward.verify import verify

    return float(
        verify(
            extract_answer(response, fallback_to_any_boxed=fallback_to_any_boxed),
            ground_truth,
            timeout_s=timeout_s,
        )
    )


def _symbolic(args: tuple[str, str]) -> bool:
    # no SIGALRM in the workers (rstar.reward.verify): the pool's deadline bounds each check
    return symbolic_equal(*args, timeout_s=None)


def _warm_up() -> None:
    """A worker imports math-verify (and sympy) before its first item, so an item's deadline
    measures the check, not a cold import on a busy machine."""
    symbolic_equal("1", "1")


START_TIMEOUT_S = 120


class BatchScorer:
    """Parallel scoring. Use as a context manager, or call `close()`."""

    check = staticmethod(_symbolic)  # runs in the pool's workers

    def __init__(
        self, workers: int | None = None, *, timeout_s: int = 5, fallback_to_any_boxed: bool = True
    ) -> None:
        self.workers = workers or os.cpu_count() or 1
        self.timeout_s = timeout_s
        self.fallback = fallback_to_any_boxed
        self._pool: mp.pool.Pool | None = None
        self.timeouts = 0

    def __enter__(self) -> BatchScorer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None

    def _get_pool(self):
        if self._pool is None:  # spawn: safe next to threads (Ray, torch) in the parent
            self._pool = mp.get_context("spawn").Pool(self.workers, initializer=_warm_up)
            try:  # items' deadlines start once workers are warm
                self._pool.map_async(int, range(self.workers), chunksize=1).get(
                    timeout=START_TIMEOUT_S
                )
            except mp.TimeoutError:
                self.close()
                raise RuntimeError(
                    f"answer-checking workers did not start within {START_TIMEOUT_S} s (a spawned "
                    "worker re-imports the main module: is its code under `if __name__ == "
                    "'__main__'`?)"
                ) from None
        return self._pool

    def score_many(self, items: list[ScoreItem]) -> list[float]:
        scores: list[float] = [0.0] * len(items)
        symbolic: list[tuple[int, str, str]] = []
        for i, item in enumerate(items):
            if item.truncated:
                continue
            pred = extract_answer(item.response, fallback_to_any_boxed=self.fallback)
            if pred is None or not pred.strip():
                continue
            a, b = normalize_integer(pred), normalize_integer(item.ground_truth)
            if a is not None and b is not None:
                scores[i] = float(a == b)
            else:
                symbolic.append((i, pred, item.ground_truth))
        if symbolic:
            for i, ok in zip(
                (s[0] for s in symbolic), self._verify_symbolic([s[1:] for s in symbolic])
            ):
                scores[i] = float(ok)
        return scores

    def _verify_symbolic(self, pairs: list[tuple[str, str]]) -> list[bool]:
        out: list[bool] = []
        while len(out) < len(pairs):
            pool = self._get_pool()
            pending = [pool.apply_async(self.check, ((p, g),)) for p, g in pairs[len(out) :]]
            try:
                for res in pending:
                    out.append(res.get(timeout=self.timeout_s + 2))
            except mp.TimeoutError:  # stuck below Python: count it wrong, replace the pool and
                self.timeouts += 1  # resubmit the rest (the old pool's results never come)
                out.append(False)
                self.close()
        return out
