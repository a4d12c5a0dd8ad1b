"""Answer-only reward for math: extraction, verification, scoring.

Usage:

    from rstar.reward import extract_answer, verify, score, BatchScorer, ScoreItem

    extract_answer("<reason>...</reason><answer>\\\\boxed{42}</answer>")   # '42'
    verify("1,000", "1000")                                                # True
    score(response, "42", truncated=False)                                  # 1.0 or 0.0
    with BatchScorer() as scorer:
        scorer.score_many([ScoreItem(response, "42")])
"""

from rstar.reward.extract import boxed_contents, extract_answer
from rstar.reward.score import BatchScorer, ScoreItem, score
from rstar.reward.verify import normalize_integer, verify

__all__ = [
    "extract_answer",
    "boxed_contents",
    "verify",
    "normalize_integer",
    "score",
    "BatchScorer",
    "ScoreItem",
]
