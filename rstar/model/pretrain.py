"""Pretraining the tiny base model: what a real base model brings to the recipe, in miniature.

Qwen3-14B-Base already copies numbers from its context, knows how math notation is written
in Python and has read code next to its output; the recipe (SFT, then RL) never teaches any
of that. A model of a few million parameters knows nothing, so the embedded default gives it
that knowledge first, with a language-modelling pass over generated text packed into
fixed-length rows: notation-to-Python sentences, copy drills inside and outside chat turns,
and interpreter transcripts. None of it contains a problem of the RL set or the tool-call
format: solving the problems with the tool is still left to SFT (the format) and RL.
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
    steps: int = 1500
    batch_size: int = 16
    seq_len: int = 192          # documents are packed into rows of this many tokens
    lr: float = 2e-3
    warmup_steps: int = 50
    weight_decay: float = 0.01
    seed: int = 0


_FILLER = ("please", "note", "the", "value", "we", "keep", "it", "here", "for", "later", "and", "then", "use",
           "this", "number", "again", "carefully", "now", "so", "given", "with", "that", "is", "a", "of", "what",
           "find", "compute", "work", "out", "result", "exact", "all", "in", "full", "when", "you", "get", "by",
           "how", "much", "let", "me", "write", "code", "check", "answer", "to", "from", "which", "its", "one")


def _number(rng: random.Random) -> str:
    return str(rng.randint(0, 10 ** rng.randint(1, 7)))


def _filler(rng: random.Random, most: int = 5) -> str:
    return " ".join(rng.choices(_FILLER, k=rng.randint(0, most)))


def _expression(rng: random.Random) -> tuple[str, str]:
    """(math notation, Python) for one random expression."""
    a, b = rng.randint(2, 999), rng.randint(2, 999)
    c, d, m, e = rng.randint(2, 99), rng.randint(2, 999), rng.randint(7, 99), rng.randint(2, 30)
    return rng.choice([(f"{a} \u00d7 {b}", f"{a}*{b}"), (f"{a} times {b}", f"{a}*{b}"), (f"{a} * {b}", f"{a}*{b}"),
                       (f"{a} plus {b}", f"{a}+{b}"), (f"{c}^{e}", f"{c}**{e}"), (f"{c}^{{{e}}}", f"{c}**{e}"),
                       (f"{c} to the power {e}", f"{c}**{e}"), (f"{a} mod {m}", f"{a}%{m}"),
                       (f"{c}^{d} modulo {m}", f"pow({c}, {d}, {m})"),
                       (f"{c}^{{{d}}} \\bmod {m}", f"pow({c}, {d}, {m})")])


def _chat_copy(rng: random.Random, said: str, reply: str) -> str:
    """A chat turn mentioning `said` among filler, answered with `reply` after a gap of filler
    of any length up to ~30 tokens, so copying does not depend on one template or distance."""
    return (f"{IM_START}user\n{_filler(rng)} {said} {_filler(rng)}{IM_END}\n{IM_START}assistant\n"
            f"{_filler(rng, 25)} {reply}{IM_END}")


# How often each kind of document below is drawn. Copy drills (kinds 1-4) count double: a
# model this small needs that much practice before it copies a 3-digit number token it has
# rarely seen (with equal weights, 1,500 steps left it copying 2-digit numbers only).
KIND_WEIGHTS = (1, 2, 2, 2, 2, 1)


def document(rng: random.Random) -> str:
    """One generated pretraining document (see the module docstring)."""
    kind = rng.choices(range(len(KIND_WEIGHTS)), weights=KIND_WEIGHTS)[0]
    if kind == 0:
        notation, code = _expression(rng)
        return f"In Python, {notation} is written {code}."
    if kind == 1:
        xs = " ".join(_number(rng) for _ in range(rng.randint(1, 3)))
        return f"Repeat: {xs}. Again: {xs}."
    if kind == 2:
        xs = " and ".join(_number(rng) for _ in range(rng.randint(1, 2)))
        return _chat_copy(rng, xs, xs)
    if kind == 3:  # transcribing notation into code
        notation, code = _expression(rng)
        return _chat_copy(rng, notation, f"print({code})")
    if kind == 4:  # an interpreter transcript: the output is read back
        _, code = _expression(rng)
        value = eval(code)  # noqa: S307 - generated arithmetic
        return f">>> print({code})\n{value}\n{_filler(rng, 15)} The result is {value}."
    v = _number(rng)
    return f"x = {v}\n# {_filler(rng)}\nprint(x)\n{v}"


def packed_batch(rng: random.Random, tokenizer, rows: int, seq_len: int) -> torch.Tensor:
    """`rows` rows of `seq_len` tokens, each filled with whole documents ended by the tokenizer's
    EOS (the last one cut at the row's end), so no compute is spent on padding."""
    out = []
    for _ in range(rows):
        ids: list[int] = []
        while len(ids) < seq_len:
            ids += tokenizer.encode(document(rng), add_special_tokens=False) + [tokenizer.eos_token_id]
        out.append(ids[:seq_len])
    return torch.tensor(out)


def pretrain(model, tokenizer, cfg: PretrainConfig, on_step: Callable[[int, dict], None] | None = None) -> list[dict]:
    """Next-token training on freshly generated documents; cosine decay after a linear warm-up."""
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / cfg.warmup_steps) * max(0.1, 0.5 * (1 + math.cos(math.pi * s / cfg.steps))))
    model.train()
    history = []
    for step in range(1, cfg.steps + 1):
        ids = packed_batch(rng, tokenizer, cfg.batch_size, cfg.seq_len)
        loss = model(input_ids=ids, labels=ids).loss
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
