"""The reward decides what the model learns: a broad table of equal and unequal answers,
extraction traps, and batch scoring."""

import pytest

from rstar.reward import (
    BatchScorer,
    ScoreItem,
    boxed_contents,
    extract_answer,
    normalize_integer,
    score,
    verify,
)

EQUAL = [
    ("1000", "1000"),
    ("1,000", "1000"),
    ("1000.0", "1000"),
    ("+1000", "1000"),
    ("\\text{1000}", "1000"),
    ("$1000$", "1000"),
    ("1\\,000", "1000"),
    ("1\\!000", "1000"),
    ("\\mathrm{42}", "42"),
    ("042", "42"),
    ("-7", "-7"),
    ("-0", "0"),
    ("12,345,678", "12345678"),
    (str(2**200), str(2**200)),
    ("9" * 5000, "9" * 5000),  # past int()'s 4300-digit limit
    ("2^{100}", str(2**100)),
    ("10^{5}", "100000"),
    ("0.5", "\\frac{1}{2}"),
    ("\\frac{2}{4}", "\\frac12"),
    ("\\dfrac{3}{6}", "0.5"),
    ("\\sqrt{8}", "2\\sqrt{2}"),
    ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}"),
    ("2\\pi", "\\pi \\cdot 2"),
    ("x=3", "3"),
    ("[1,2)", "[1,2)"),
    ("\\{1,2\\}", "\\{2,1\\}"),
    ("(-\\infty, 0]", "(-\\infty,0]"),
]
UNEQUAL = [
    ("999", "1000"),
    ("1,00", "100"),
    ("-1000", "1000"),
    ("1000.5", "1000"),
    (str(2**200 + 1), str(2**200)),
    ("9" * 5000, "9" * 4999 + "8"),
    ("\\pi", "3.14159"),
    ("0.5", "\\frac{1}{3}"),
    ("\\sqrt{2}", "1.41"),
    ("[1,2)", "[1,2]"),
    ("\\{1,2\\}", "\\{1,3\\}"),
    ("x=4", "3"),
    ("", "3"),
    ("\\frac{1}{0}", "1"),
    ("seven", "7"),
    ("\\boxed{}", "1"),
]


@pytest.mark.parametrize("pred,gold", EQUAL)
def test_equal_pairs(pred, gold):
    assert verify(pred, gold)


@pytest.mark.parametrize("pred,gold", UNEQUAL)
def test_unequal_pairs(pred, gold):
    assert not verify(pred, gold)


def test_none_prediction_is_wrong():
    assert not verify(None, "1")


@pytest.mark.parametrize(
    "text,expected",
    [
        ("1,000", "1000"),
        ("  +12 ", "12"),
        ("\\text{ 7 }", "7"),
        ("3.000", "3"),
        ("1,0000", None),
        ("1.5", None),
        ("x", None),
        ("--3", None),
        ("-00", "0"),
    ],
)
def test_integer_normalisation(text, expected):
    assert normalize_integer(text) == expected


@pytest.mark.parametrize(
    "response,expected",
    [
        # the boxed answer inside <answer> wins over one written while reasoning
        ("<reason>try \\boxed{5}</reason><answer>The answer is \\boxed{6}.</answer>", "6"),
        # several <answer> blocks: the last one counts; several boxes inside it: the last one
        ("<answer>\\boxed{1}</answer> wait <answer>\\boxed{2} or \\boxed{3}</answer>", "3"),
        ("<answer>\\boxed{\\frac{a}{b^{2}}}</answer>", "\\frac{a}{b^{2}}"),  # nested braces
        ("<answer>\\boxed{a \\{ b}</answer>", "a \\{ b"),  # escaped braces are content
        ("<answer>\\boxed {12}</answer>", "12"),
        ("<answer>\\fbox{12}</answer>", "12"),
        ("<answer>\\boxed{12</answer>", None),  # unbalanced: no answer
        ("<answer>12</answer>", None),  # no box at all
        ("no tags, but \\boxed{4} and finally \\boxed{9}", "9"),  # fallback: the last box anywhere
        ("<answer>no box</answer> but \\boxed{8} before", "8"),  # fallback when <answer> holds none
        ("", None),
    ],
)
def test_extract_answer(response, expected):
    assert extract_answer(response) == expected


def test_fallback_can_be_turned_off():
    assert extract_answer("\\boxed{4}", fallback_to_any_boxed=False) is None
    assert extract_answer("<answer>\\boxed{4}</answer>", fallback_to_any_boxed=False) == "4"


def test_boxed_contents_in_order():
    assert boxed_contents("\\boxed{1} x \\boxed{{2}} \\boxed{3") == ["1", "{2}"]


