"""The paper's benchmarks as data: AIME 2024, AIME 2025, HMMT Feb 2025, MATH-500 and
GPQA-Diamond, loaded from their public layouts (a Hugging Face dataset name, or a local
Parquet/JSONL file in the same layout) into the problems schema. Nothing needs the hub
offline: tests and the embedded default use local files and the synthetic held-out set.

GPQA-Diamond is multiple choice: the options are shuffled per sample with a fixed seed, the
label is a letter, and the model's letter is read from its boxed answer.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass

from rstar.data.io import DataError
from rstar.data.sources import Columns, get_field, read_rows


@dataclass(frozen=True)
class Benchmark:
    name: str
    hub: str  # the public dataset name
    columns: Columns
    split: str = "train"
    multiple_choice: bool = False


BENCHMARKS = {
    "aime24": Benchmark("aime24", "HuggingFaceH4/aime_2024", Columns("problem", "answer", "id")),
    "aime25": Benchmark(
        "aime25", "opencompass/AIME2025", Columns("question", "answer", None), "test"
    ),
    "hmmt25": Benchmark(
        "hmmt25", "MathArena/hmmt_feb_2025", Columns("problem", "answer", "problem_idx")
    ),
    "math500": Benchmark(
        "math500", "HuggingFaceH4/MATH-500", Columns("problem", "answer", "unique_id"), "test"
    ),
    "gpqa_diamond": Benchmark(
        "gpqa_diamond",
        "Idavidrein/gpqa",
        Columns("Question", "Correct Answer", "Record ID"),
        multiple_choice=True,
    ),
}
_GPQA_WRONG = ("Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3")
LETTERS = "ABCD"


def load_benchmark(name: str, source: str | None = None) -> list[dict]:
    """Rows of the problems schema for benchmark `name`, from `source` (a local file in the
    benchmark's public layout) or, by default, its hub dataset."""
    try:
        bench = BENCHMARKS[name]
    except KeyError:
        raise DataError(f"unknown benchmark {name!r}; known: {sorted(BENCHMARKS)}") from None
    rows = []
    for row_id, row in read_rows(source or bench.hub, split=bench.split):
        where = f"{source or bench.hub} row {row_id}"
        if not isinstance(row, dict):
            raise DataError(f"{where}: {row.detail}")
        problem, answer = (
            get_field(row, bench.columns.problem),
            get_field(row, bench.columns.answer),
        )
        if not isinstance(problem, str) or answer is None:
            raise DataError(
                f"{where}: needs {bench.columns.problem!r} (text) and {bench.columns.answer!r}"
            )
        rid = get_field(row, bench.columns.id) if bench.columns.id else None
        meta = {"benchmark": name}
        if bench.multiple_choice:
            wrong = [get_field(row, c) for c in _GPQA_WRONG]
            if not all(isinstance(w, str) for w in wrong):
                raise DataError(f"{where}: needs the three {_GPQA_WRONG[0][:-2]} columns")
            # the correct one first
            meta["choices"] = [str(answer).strip()] + [w.strip() for w in wrong]
        rows.append(
            {
                "id": f"{name}-{rid if rid is not None else row_id}",
                "problem": problem.strip(),
                "answer": str(answer).strip(),
                "source": name,
                "metadata": json.dumps(meta),
            }
        )
    return rows


def choice_order(problem: dict, sample_index: int, seed: int = 0) -> list[int]:
    """Which choice each letter shows for one sample; depends only on (seed, id, sample)."""
    order = list(range(len(json.loads(problem["metadata"])["choices"])))
    random.Random(f"{seed}/{problem['id']}/{sample_index}").shuffle(order)
    return order


def chosen_option(
    problem: dict, sample_index: int, letter: str | None, seed: int = 0
) -> str | None:
    """The option text a sample's letter points at (so votes can be counted across samples)."""
    if letter is None:
        return None
    choices = json.loads(problem["metadata"])["choices"]
    return choices[choice_order(problem, sample_index, seed)[LETTERS.index(letter)]]


def shuffled_choice_prompt(problem: dict, sample_index: int, seed: int = 0) -> tuple[str, str]:
    """(question with lettered options, correct letter) for one sample of a multiple-choice
    problem (the correct choice is stored first)."""
    choices = json.loads(problem["metadata"])["choices"]
    order = choice_order(problem, sample_index, seed)
    lines = [f"({LETTERS[i]}) {choices[j]}" for i, j in enumerate(order)]
    text = (
        f"{problem['problem']}\n\n"
        + "\n".join(lines)
        + "\n\nAnswer with the letter of the correct option in \\boxed{}."
    )
    return text, LETTERS[order.index(0)]


_LETTER = re.compile(r"^\(?\s*([A-D])\s*\)?(?:[.:\s].*)?$", re.DOTALL)


def extract_letter(answer: str | None) -> str | None:
    """'B', '(B)', 'B.', 'B) the text', '\\text{C}' -> the letter; anything else -> None."""
    if answer is None:
        return None
    text = re.sub(r"\\text\{([^{}]*)\}", r"\1", answer).strip()
    m = _LETTER.match(text)
    return m.group(1) if m else None
