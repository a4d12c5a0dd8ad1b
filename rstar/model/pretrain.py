"""Pretraining the tiny base model: what a real base model brings to the recipe, in miniature.

Qwen3-14B-Base already copies numbers from its context and knows how math notation is
written in Python; the recipe (SFT, then RL) never teaches either. A model of a few million
parameters knows nothing, so the embedded default gives it that knowledge first with a
language-modelling pass over generated text: sentences mapping notation to Python (x -> *,
^ -> **, mod -> %, pow) and copy drills. None of it contains a problem of the RL set or its
answer: solving the problems with the tool is still left to SFT (the format) and RL.
"""
from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

import torch

from rstar.agent.format import IM_END, IM_START


@dataclass
class PretrainConfig:
    steps: int = 2000
    batch_size: int = 32
    lr: float = 1e-3
    warmup_steps: int = 50
    weight_decay: float = 0.01
    seed: int = 0


_FILLER = ("please", "note", "the", "value", "we", "keep", "it", "here", "for", "later", "and", "then", "use",
           "this", "number", "again", "carefully", "now")


def _number(rng: random.Random) -> str:
    return str(rng.randint(0, 10 ** rng.randint(1, 7)))


def _filler(rng: random.Random) -> str:
    return " ".join(rng.choices(_FILLER, k=rng.randint(0, 4)))


def _expression(rng: random.Random) -> tuple[str, str]:
    """(math notation, Python) for one random expression."""
    a, b = rng.randint(2, 999), rng.randint(2, 999)
    c, d, m = rng.randint(2, 19), rng.randint(2, 30), rng.randint(7, 99)
    return rng.choice([(f"{a} \u00d7 {b}", f"{a}*{b}"), (f"{a} times {b}", f"{a}*{b}"), (f"{c}^{d}", f"{c}**{d}"),
                       (f"{c}^{{{d}}}", f"{c}**{d}"), (f"{c} to the power {d}", f"{c}**{d}"),
                       (f"{a} mod {m}", f"{a}%{m}"), (f"{c}^{d} modulo {m}", f"pow({c}, {d}, {m})")])


def document(rng: random.Random) -> str:
    """One generated pretraining document: notation-to-Python sentences, and numbers copied
    across a gap of filler, inside and outside chat turns (so copying is learnt as a skill of
    its own, not tied to one template)."""
    kind = rng.randrange(4)
    if kind == 0:
        math_, code = _expression(rng)
        return f"In Python, {math_} is written {code}."
    xs = " and ".join(_number(rng) for _ in range(rng.randint(1, 2)))
    if kind == 1:
        return f"Remember {xs}. {_filler(rng)}. You remembered {xs}."
    if kind == 2:
        return (f"{IM_START}user\n{_filler(rng)} {xs} {_filler(rng)}{IM_END}\n{IM_START}assistant\n"
                f"{_filler(rng)} {xs}{IM_END}")
    v = _number(rng)
    return f"x = {v}\n# {_filler(rng)}\nprint(x)\n{v}"


def pretrain(model, tokenizer, cfg: PretrainConfig, on_step: Callable[[int, dict], None] | None = None) -> list[dict]:
    """Next-token training on freshly generated documents; cosine decay after a linear warm-up."""
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    end = tokenizer.eos_token_id
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / cfg.warmup_steps) * max(0.1, 0.5 * (1 + math.cos(math.pi * s / cfg.steps))))
    model.train()
    history = []
    for step in range(1, cfg.steps + 1):
        docs = [tokenizer.encode(document(rng), add_special_tokens=False) + [end] for _ in range(cfg.batch_size)]
        width = max(map(len, docs))
        ids = torch.full((len(docs), width), tokenizer.pad_token_id)
        mask = torch.zeros(len(docs), width, dtype=torch.long)
        for i, d in enumerate(docs):
            ids[i, :len(d)], mask[i, :len(d)] = torch.tensor(d), 1
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
        nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1),
                                                reduction="none").view(len(docs), -1)
        target = mask[:, 1:].float()
        loss = (nll * target).sum() / target.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        history.append({"step": step, "loss": loss.item(), "lr": sched.get_last_lr()[0]})
        if on_step:
            on_step(step, history[-1])
    model.eval()
    return history
