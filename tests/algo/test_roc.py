"""GRPO-RoC on crafted groups, penalties on crafted trajectories, and the loss and
advantage against verl's core_algos and the formulas."""

import random
from collections import Counter

import numpy as np
import pytest
import torch

from rstar.algo.loss import grpo_advantages, policy_loss
from rstar.algo.roc import RoCConfig, Sample, p_err, p_format, released_penalties, select


@pytest.mark.parametrize(
    "calls,errors,expected", [(0, 0, 0.5), (4, 1, 0.25), (3, 3, 1.0), (2, 0, 0.0)]
)
def test_p_err(calls, errors, expected):
    assert p_err(calls, errors) == expected


@pytest.mark.parametrize(
    "answers,turns,expected",
    [
        (0, 3, 1.0),  # no <answer>
        (1, 1, 0.0),  # a lone answer without tool calls: no penalty (the released code gives 1)
        (1, 4, 0.0),
        (2, 2, 0.5),
        (3, 1, 1.0),
        (2, 1, 1.0),  # two answers in one turn: the full penalty
        (2, 4, 0.25),
    ],
)
def test_p_format(answers, turns, expected):
    assert p_format(answers, turns) == expected


def test_released_penalties_reproduce_the_public_code():
    text = (
        "<tool_call>x</tool_call><tool_response>\nTraceback... "
        "NameError\n</tool_response><tool_call>y</tool_call><tool_response>\nerror-free result "
        "3\n</tool_response><tool_call>z</tool_call><tool_response>\n42\n</tool_response>"
    )
    err, fmt = released_penalties(text, num_answers=1, turns=4)
    assert err == pytest.approx(2 / 3)  # the word "error" counts, even in "error-free"
    assert fmt == 0.0
    assert released_penalties("no tools", num_answers=1, turns=1) == (0.5, 1.0)  # the off-by-one
    # its turn count is the assistant turns less one
    assert released_penalties("", num_answers=1, turns=2)[1] == 0.0
    assert released_penalties("", num_answers=2, turns=3)[1] == 0.5
    assert released_penalties("", num_answers=4, turns=2)[1] == 1.0  # capped


def group(pos_penalties, n_neg):
    return [Sample(1.0, p, 0.0) for p in pos_penalties] + [Sample(0.0, 0.5, 0.0)] * n_neg


def test_roc_keeps_half_of_each_kind():
    g = group([0.0] * 10, 22)
    kept = select(g, RoCConfig(group_size=16), random.Random(0))
    assert len(kept) == 16 and kept == sorted(kept)
    assert sum(g[i].positive for i in kept) == 5  # floor(16 * 10 / 32 + 0.5)


def test_roc_prefers_low_penalty_positives():
    g = group([0.0] * 4 + [1.5] * 4, 24)  # 8 positives: 4 clean, 4 with p_total 1.5
    counts = Counter()
    for seed in range(3000):
        counts.update(i for i in select(g, RoCConfig(group_size=16), random.Random(seed)) if i < 8)
    clean, dirty = sum(counts[i] for i in range(4)), sum(counts[i] for i in range(4, 8))
    assert clean + dirty == 3000 * 4  # 4 positives kept every time
    assert clean > 2.5 * dirty  # weights 10 vs 0.625: clean ones dominate
    assert min(counts[i] for i in range(4, 8)) > 0  # but no positive is excluded outright


def test_roc_negatives_are_uniform_whatever_their_penalties():
    """Negatives carry every kind of penalty (clean, failed calls, no answer, both); RoC keeps
    each with the same probability: only positives are resampled by penalty."""
    penalties = [(0.0, 0.0), (0.5, 0.0), (1.0, 0.0), (1.0, 1.0), (0.0, 1.0), (0.25, 0.5)]
    negatives = [Sample(0.0, *penalties[i % len(penalties)]) for i in range(16)]
    g = [Sample(1.0, 0.0, 0.0)] * 16 + negatives
    counts = Counter()
    for seed in range(4000):
        counts.update(
            i for i in select(g, RoCConfig(group_size=16), random.Random(seed)) if i >= 16
        )
    freqs = [counts[i] / 4000 for i in range(16, 32)]
    assert all(abs(f - 0.5) < 0.04 for f in freqs), freqs


