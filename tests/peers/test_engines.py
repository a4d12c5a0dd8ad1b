"""`rstar bench-engines`'s summary: the figures the engine decision rests on."""

from rstar.bench.peers.engines import summarize


def _step(seconds, tokens, turns=4, rollouts=4, correct=1):
    return {
        "seconds": seconds,
        "tokens": tokens,
        "turns": turns,
        "rollouts": rollouts,
        "correct": correct,
    }


def test_the_warm_up_step_is_left_out_and_rates_are_ratios_of_totals():
    # the first step is slow (caches warming); a mean of per-step rates would weigh the short
    # step as much as the long one, the ratio of totals does not
    history = {"hf": [_step(100.0, 10), _step(1.0, 100), _step(3.0, 500, correct=3)]}
    s = summarize(history)["hf"]
    assert s["step_s"] == 2.0
    assert s["tokens_per_step"] == 300.0
    assert s["tokens_per_s"] == 150.0
    assert s["turns_per_rollout"] == 1.0
    assert s["accuracy"] == 0.5


def test_a_single_step_is_kept():
    s = summarize({"vllm": [_step(2.0, 50)]})["vllm"]
    assert s["step_s"] == 2.0 and s["tokens_per_s"] == 25.0
