"""The local engine: continuous batching gives what one-at-a-time greedy decoding gives."""

import asyncio

import pytest
import torch

from rstar.rollout.hf_engine import HFEngine


@pytest.fixture(scope="module")
def model(tiny_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)


def reference_greedy(model, prompt, n):
    ids = torch.tensor([prompt])
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=n,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize("stagger", [0.01, 0.0])
async def test_batched_greedy_matches_unbatched(model, stagger):
    """Requests that join a batch already decoding (stagger), or arrive together and are
    pre-filled in one left-padded pass, decode what each would alone."""
    engine = HFEngine(model, max_batch=8)
    prompts = [[5 + i] * (3 + 7 * i) for i in range(6)]  # different lengths
    max_tokens = [12, 5, 20, 9, 16, 3]

    async def one(i):
        await asyncio.sleep(stagger * i)
        return await engine.generate(
            f"r{i}", prompts[i], {"max_tokens": max_tokens[i], "temperature": 0}
        )

    gens = await asyncio.gather(*(one(i) for i in range(6)))
    await engine.close()
    for p, n, g in zip(prompts, max_tokens, gens):
        assert g.token_ids == reference_greedy(model, p, n)
        # the same distributions, not only the same argmax (positions, padding)
        with torch.no_grad():
            logits = model(torch.tensor([p + g.token_ids])).logits[0, len(p) - 1 : -1]
        expected = (
            torch.log_softmax(logits, -1).gather(-1, torch.tensor(g.token_ids)[:, None]).squeeze(-1)
        )
        assert g.log_probs == pytest.approx(expected.tolist(), abs=1e-4)
        assert g.stop_reason == "length" and len(g.log_probs) == len(g.entropies) == n
        assert all(lp <= 0 for lp in g.log_probs) and all(e >= 0 for e in g.entropies)
    assert engine.steps < sum(max_tokens) - 6  # several sequences advanced per step


async def test_stop_tokens_sampling_and_reproducibility(model):
    engine = HFEngine(model, seed=3)
    first = await engine.generate("a", [7, 8, 9], {"max_tokens": 30, "temperature": 0})
    stop = first.token_ids[2]
    g = await engine.generate(
        "b", [7, 8, 9], {"max_tokens": 30, "temperature": 0, "stop_token_ids": [stop]}
    )
    assert (
        g.token_ids == first.token_ids[: first.token_ids.index(stop) + 1]
        and g.stop_reason == "stop"
    )
    s1 = await engine.generate("same-id", [7, 8, 9], {"max_tokens": 15, "temperature": 1.0})
    s2 = await engine.generate("same-id", [7, 8, 9], {"max_tokens": 15, "temperature": 1.0})
    s3 = await engine.generate("other-id", [7, 8, 9], {"max_tokens": 15, "temperature": 1.0})
    assert s1.token_ids == s2.token_ids and s1.token_ids != s3.token_ids
    # the reported log-prob is the log-prob of the sampled token under the sampled distribution
    with torch.no_grad():
        logits = model(torch.tensor([[7, 8, 9]])).logits[0, -1]
    assert s1.log_probs[0] == pytest.approx(
        float(torch.log_softmax(logits, -1)[s1.token_ids[0]]), abs=1e-4
    )
    await engine.close()


def test_sampler_draws_each_rows_tempered_nucleus():
    """Rows with different settings in one batch: each is drawn from its own distribution."""
    from rstar.rollout.hf_engine import sample

    n = 20000
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, -30.0]).repeat(4 * n, 1)
    settings = [(1.0, 1.0), (0.5, 1.0), (1.0, 0.8), (0.0, 1.0)]  # (temperature, top_p) per block
    temps = torch.tensor([t for t, _ in settings]).repeat_interleave(n)
    top_p = torch.tensor([p for _, p in settings]).repeat_interleave(n)
    u = torch.rand(4 * n, generator=torch.Generator().manual_seed(0))
    tokens, log_probs, entropies = sample(logits, temps, top_p, u)

    p1 = torch.softmax(logits[0], -1)
    nucleus = torch.zeros(5)
    nucleus[:2] = p1[:2] / p1[:2].sum()  # 0.64 < 0.8 <= 0.64 + 0.24
    expected = [p1, torch.softmax(logits[0] / 0.5, -1), nucleus, torch.eye(5)[0]]
    for block, want in enumerate(expected):
        drawn = tokens[block * n : (block + 1) * n]
        freq = torch.bincount(drawn, minlength=5).float() / n
        assert torch.allclose(freq, want, atol=0.01), (block, freq, want)
    # log-probs and entropies are those of the tempered distribution, before the nucleus
    logp = torch.log_softmax(logits / torch.where(temps > 0, temps, 1.0)[:, None], -1)
    assert torch.allclose(log_probs, logp.gather(-1, tokens[:, None]).squeeze(-1))
    assert torch.allclose(entropies, -(logp.exp() * logp).sum(-1), atol=1e-6)


async def test_what_a_request_samples_does_not_depend_on_its_batch(model):
    params = {"max_tokens": 12, "temperature": 1.0}
    alone = HFEngine(model, seed=1)
    solo = await alone.generate("x", [7, 8, 9], params)
    await alone.close()
    crowded = HFEngine(model, seed=1)
    others = [crowded.generate(f"o{i}", [5 + i] * (2 + 3 * i), params) for i in range(5)]
    together, *_ = await asyncio.gather(crowded.generate("x", [7, 8, 9], params), *others)
    await crowded.close()
    assert together.token_ids == solo.token_ids


async def test_the_output_head_runs_on_the_last_position_only(model):
    """Pre-filling computes one row of logits per request, not one per prompt token: with a real
    vocabulary (49K types) the full [requests, prompt, vocab] tensor ran a mining stage out of
    memory."""
    widths = []
    hook = model.lm_head.register_forward_hook(lambda m, i, o: widths.append(o.shape[1]))
    engine = HFEngine(model, max_batch=8)
    try:
        await asyncio.gather(
            *(
                engine.generate(f"r{i}", [5 + i] * 40, {"max_tokens": 3, "temperature": 0})
                for i in range(4)
            )
        )
    finally:
        hook.remove()
        await engine.close()
    assert widths and set(widths) == {1}


async def test_the_cache_is_rebuilt_one_layer_at_a_time(model, monkeypatch):
    """A request joining or leaving the batch rebuilds its cache layer by layer, each old layer
    freed before the next new one is made: built whole, the cache was held three times over
    (9.1 GB for one of SmolLM2's evaluation checkpoints here, 5.4 GB layer by layer)."""
    import weakref

    from rstar.rollout import hf_engine

    live, most = weakref.WeakSet(), [0]

    class Counted(hf_engine._GrowingLayer):
        def __init__(self, keys, values):
            super().__init__(keys, values)
            live.add(self)
            most[0] = max(most[0], len(live))

    monkeypatch.setattr(hf_engine, "_GrowingLayer", Counted)
    engine = HFEngine(model, max_batch=8)

    async def one(i):
        await asyncio.sleep(0.01 * i)  # joins a batch already decoding
        return await engine.generate(f"r{i}", [5 + i] * (3 + 5 * i), {"max_tokens": 4 + 3 * i})

    try:
        await asyncio.gather(*(one(i) for i in range(5)))
    finally:
        await engine.close()
    layers = model.config.num_hidden_layers
    assert layers < most[0] <= layers + 1, most  # some rebuild ran, never two whole caches
