"""The notation-to-Python pairs that pretraining and SFT share."""

import random
import re

from rstar.data import sft, synth
from rstar.data.notation import expression


def test_every_form_is_python_for_what_it_says():
    rng = random.Random(0)
    pairs = [expression(rng) for _ in range(2000)]
    assert len({re.sub(r"\d+", "N", n) for n, _ in pairs}) == 20  # every form is drawn
    for notation, code in pairs:
        eval(code)
        # same numbers, same order
        assert re.findall(r"\d+", code) == re.findall(r"\d+", notation), (notation, code)
    # a^b mod m and plain a mod m
    assert {"pow(" in c for n, c in pairs if "remainder" in n} == {True, False}
    # power_mod's "multiplying a by itself b times ... remainder on division by m" has its form too
    assert {c.startswith("pow(") for n, c in pairs if "by itself" in n and "remainder" in n} == {
        True
    }


def test_forms_in_words_are_left_out_when_asked():
    rng = random.Random(1)
    shapes = {
        re.sub(r"\d+", "N", n) for n, _ in (expression(rng, words=False) for _ in range(1000))
    }
    assert len(shapes) == 10 and not any(
        w in s for s in shapes for w in ("remainder", "multiplied", "product")
    )


def test_sft_arithmetic_never_asks_an_rl_problem():
    """SFT's arithmetic chats use symbols only: in words they would be the power_mod and
    big_product problems themselves."""
    rows = sft.generate(400, seed=2, tasks=["arith_tool", "arith_direct"])
    stems = {
        p["problem"][:20]
        for p in synth.generate(200, levels=(1,), families=["big_product", "power_mod"])
    }
    assert not any(stem in r["messages"] for r in rows for stem in stems)
    assert not any("remainder" in r["messages"] or "multipl" in r["messages"] for r in rows)