def _keep_probability(weights: list[float], i: int, k: int) -> float:
    """P(item i is among k drawn without replacement, each draw proportional to weight), k <= 2."""
    total = sum(weights)
    first = weights[i] / total
    if k == 1:
        return first
    return first + sum(
        w / total * weights[i] / (total - w) for j, w in enumerate(weights) if j != i
    )


@pytest.mark.parametrize("n_neg,G,k_pos", [(3, 2, 1), (5, 4, 2)])
def test_positives_are_kept_with_weight_exactly_one_over_penalty_plus_eps(n_neg, G, k_pos):
    """Three positives (p_total 0, 0.4, 1.5: weights 1/(p + 0.1) = 10, 2, 0.625), of which RoC
    keeps `k_pos`: each is kept with the probability that weighted sampling without replacement
    gives, computed here from the formula."""
    from rstar.algo.roc import POSITIVE_WEIGHT_EPS

    assert POSITIVE_WEIGHT_EPS == 0.1  # the weights below are the paper's formula with it
    penalties = [(0.0, 0.0), (0.4, 0.0), (0.5, 1.0)]
    g = [Sample(1.0, *p) for p in penalties] + [Sample(0.0, 0.5, 0.0)] * n_neg
    weights = [10.0, 2.0, 1 / 1.6]
    draws = 20000
    counts = Counter()
    for seed in range(draws):
        kept = [i for i in select(g, RoCConfig(group_size=G), random.Random(seed)) if i < 3]
        assert len(kept) == k_pos
        counts.update(kept)
    for i in range(3):
        expected = _keep_probability(weights, i, k_pos)
        # 4 standard errors of a frequency over 20000 draws
        assert abs(counts[i] / draws - expected) < 4 * (0.25 / draws) ** 0.5, (i, counts, expected)


@pytest.mark.parametrize(
    "n_pos,n_neg,G,kept_pos,kept_neg",
    [
        (32, 0, 16, 16, 0),  # all correct: half of them
        (0, 32, 16, 0, 16),
        (1, 31, 16, 1, 15),  # lopsided: the lone positive stays
        (31, 1, 16, 15, 1),  # the lone negative stays too (both kinds keep the signal)
        (3, 5, 16, 3, 5),  # fewer than G sampled: all kept
        (20, 4, 16, 13, 3),  # short group: shares by proportion (13.3 and 2.7)
        (2, 30, 16, 1, 15),
        (3, 1, 2, 1, 1),  # G = 2: one of each, though the proportion says two positives
    ],
)
def test_small_and_lopsided_groups_still_return_g(n_pos, n_neg, G, kept_pos, kept_neg):
    g = group([0.0] * n_pos, n_neg)
    kept = select(g, RoCConfig(group_size=G), random.Random(1))
    assert (sum(g[i].positive for i in kept), sum(not g[i].positive for i in kept)) == (
        kept_pos,
        kept_neg,
    )
    assert len(kept) == min(G, n_pos + n_neg) and len(set(kept)) == len(kept)


def test_released_mode_and_plain_grpo():
    cfg = RoCConfig(mode="released", group_size=16)
    assert select(group([0.0] * 32, 0), cfg, random.Random(0)) == []  # all equal: dropped
    assert select(group([], 32), cfg, random.Random(0)) == []
    g = group([0.3, 0.0, 0.9, 0.1, 2.0], 27)
    # the 3 lowest penalties, deterministically: whatever the generator draws
    for seed in range(50):
        kept = select(g, cfg, random.Random(seed))
        assert [i for i in kept if g[i].positive] == [0, 1, 3]
    g = group([0.0] * 29, 3)
    kept = select(g, cfg, random.Random(0))
    assert sum(not g[i].positive for i in kept) == 2  # at least min_each negatives
    assert select(group([0.0] * 3, 5), RoCConfig(mode="grpo"), random.Random(0)) == list(range(8))
    # plain GRPO keeps every rollout it is given, even more than G
    grpo = RoCConfig(mode="grpo", group_size=4)
    assert select(group([0.0] * 3, 5), grpo, random.Random(0)) == list(range(8))
    # at least min_each of each kind, but never more positives than there are
    g = group([0.0], 31)
    kept = select(g, cfg, random.Random(0))
    assert len(kept) == 16 and sum(g[i].positive for i in kept) == 1
    assert RoCConfig(mode="grpo").oversample == 1 and RoCConfig().oversample == 2
    with pytest.raises(ValueError, match="RoC mode"):
        RoCConfig(mode="dapo")