def test_score_and_truncation():
    good = "<reason>6*7</reason><answer>\\boxed{42}</answer>"
    assert score(good, "42") == 1.0
    assert score(good, "42", truncated=True) == 0.0  # kept, but worth nothing
    assert score(good, "43") == 0.0
    assert score("<answer>\\boxed{0.5}</answer>", "\\frac{1}{2}") == 1.0


def test_batch_scorer_matches_single_scoring():
    responses = [f"<answer>\\boxed{{{p}}}</answer>" for p, _ in EQUAL + UNEQUAL]
    labels = [g for _, g in EQUAL + UNEQUAL]
    items = [ScoreItem(r, g) for r, g in zip(responses, labels)] + [
        ScoreItem(responses[0], labels[0], True)
    ]
    with BatchScorer(workers=2) as scorer:
        got = scorer.score_many(items)
    assert got == [1.0] * len(EQUAL) + [0.0] * len(UNEQUAL) + [0.0]
    assert got[:-1] == [score(r, g) for r, g in zip(responses, labels)]


def test_pathological_answer_does_not_stall_the_batch():
    import time

    nasty = (
        "<answer>\\boxed{" + "(" * 300 + "1" + ")" * 300 + "^{" * 50 + "2" + "}" * 50 + "}</answer>"
    )
    with BatchScorer(workers=2, timeout_s=2) as scorer:
        start = time.monotonic()
        got = scorer.score_many(
            [ScoreItem(nasty, "3")] * 2 + [ScoreItem("<answer>\\boxed{3}</answer>", "3")]
        )
        assert time.monotonic() - start < 20
    assert got == [0.0, 0.0, 1.0]


def _hangs_on_x(args):
    """A check stuck below Python's reach on the answer "x" (a worker of the pool)."""
    import time

    from rstar.reward.score import _symbolic

    while args[0] == "x":
        time.sleep(1)
    return _symbolic(args)


class _HangingScorer(BatchScorer):
    check = staticmethod(_hangs_on_x)


def test_items_after_a_stuck_one_are_still_verified():
    """A timed-out item replaces the pool; the symbolic items queued behind it are resubmitted,
    not left waiting on the old pool's results (which made every one of them time out too)."""
    half = ScoreItem("<answer>\\boxed{0.5}</answer>", "\\frac{1}{2}")
    with _HangingScorer(workers=1, timeout_s=1) as scorer:
        got = scorer.score_many([ScoreItem("<answer>\\boxed{x}</answer>", "y"), half, half])
        assert scorer.timeouts == 1
    assert got == [0.0, 1.0, 1.0]


def _cannot_start():
    raise ImportError("a worker that cannot start (say, an unguarded main module)")


def test_workers_that_never_start_raise_a_clear_error(monkeypatch):
    import importlib

    # rstar.reward.score is also a function
    score_module = importlib.import_module("rstar.reward.score")
    monkeypatch.setattr(score_module, "_warm_up", _cannot_start)
    monkeypatch.setattr(score_module, "START_TIMEOUT_S", 3)
    with BatchScorer(workers=1) as scorer:
        with pytest.raises(RuntimeError, match="did not start within 3 s"):
            scorer.score_many([ScoreItem("<answer>\\boxed{0.5}</answer>", "\\frac{1}{2}")])


def test_a_check_arms_no_alarm_in_a_worker_and_works_off_the_main_thread(monkeypatch):
    """math-verify's limit is SIGALRM, which fired inside C calls under load (a SystemError that
    killed a mining stage) and which only the main thread may arm (off it, every symbolic
    answer read as wrong). Workers check without it; other threads too."""
    import signal
    import threading

    from rstar.reward.score import BatchScorer
    from rstar.reward.verify import symbolic_equal

    armed = []
    real_alarm = signal.alarm
    monkeypatch.setattr(signal, "alarm", lambda s: armed.append(s) or real_alarm(s))
    assert BatchScorer.check(("0.5", "\\frac{1}{2}")) is True  # what a pool worker runs
    assert [s for s in armed if s] == []
    found = []
    worker = threading.Thread(target=lambda: found.append(symbolic_equal("0.5", "\\frac{1}{2}")))
    worker.start()
    worker.join()
    assert found == [True]


def test_an_answer_the_checker_cannot_parse_is_not_equal(monkeypatch):
    """math-verify raising (a malformed or pathological answer) scores 0, never 1."""
    import math_verify

    from rstar.reward.verify import symbolic_equal

    def broken(*args, **kwargs):
        raise ValueError("unparseable")

    monkeypatch.setattr(math_verify, "parse", broken)
    assert symbolic_equal("\\frac{1}{2}", "0.5") is False


def test_score_falls_back_to_any_boxed_answer_unless_told_not_to():
    from rstar.reward.score import score

    response = "<reason>so it is \\boxed{42}</reason>"  # no <answer> block
    assert score(response, "42") == 1.0
    assert score(response, "42", fallback_to_any_boxed=False) == 0.0
