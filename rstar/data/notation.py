"""Arithmetic written two ways: in math notation or words (as a person asks) and in Python (as
the tool runs it). The base model's pretraining and the SFT chats draw from the same forms, so
the mapping SFT relies on is one the base has practised.

The forms in words ("the remainder when ... is divided by ...") are pretraining's alone: they
are what a real base model knows about the words, and SFT asking them would be asking the RL
problems themselves. Without them no rollout ever wrote `pow(...)` for a remainder asked in
words, so RL had no positive to learn that phrasing from. One form is left out on purpose:
with "the remainder of a on division by m" -> `a%m`, a power's remainder asked as "multiplying
a by itself b times ... remainder on division by m" was written `a % b` (0.6.0, docs). That
phrasing has a form of its own instead: without it, the one family phrasing with no form here,
it stayed unsolved through every RL stage (0.00-0.09 of its held-out samples, 0.11.0).
"""

from __future__ import annotations

import random


def expression(rng: random.Random, words: bool = True) -> tuple[str, str]:
    """(math notation, Python) for one random expression; `words`: also the forms in words."""
    a, b = rng.randint(2, 999), rng.randint(2, 999)
    c, d, m, e = rng.randint(2, 99), rng.randint(2, 999), rng.randint(7, 99), rng.randint(2, 30)
    forms = [
        (f"{a} \u00d7 {b}", f"{a}*{b}"),
        (f"{a} times {b}", f"{a}*{b}"),
        (f"{a} * {b}", f"{a}*{b}"),
        (f"{a} plus {b}", f"{a}+{b}"),
        (f"{c}^{e}", f"{c}**{e}"),
        (f"{c}^{{{e}}}", f"{c}**{e}"),
        (f"{c} to the power {e}", f"{c}**{e}"),
        (f"{a} mod {m}", f"{a}%{m}"),
        (f"{c}^{d} modulo {m}", f"pow({c}, {d}, {m})"),
        (f"{c}^{{{d}}} \\bmod {m}", f"pow({c}, {d}, {m})"),
    ]
    if words:
        forms += [
            (f"{a} multiplied by {b}", f"{a}*{b}"),
            (f"the product of {a} and {b}", f"{a}*{b}"),
            (f"{c} multiplied by itself {e} times", f"{c}**{e}"),
            (f"the remainder when {a} is divided by {m}", f"{a}%{m}"),
            (f"the remainder when {c}^{d} is divided by {m}", f"pow({c}, {d}, {m})"),
            (f"{a} and {b} multiplied together", f"{a}*{b}"),
            (f"{c} raised to the power {e}", f"{c}**{e}"),
            (f"multiplying {c} by itself {e} times", f"{c}**{e}"),
            (f"{c} raised to the power {d}, modulo {m}", f"pow({c}, {d}, {m})"),
            (
                f"multiplying {c} by itself {d} times, the remainder on division by {m}",
                f"pow({c}, {d}, {m})",
            ),
        ]
    return rng.choice(forms)
