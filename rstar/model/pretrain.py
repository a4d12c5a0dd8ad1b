"""Pretraining the tiny base model: what a real base model brings to the recipe, in miniature.

Qwen3-14B-Base already copies numbers from its context, knows how math notation is written
in Python and has read code next to its output; the recipe (SFT, then RL) never teaches any
of that. A model of a few million parameters knows nothing, so the embedded default gives it
that knowledge first, with a language-modelling pass over generated text packed into
fixed-length rows: notation-to-Python sentences (symbols and words, `rstar.data.notation`),
copy drills inside and outside chat turns, and interpreter sessions written as chats, around
filler words drawn from the whole vocabulary. Filler, a random number's first occurrence and a
tool's output are read as context, never predicted: only what can be learnt is a target.
None of it contains a problem of the RL set or the tool-call format: solving the problems with
the tool is still left to SFT (the format) and RL.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

import torch

from rstar.agent.format import IM_END, IM_START
from rstar.data.notation import expression


@dataclass
class PretrainConfig:
    steps: int = 1500
    batch_size: int = 16
    seq_len: int = 192  # documents are packed into rows of this many tokens
    lr: float = 2e-3
    warmup_steps: int = 50
    weight_decay: float = 0.01
    seed: int = 0


_FILLER = (
    "please",
    "note",
    "the",
    "value",
    "we",
    "keep",
    "it",
    "here",
    "for",
    "later",
    "and",
    "then",
    "use",
    "this",
    "number",
    "again",
    "carefully",
    "now",
    "so",
    "given",
    "with",
    "that",
    "is",
    "a",
    "of",
    "what",
    "find",
    "compute",
    "work",
    "out",
    "result",
    "exact",
    "all",
    "in",
    "full",
    "when",
    "you",
    "get",
    "by",
    "how",
    "much",
    "let",
    "me",
    "write",
    "code",
    "check",
    "answer",
    "to",
    "from",
    "which",
    "its",
    "one",
)


def _number(rng: random.Random) -> str:
    return str(rng.randint(0, 10 ** rng.randint(1, 7)))


class TextSource(random.Random):
    """The seeded source of generated documents, which also knows the tokenizer's words: half
    the filler is drawn from them, so every token's embedding is trained (as context). Left at
    their random initialisation (half the vocabulary: JSON keys, the problems' words, the tags),
    those rows derailed copying in any chat that used them (docs/benchmarks.md)."""

    def __init__(self, seed: int, tokenizer=None) -> None:
        super().__init__(seed)
        self.words: tuple[str, ...] = ()
        if tokenizer is not None:
            special = set(tokenizer.all_special_ids)
            words = (
                tokenizer.decode([i]).strip() for i in range(len(tokenizer)) if i not in special
            )
            self.words = tuple(w for w in words if w and not w.isdigit())


# Filler is marked in a document's text (and the marks removed before tokenising): it is context
# the model reads, never a target. Trained to predict words drawn from the whole vocabulary, a
# base learns that any word may come next anywhere, and its SFT model sampled word salad.
CONTEXT, END_CONTEXT = "\x01", "\x02"


def _given(text: str) -> str:
    """`text` as context: a random number's first occurrence (or a tool's output) cannot be
    predicted, only copied later. As a target its loss (~4.7 nats a number token) is noise in
    every clipped gradient; masked (with the short drills drawn twice as often), the base copies
    two 3-digit numbers 1.00 instead of 0.60 after the same steps (docs/benchmarks.md)."""
    return f"{CONTEXT}{text}{END_CONTEXT}"


def _filler(rng: TextSource, most: int = 5) -> str:
    words = " ".join(
        rng.choice(rng.words) if rng.words and rng.random() < 0.5 else rng.choice(_FILLER)
        for _ in range(rng.randint(0, most))
    )
    return _given(words) if words else ""


_KEYS = ("code", "text", "input", "value", "query", "cmd", "args", "src", "name", "data")
_TAGS = ("output", "result", "stdout", "log", "reply", "note", "data")


def _turn(role: str, text: str) -> str:
    return f"{IM_START}{role}\n{text}{IM_END}\n"


def _preamble(rng: TextSource) -> str:
    """Nothing, a system turn and/or an earlier exchange, all filler: a base model copies from
    wherever the source sits, not only from the first turn of a document."""
    out = _turn("system", _filler(rng, 14)) if rng.random() < 0.6 else ""
    if rng.random() < 0.3:
        out += _turn("user", _filler(rng, 8)) + _turn("assistant", _filler(rng, 8))
    return out


def _wrapped(rng: TextSource, text: str) -> str:
    """`text` written bare, inside a (nested) JSON string, or after a tagged note: copying must
    survive whatever structure sits between the source and the copy."""
    form = rng.randrange(4)
    if form == 0:
        return text
    k = rng.sample(_KEYS, 4)
    if form == 1:
        return f'{{"{k[0]}": "{text}", "{k[1]}": ""}}'
    if form == 2:
        return f'{{"{k[0]}": "{_filler(rng, 2)}", "{k[1]}": {{"{k[2]}": "{text}", "{k[3]}": ""}}}}'
    tag = rng.choice(_TAGS)
    return f"<{tag}>{_filler(rng, 10)}</{tag}>\n{text}"


def _chat_copy(rng: TextSource, said: str, reply: str) -> str:
    """A chat turn mentioning `said` among filler, answered with `reply` after filler and some
    structure, so copying does not hang on one template or distance."""
    return (
        _preamble(rng)
        + _turn("user", f"{_filler(rng)} {_given(said)} {_filler(rng)}")
        + f"{IM_START}assistant\n{_filler(rng, 12)} {_wrapped(rng, reply)}{IM_END}"
    )


def _read_back(rng: TextSource) -> str:
    """Notation transcribed into code, the code's output shown in a tagged turn, the output
    copied into the reply: an interpreter session as a chat, in generic tags."""
    notation, code = expression(rng)
    value = eval(code)  # noqa: S307 - generated arithmetic
    tag = rng.choice(_TAGS)
    said = rng.choice(
        [f"{value}", f"\\boxed{{{value}}}", f"it is {value}.", f"{_filler(rng, 3)} {value}"]
    )
    return (
        _chat_copy(rng, notation, f"print({code})")
        + "\n"
        + _turn("user", f"<{tag}>\n{_given(value)}\n</{tag}>")
        + f"{IM_START}assistant\n{_filler(rng, 8)} {said}{IM_END}"
    )


# How often each kind of document below is drawn: copying in context (kinds 1-4) dominates, a
# model this small needs that much practice before it copies a number token it rarely saw.
KIND_WEIGHTS = (2, 2, 2, 3, 3, 1)


def document(rng: TextSource) -> str:
    """One generated pretraining document (see the module docstring)."""
    kind = rng.choices(range(len(KIND_WEIGHTS)), weights=KIND_WEIGHTS)[0]
    if kind == 0:
        notation, code = expression(rng)
        return f"In Python, {_given(notation)} is written {code}."
    if kind == 1:
        xs = " ".join(_number(rng) for _ in range(rng.randint(1, 3)))
        return f"Repeat: {_given(xs)}. Again: {xs}."
    if kind == 2:
        xs = " and ".join(_number(rng) for _ in range(rng.randint(1, 2)))
        return _chat_copy(rng, xs, xs)
    if kind == 3:  # transcribing notation into code
        notation, code = expression(rng)
        return _chat_copy(rng, notation, f"print({code})")
    if kind == 4:
        return _read_back(rng)
    v = _number(rng)
    return f"x = {_given(v)}\n# {_filler(rng)}\nprint(x)\n{v}"


def encode(tokenizer, text: str) -> tuple[list[int], list[int]]:
    """Token ids of a document and its labels: -100 (no loss) on tokens inside filler marks."""
    clean, context, inside = [], [], False
    for ch in text:
        if ch in (CONTEXT, END_CONTEXT):
            inside = ch == CONTEXT
        else:
            clean.append(ch)
            context.append(inside)
    enc = tokenizer("".join(clean), add_special_tokens=False, return_offsets_mapping=True)
    labels = [
        -100 if end > start and all(context[start:end]) else i
        for i, (start, end) in zip(enc["input_ids"], enc["offset_mapping"])
    ]
    return enc["input_ids"], labels


def packed_batch(
    rng: TextSource, tokenizer, rows: int, seq_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, labels), `rows` rows of `seq_len` tokens, each filled with whole documents ended by
    the tokenizer's EOS (the last one cut at the row's end), so no compute is spent on padding."""
    ids_out, labels_out = [], []
    for _ in range(rows):
        ids: list[int] = []
        labels: list[int] = []
        while len(ids) < seq_len:
            doc_ids, doc_labels = encode(tokenizer, document(rng))
            ids += doc_ids + [tokenizer.eos_token_id]
            labels += doc_labels + [tokenizer.eos_token_id]
        ids_out.append(ids[:seq_len])
        labels_out.append(labels[:seq_len])
    return torch.tensor(ids_out), torch.tensor(labels_out)


def pretrain(
    model, tokenizer, cfg: PretrainConfig, on_step: Callable[[int, dict], None] | None = None
) -> list[dict]:
    """Next-token training on freshly generated documents; cosine decay after a linear warm-up."""
    torch.manual_seed(cfg.seed)
    rng = TextSource(cfg.seed, tokenizer)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: (
            min(1.0, (s + 1) / cfg.warmup_steps)
            * max(0.1, 0.5 * (1 + math.cos(math.pi * s / cfg.steps)))
        ),
    )
    model.train()
    history = []
    for step in range(1, cfg.steps + 1):
        ids, labels = packed_batch(rng, tokenizer, cfg.batch_size, cfg.seq_len)
        loss = model(input_ids=ids, labels=labels).loss
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
