"""Copying probes: how exactly a model copies numbers where the recipe needs it to.

On the synthetic problems a small model is only as good as its copying: the operands from the
problem into the tool call, and the tool's output into \\boxed{}. Accuracy mixes that with
format, phrasing and sampling; these greedy probes measure each copy on its own, so a run shows
which link fails (docs/benchmarks.md has the history). Every probe pairs two random 3-digit
numbers; a probe scores the fraction of pairs copied exactly.

- `repeat`: a bare text drill (`Repeat: 513 489. Again:`), meaningful for a base model too;
- `into_call`: a chat asking to evaluate `513*489`: the tool call must contain `print(513*489)`;
- `read_back`: a chat whose tool response is `250857`: the answer must contain `\\boxed{250857}`.
"""

from __future__ import annotations

import random

import torch

from rstar.agent.format import TOOL_NAME, problem_messages, tool_turn


def _greedy(model, tokenizer, text: str, max_new_tokens: int) -> str:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
        )
    return tokenizer.decode(out[0][len(ids) :])


def _chat(tokenizer, messages: list[dict], generation_prompt: bool = False) -> str:
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=generation_prompt
    )


def copy_probe(
    model,
    tokenizer,
    *,
    pairs: int = 20,
    seed: int = 0,
    chat: bool = True,
    prompt_style: str = "paper",
) -> dict[str, float]:
    """{"repeat": ..., and with `chat` "into_call" and "read_back"}: fractions in [0, 1]."""
    model.eval()
    rng = random.Random(seed)
    hits = {"repeat": 0, **({"into_call": 0, "read_back": 0} if chat else {})}
    for _ in range(pairs):
        a, b = rng.randint(100, 999), rng.randint(100, 999)
        hits["repeat"] += _greedy(model, tokenizer, f"Repeat: {a} {b}. Again:", 8).startswith(
            f" {a} {b}"
        )
        if not chat:
            continue
        ask = problem_messages(f"Use Python to evaluate {a}*{b}.", prompt_style)
        prompt = _chat(tokenizer, ask, generation_prompt=True)
        hits["into_call"] += f"print({a}*{b})" in _greedy(model, tokenizer, prompt, 64)
        called = ask + [
            {
                "role": "assistant",
                "content": "<reason>I will print the value of the expression.</reason>",
                "tool_calls": [
                    {"name": TOOL_NAME, "arguments": {"code": f"print({a}*{b})", "input": ""}}
                ],
            }
        ]
        # the template ends the assistant turn with a newline; tool_turn() starts with the one the
        # model omits
        prompt = _chat(tokenizer, called) + tool_turn([str(a * b)])[1:]
        hits["read_back"] += f"\\boxed{{{a * b}}}" in _greedy(model, tokenizer, prompt, 48)
    return {k: v / pairs for k, v in hits.items()}
