"""Offline synthetic math: integer-answer problems where calling Python is the natural route.

Deterministic: the same (seed, n, levels) always gives the same problems, ids and answers,
computed here exactly. Several phrasings per family, so a model has to map words to
operations rather than memorise one template. Levels 1-3 scale the numbers.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from rstar.data import check_names


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _primes_upto(n: int) -> list[int]:
    if n < 2:
        return []
    sieve = bytearray([1]) * (n + 1)
    sieve[0:2] = b"\0\0"
    for p in range(2, math.isqrt(n) + 1):
        if sieve[p]:
            sieve[p * p :: p] = bytearray(len(sieve[p * p :: p]))
    return [i for i, v in enumerate(sieve) if v]


@dataclass(frozen=True)
class Family:
    name: str
    make: Callable[[random.Random, int], tuple[dict, int]]  # (params, answer)
    phrasings: tuple[str, ...]  # str.format templates over params


def _power_mod(rng, level):
    a, b = rng.randint(2, 10 ** (level + 1)), rng.randint(10**level, 10 ** (level + 2))
    m = rng.randint(7, 10 ** (level + 1))
    return {"a": a, "b": b, "m": m}, pow(a, b, m)


def _big_product(rng, level):
    xs = [rng.randint(10 ** (level + 1), 10 ** (level + 2)) for _ in range(level + 1)]
    return {
        "list": ", ".join(map(str, xs[:-1])) + f" and {xs[-1]}",
        "x": " \u00d7 ".join(map(str, xs)),
    }, math.prod(xs)


def _big_power(rng, level):
    a, b = rng.randint(2, 9 + 10 * level), rng.randint(5 * level + 5, 12 * level + 12)
    return {"a": a, "b": b}, a**b


def _divisor_count(rng, level):
    n = rng.randint(10 ** (level + 1), 10 ** (level + 3))
    return {"n": n}, len(_divisors(n))


def _divisor_sum(rng, level):
    n = rng.randint(10 ** (level + 1), 10 ** (level + 2) * 5)
    return {"n": n}, sum(_divisors(n))


def _digit_sum_power(rng, level):
    a, b = rng.randint(2, 9), rng.randint(20 * level, 60 * level)
    return {"a": a, "b": b}, sum(map(int, str(a**b)))


def _digit_sum_factorial(rng, level):
    n = rng.randint(10 * level, 40 * level)
    return {"n": n}, sum(map(int, str(math.factorial(n))))


def _prime_count(rng, level):
    lo = rng.randint(1, 10 ** (level + 1))
    hi = lo + rng.randint(10 ** (level + 1), 10 ** (level + 2))
    return {"lo": lo, "hi": hi}, sum(1 for p in _primes_upto(hi) if p >= lo)


def _prime_sum(rng, level):
    n = rng.randint(10 ** (level + 1), 10 ** (level + 2))
    return {"n": n}, sum(p for p in _primes_upto(n - 1))


def _committee(rng, level):
    n = rng.randint(8 * level, 25 * level)
    k = rng.randint(2, max(3, n // 3))
    return {"n": n, "k": k}, math.comb(n, k)


_WORDS = (
    "BANANA",
    "MISSISSIPPI",
    "STATISTICS",
    "COMMITTEE",
    "BOOKKEEPER",
    "ABRACADABRA",
    "PEPPERMINT",
    "ASSESSMENT",
    "PARALLEL",
    "TENNESSEE",
)


def _arrangements(rng, level):
    word = _WORDS[rng.randrange(len(_WORDS))]
    counts = [word.count(c) for c in sorted(set(word))]
    return {"word": word}, math.factorial(len(word)) // math.prod(math.factorial(c) for c in counts)


def _linear_diophantine(rng, level):
    a, b = rng.randint(2, 5 + 4 * level), rng.randint(2, 5 + 4 * level)
    n = rng.randint(20 * level, 200 * level)
    return {"a": a, "b": b, "n": n}, sum(1 for x in range(n // a + 1) if (n - a * x) % b == 0)


def _bounded_sum(rng, level):
    n, c = rng.randint(5 * level, 20 * level), rng.randint(3 * level, 8 * level)
    count = sum(1 for x in range(c + 1) for y in range(c + 1) if 0 <= n - x - y <= c)
    return {"n": n, "c": c}, count


def _long_sum(rng, level):
    # 4, 8, 16 numbers of 3-4 digits: the call that adds them grows with the level, the answer
    # stays at 4-6 digits (a solution long to write but easy to read back)
    xs = [rng.randint(100, 9999) for _ in range(2 ** (level + 1))]
    return {"list": ", ".join(map(str, xs)), "x": " + ".join(map(str, xs))}, sum(xs)


FAMILIES = [
    Family(
        "power_mod",
        _power_mod,
        (
            "What is the remainder when {a}^{b} is divided by {m}?",
            "Find {a} raised to the power {b}, modulo {m}.",
            "Compute {a}^{{{b}}} \\bmod {m}.",
            "A number is formed by multiplying {a} by itself {b} times. What remainder does it "
            "leave on division by {m}?",
        ),
    ),
    Family(
        "big_product",
        _big_product,
        (
            "Compute the product {x}.",
            "What do you get when you multiply {list} together?",
            "Find the exact value of {x}.",
        ),
    ),
    Family(
        "big_power",
        _big_power,
        (
            "What is the exact value of {a}^{b}?",
            "Compute {a} to the power of {b}, written out in full.",
            "Evaluate {a}^{{{b}}} exactly.",
        ),
    ),
    Family(
        "divisor_count",
        _divisor_count,
        (
            "How many positive divisors does {n} have?",
            "Find the number of positive integers that divide {n} evenly.",
            "Count the divisors of {n}, including 1 and {n} itself.",
        ),
    ),
    Family(
        "divisor_sum",
        _divisor_sum,
        (
            "What is the sum of all positive divisors of {n}?",
            "Add up every positive integer that divides {n}. What is the total?",
            "Compute \\sigma({n}), the sum of the divisors of {n}.",
        ),
    ),
    Family(
        "digit_sum_power",
        _digit_sum_power,
        (
            "What is the sum of the digits of {a}^{b}?",
            "Write {a} to the power {b} in decimal and add up its digits. What do you get?",
            "Find the digit sum of {a}^{{{b}}}.",
        ),
    ),
    Family(
        "digit_sum_factorial",
        _digit_sum_factorial,
        (
            "What is the sum of the digits of {n}!?",
            "Compute the digit sum of the factorial of {n}.",
            "Add the decimal digits of {n} factorial. What is the result?",
        ),
    ),
    Family(
        "prime_count",
        _prime_count,
        (
            "How many prime numbers are there between {lo} and {hi}, inclusive?",
            "Count the primes p with {lo} \\le p \\le {hi}.",
            "How many integers from {lo} to {hi} (inclusive) are prime?",
        ),
    ),
    Family(
        "prime_sum",
        _prime_sum,
        (
            "What is the sum of all primes less than {n}?",
            "Add up every prime number below {n}. What is the total?",
            "Find the sum of the primes p < {n}.",
        ),
    ),
    Family(
        "committee",
        _committee,
        (
            "In how many ways can a committee of {k} people be chosen from {n} people?",
            "How many different groups of {k} can be selected from a club of {n} members?",
            "Compute \\binom{{{n}}}{{{k}}}.",
        ),
    ),
    Family(
        "arrangements",
        _arrangements,
        (
            "How many distinct arrangements of the letters of the word {word} are there?",
            "In how many different orders can the letters of {word} be written?",
            "Count the distinct permutations of the letters in {word}.",
        ),
    ),
    Family(
        "linear_diophantine",
        _linear_diophantine,
        (
            "How many ordered pairs of non-negative integers (x, y) satisfy {a}x + {b}y = {n}?",
            "Find the number of solutions of {a}x + {b}y = {n} in non-negative integers x and y.",
            "In how many ways can {n} be written as {a}x + {b}y with x and y non-negative"
            " integers?",
        ),
    ),
    Family(
        "bounded_sum",
        _bounded_sum,
        (
            "How many ordered triples of integers (x, y, z) with 0 \\le x, y, z \\le {c} satisfy x "
            "+ y + z = {n}?",
            "Count the solutions of x + y + z = {n} where each of x, y, z is an integer from 0 to "
            "{c}.",
            "Three dice-like counters each show an integer from 0 to {c}. In how many ways can "
            "they sum to {n}?",
        ),
    ),
    Family(
        "long_sum",
        _long_sum,
        (
            "What is the sum of {list}?",
            "Add up these numbers: {list}.",
            "Compute {x}.",
        ),
    ),
]
FAMILY = {f.name: f for f in FAMILIES}


def family_levels(
    levels: Sequence[int] | Mapping[str, Sequence[int]], families: list[str] | None = None
) -> dict[str, Sequence[int]]:
    """Each chosen family's levels: `levels` is one list for every family, or a list per family
    ({family: levels}, whose keys are then the families unless `families` names them). Raises
    ValueError naming an unknown family or one without levels."""
    if isinstance(levels, Mapping):
        check_names("families", list(levels), FAMILY)
        families = families or list(levels)
        if missing := [f for f in families if f not in levels]:
            raise ValueError(f"levels: no levels given for families {missing}")
    check_names("families", families, FAMILY)
    chosen = families or [f.name for f in FAMILIES]
    return {f: levels[f] if isinstance(levels, Mapping) else levels for f in chosen}


def generate(
    n: int,
    *,
    seed: int = 0,
    levels: Sequence[int] | Mapping[str, Sequence[int]] = (1, 2, 3),
    families: list[str] | None = None,
    prefix: str = "synth",
) -> list[dict]:
    """`n` problems (rows of the problems schema), cycling through the families and, within
    each, its levels (`family_levels`)."""
    chosen = list(family_levels(levels, families).items())
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        name, its = chosen[i % len(chosen)]
        fam = FAMILY[name]
        level = its[(i // len(chosen)) % len(its)]
        params, answer = fam.make(rng, level)
        template = rng.randrange(len(fam.phrasings))
        rows.append(
            {
                "id": f"{prefix}-{seed}-{i:06d}",
                "problem": fam.phrasings[template].format(**params),
                "answer": str(answer),
                "source": f"synthetic/{fam.name}",
                "metadata": json.dumps(
                    {
                        "family": fam.name,
                        "level": level,
                        "template": template,
                        "seed": seed,
                        "params": params,
                    }
                ),
            }
        )
    return rows