def test_advantage_matches_verl_and_the_formula():
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    ids = ["a", "a", "a", "b", "b", "b", "b"]
    mask = torch.tensor(
        [
            [1, 1, 0, 1, 1],
            [1, 0, 0, 0, 0],
            [1, 1, 1, 1, 1],
            [1, 1, 1, 0, 0],
            [0, 1, 1, 1, 1],
            [1, 1, 1, 1, 0],
            [1, 1, 0, 0, 0],
        ]
    )
    adv = grpo_advantages(rewards, mask, ids)
    for i in range(7):
        members = rewards[[j for j in range(7) if ids[j] == ids[i]]]
        expected = (rewards[i] - members.mean()) / (members.std() + 1e-6)  # unbiased std, as verl
        assert torch.allclose(adv[i], expected * mask[i].float(), atol=1e-6)
    token_rewards = torch.zeros(7, 5)
    token_rewards[:, 2] = rewards
    verl_adv, _ = compute_grpo_outcome_advantage(token_rewards, mask.float(), np.array(ids))
    assert torch.allclose(adv, verl_adv)


def test_clip_higher_token_mean_loss():
    mask = torch.tensor([[1, 1, 0, 1, 0], [1, 1, 1, 0, 1]])  # zeros: tool tokens and padding
    adv = torch.tensor([[1.0] * 5, [-1.0] * 5])
    old = torch.zeros(2, 5)
    ratios = torch.tensor([[1.25, 1.35, 9.0, 1.0, 1.0], [0.75, 0.85, 1.1, 9.0, 5.0]])
    loss, metrics = policy_loss(old, ratios.log(), adv, mask)
    # positive advantage: ratio clipped above 1 + 0.28; negative: clipped below 1 - 0.2, and
    # a far-off ratio's loss bounded by 3 |A| (dual clip, verl's clip_ratio_c)
    per_token = torch.tensor([[-1.25, -1.28, 0.0, -1.0, 0.0], [0.8, 0.85, 1.1, 0.0, 3.0]])
    assert loss.item() == pytest.approx(per_token.sum().item() / mask.sum().item(), abs=1e-5)
    # 1.35 and 0.75 (verl counts the dual clip apart); masked tokens never count
    assert metrics["clip_fraction"] == pytest.approx(2 / 7)
    half, _ = policy_loss(old[:1], ratios[:1].log(), adv[:1], mask[:1], batch_num_tokens=7)
    other, _ = policy_loss(old[1:], ratios[1:].log(), adv[1:], mask[1:], batch_num_tokens=7)
    assert (half + other).item() == pytest.approx(loss.item(), abs=1e-6)  # micro-batches add up


def test_keep_indices_applies_select_per_prompt_group_in_sorted_group_order():
    from rstar.algo.roc import Rollout, keep_indices

    # two prompts' rollouts interleaved, as a batch may hold them; group "b" sorts after "a"
    rollouts = [
        Rollout("b" if i % 2 else "a", float(i % 4 < 2), 2, i % 3 == 0, 1, 2) for i in range(16)
    ]
    kept = keep_indices(rollouts, RoCConfig(group_size=4), random.Random(7))
    assert len(kept) == 8 and kept[:4] == sorted(kept[:4]) and kept[4:] == sorted(kept[4:])
    assert {rollouts[i].group for i in kept[:4]} == {"a"} and {
        rollouts[i].group for i in kept[4:]
    } == {"b"}
    # the same draws as select() on each group in turn, with one generator
    rng = random.Random(7)
    expected = []
    for gid in ("a", "b"):
        rows = [i for i, r in enumerate(rollouts) if r.group == gid]
        expected += [
            rows[j]
            for j in select([rollouts[i].sample() for i in rows], RoCConfig(group_size=4), rng)
        ]
    assert kept == expected
