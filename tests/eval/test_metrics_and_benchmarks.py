"""Metric arithmetic on crafted results; benchmark loaders on small files in each public
layout; GPQA shuffling and letter extraction."""

import json
import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rstar.data.io import DataError
from rstar.eval.benchmarks import BENCHMARKS, extract_letter, load_benchmark, shuffled_choice_prompt
from rstar.eval.metrics import avg_pass_at_1, majority_vote, pass_at_k
from rstar.reward import verify


@pytest.mark.parametrize(
    "n,c,k", [(16, 0, 1), (16, 3, 1), (16, 3, 4), (16, 16, 8), (10, 5, 10), (5, 1, 2)]
)
def test_pass_at_k_is_the_unbiased_estimator(n, c, k):
    expected = 1 - math.comb(n - c, k) / math.comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)
    assert pass_at_k(n, c, 1) == pytest.approx(c / n)


def test_pass_at_k_rejects_nonsense():
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


def test_avg_pass_at_1_and_majority_vote():
    assert avg_pass_at_1([True, False, False, True]) == 0.5 and avg_pass_at_1([]) == 0.0
    assert majority_vote(["12", "1,2", "7", "12.0", None], "12", verify)  # 12 thrice (normalised)
    assert not majority_vote(["7", "7", "12", None, None], "12", verify)
    assert majority_vote(["5", "12", "5", "12"], "5", verify)  # a tie goes to the earliest seen
    assert not majority_vote([None, "  "], "1", verify)


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_loaders_read_each_public_layout(tmp_path):
    files = {
        "aime24": write_jsonl(
            tmp_path / "aime24.jsonl",
            [{"id": 60, "problem": "Find x.", "answer": "204", "solution": "..."}],
        ),
        "aime25": write_jsonl(
            tmp_path / "aime25.jsonl", [{"question": "How many?", "answer": "70"}]
        ),
        "hmmt25": write_jsonl(
            tmp_path / "hmmt.jsonl",
            [{"problem_idx": 3, "problem": "Compute.", "answer": "\\frac{1}{2}"}],
        ),
        "gpqa_diamond": write_jsonl(
            tmp_path / "gpqa.jsonl",
            [
                {
                    "Record ID": "rec1",
                    "Question": "Which?",
                    "Correct Answer": "right",
                    "Incorrect Answer 1": "w1",
                    "Incorrect Answer 2": "w2",
                    "Incorrect Answer 3": "w3",
                }
            ],
        ),
    }
    pq.write_table(
        pa.Table.from_pylist(
            [
                {
                    "problem": "Simplify.",
                    "answer": "\\sqrt{2}",
                    "unique_id": "test/x.json",
                    "level": 3,
                }
            ]
        ),
        tmp_path / "math500.parquet",
    )
    files["math500"] = str(tmp_path / "math500.parquet")
    assert set(files) == set(BENCHMARKS)
    loaded = {name: load_benchmark(name, path) for name, path in files.items()}
    assert loaded["aime24"][0]["id"] == "aime24-60" and loaded["aime24"][0]["answer"] == "204"
    assert loaded["aime25"][0]["problem"] == "How many?" and loaded["aime25"][0]["id"] == "aime25-0"
    assert loaded["hmmt25"][0]["answer"] == "\\frac{1}{2}"
    assert loaded["math500"][0]["id"] == "math500-test/x.json"
    assert json.loads(loaded["gpqa_diamond"][0]["metadata"])["choices"] == [
        "right",
        "w1",
        "w2",
        "w3",
    ]
    with pytest.raises(DataError, match="row 0: needs 'question'"):
        load_benchmark("aime25", files["aime24"])  # the wrong layout names the missing column
    with pytest.raises(DataError, match="unknown benchmark"):
        load_benchmark("aime26")


def test_gpqa_shuffling_and_letters(tmp_path):
    path = write_jsonl(
        tmp_path / "g.jsonl",
        [
            {
                "Record ID": "r",
                "Question": "Q?",
                "Correct Answer": "yes",
                "Incorrect Answer 1": "a",
                "Incorrect Answer 2": "b",
                "Incorrect Answer 3": "c",
            }
        ],
    )
    problem = load_benchmark("gpqa_diamond", path)[0]
    prompts = [shuffled_choice_prompt(problem, i, seed=1) for i in range(16)]
    assert prompts == [shuffled_choice_prompt(problem, i, seed=1) for i in range(16)]  # fixed seed
    assert len({letter for _, letter in prompts}) > 1  # the correct option moves between samples
    for text, letter in prompts:
        assert f"({letter}) yes" in text
    assert [
        extract_letter(a)
        for a in ("B", "(C)", "D.", "A) yes", "\\text{B}", "E", "BC", None, "the answer")
    ] == ["B", "C", "D", "A", "B", None, None, None, None]


def test_the_report_leads_with_one_overall_score_per_checkpoint_with_its_interval():
    from rstar.eval.metrics import overall_accuracy, overall_interval
    from rstar.eval.run import markdown_table

    summaries = {
        "sft": {
            "a": {
                "questions": 40,
                "samples": 160,
                "avg_pass@1": 0.25,
                "avg_pass@1_se": 0.05,
                "pass@4": 0.5,
                "response_len_mean": 80,
            },
            "b": {
                "questions": 20,
                "samples": 80,
                "avg_pass@1": 0.10,
                "avg_pass@1_se": 0.04,
                "pass@4": 0.2,
                "response_len_mean": 70,
            },
        }
    }
    # questions weigh the same: (40*.25+20*.1)/60
    assert overall_accuracy(summaries["sft"]) == pytest.approx(0.2)
    lo, hi = overall_interval(summaries["sft"])
    se = ((40 / 60 * 0.05) ** 2 + (20 / 60 * 0.04) ** 2) ** 0.5
    assert (lo, hi) == (pytest.approx(0.2 - 1.96 * se), pytest.approx(0.2 + 1.96 * se))
    table = markdown_table(summaries, 4)
    first = table.splitlines()[2]
    assert first.startswith("| sft | **0.200** |") and "60 x 4" in first
    assert "pass@4: questions solved by at least one of 4 samples" in table
