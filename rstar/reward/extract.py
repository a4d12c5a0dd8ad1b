"""Find the model's final answer: the last \\boxed{...} inside the final <answer>...</answer>."""

from __future__ import annotations

import re

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")


def boxed_contents(text: str) -> list[str]:
    """Contents of every balanced \\boxed{...} (or \\fbox{...}) in order; nested braces are kept,
    an unbalanced one is skipped."""
    out = []
    for m in _BOXED.finditer(text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            if text[i] == "\\" and i + 1 < len(text) and text[i + 1] in "{}":
                i += 2  # an escaped brace is content, not structure
                continue
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            out.append(text[m.end() : i - 1].strip())
    return out


def extract_answer(response: str, *, fallback_to_any_boxed: bool = True) -> str | None:
    """The answer a response commits to, or None.

    Primary rule: the content of the last \\boxed{} inside the last <answer>...</answer> block.
    Fallback (on by default, `fallback_to_any_boxed=False` turns it off): when there is no
    <answer> block, or it holds no \\boxed{}, the last \\boxed{} anywhere in the response. The
    fallback never overrides a boxed answer inside <answer>, so a \\boxed{} written while
    reasoning cannot replace the one in the final answer."""
    blocks = _ANSWER.findall(response)
    if blocks:
        boxed = boxed_contents(blocks[-1])
        if boxed:
            return boxed[-1]
    if fallback_to_any_boxed:
        boxed = boxed_contents(response)
        if boxed:
            return boxed[-1]
    return None
