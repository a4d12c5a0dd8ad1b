"""Curation filters and rejects, decontamination, mining, generators and schemas."""

import json
import math
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sympy

from rstar.data import synth
from rstar.data.curate import REASONS, CurationConfig, SourceSpec, curate, ngrams, normalize_text
from rstar.data.io import DataError, read_table, write_table
from rstar.data.mine import candidates, mine_hard
from rstar.data.schema import SCHEMAS
from rstar.data.sources import Columns


def write_jsonl(path, rows):
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return str(path)


@pytest.fixture
def dirty(tmp_path):
    rows = [
        {"id": "a", "problem": "What is 2 + 2?", "answer": "4"},
        {"id": "b", "problem": "What is  2+2 ?", "answer": "4"},  # duplicate after normalising
        {"id": "c", "problem": "Find x if 2x = 1.", "answer": "\\frac{1}{2}"},  # non-integer answer
        {"id": "d", "problem": "Compute 10^40.", "answer": "1" + "0" * 40},  # too large to verify
        {"id": "e", "answer": "3"},  # missing problem
        {"id": "f", "problem": "Name a prime.", "answer": ""},  # missing answer
        {"id": "g", "problem": ["not", "text"], "answer": "1"},  # wrong type
        "{this is not json",  # bad JSON line
        ["a", "list"],  # not an object
        {
            "id": "h",
            "problem": "How many positive divisors does 360 have, counting one and itself?",
            "answer": "24",
        },
        {"id": "i", "problem": "What is 1,000 plus 1?", "answer": "1,001"},
    ]
    return write_jsonl(tmp_path / "dirty.jsonl", rows)


def test_decontamination_catches_exactly_eight_shared_words_at_either_edge(tmp_path):
    """An 8-word training problem inside an evaluation problem, at its start or at its end, is
    contaminated; sharing 7 words is not. (Long texts match in the middle even with an
    off-by-one in the n-gram range; the edges do not.)"""
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
    evaluation = [" ".join([*words, "iota kappa lambda"]), " ".join(["mu nu xi", *words])]
    rows = [
        {"id": "whole", "problem": " ".join(words), "answer": "1"},
        {"id": "seven", "problem": " ".join(words[:7]) + " omicron", "answer": "2"},
        {"id": "tail", "problem": "pi rho " + " ".join(words[1:]) + " iota", "answer": "3"},
    ]
    out, rej = str(tmp_path / "kept.parquet"), str(tmp_path / "rejects.parquet")
    curate(
        [SourceSpec(write_jsonl(tmp_path / "p.jsonl", rows), name="p")],
        out,
        rej,
        eval_problems=evaluation,
    )
    kept = {r["id"] for r in read_table(out, "problems").to_pylist()}
    assert kept == {"seven"}
    assert len(ngrams(" ".join(words), 8)) == 1 and not ngrams(" ".join(words[:7]), 8)


def test_limits_are_inclusive_rejects_keep_their_row_and_unnamed_rows_get_an_id(tmp_path):
    """A problem of exactly max_problem_chars and an answer of exactly max_answer_digits are
    kept, one more of either is not; every reject carries its row as read (the JSON a person
    checks); an answer neither text nor integer is the wrong type; a row without an id is named
    by its source and row number. (Found by mutmut over curate.py: each survived before.)"""
    cfg = CurationConfig(max_problem_chars=40, max_answer_digits=3)
    rows = [
        {"id": "fits", "problem": "x" * 36 + " 1+1", "answer": "999"},
        {"id": "long", "problem": "y" * 37 + " 1+1", "answer": "1"},
        {"id": "big", "problem": "What is 10 cubed, really?", "answer": "1000"},
        {"id": "float", "problem": "What is a half of one?", "answer": 0.5},
        {"problem": "What is 3 + 4, without an id?", "answer": "7"},
    ]
    out, rej = str(tmp_path / "kept.parquet"), str(tmp_path / "rejects.parquet")
    curate([SourceSpec(write_jsonl(tmp_path / "p.jsonl", rows), name="p")], out, rej, cfg=cfg)
    kept = read_table(out, "problems").to_pylist()
    assert [r["id"] for r in kept] == ["fits", "p#4"]
    rejects = {json.loads(r["raw"])["id"]: r for r in read_table(rej, "rejects").to_pylist()}
    assert {i: r["reason"] for i, r in rejects.items()} == {
        "long": "too_long",
        "big": "answer_too_large",
        "float": "wrong_type",
    }
    assert all(json.loads(r["raw"]) == rows[r["row_id"]] for r in rejects.values())


def test_curation_counts_every_filter_and_keeps_every_reject(tmp_path, dirty):
    eval_problems = [
        "In a famous puzzle: how many positive divisors does 360 have, counting one and itself? "
        "Explain."
    ]
    out, rej = str(tmp_path / "kept.parquet"), str(tmp_path / "rejects.parquet")
    report = curate([SourceSpec(dirty, name="dirty")], out, rej, eval_problems=eval_problems)
    kept = read_table(out, "problems").to_pylist()
    assert [r["id"] for r in kept] == ["a", "i"]
    assert kept[1]["answer"] == "1001" and json.loads(kept[0]["metadata"]) == {}
    rejects = read_table(rej, "rejects").to_pylist()
    by_reason = {r["reason"]: r for r in rejects}
    assert report.read == 11 and report.kept == 2
    assert {k: v for k, v in report.dropped.items() if v} == {
        "duplicate": 1,
        "non_integer_answer": 1,
        "answer_too_large": 1,
        "missing_problem": 1,
        "missing_answer": 1,
        "wrong_type": 2,
        "bad_json": 1,
        "contaminated": 1,
    }
    assert len(rejects) == 9 == sum(report.dropped.values())
    assert by_reason["bad_json"]["row_id"] == 7 and "line 8" in by_reason["bad_json"]["detail"]
    assert (
        by_reason["contaminated"]["row_id"] == 9 and "8-gram" in by_reason["contaminated"]["detail"]
    )
    assert by_reason["answer_too_large"]["detail"].startswith("answer has 41 digits")
    assert all(r["source"] == "dirty" for r in rejects)
    assert set(report.dropped) == set(REASONS)


def test_consistency_filter_uses_a_sampler(tmp_path):
    src = write_jsonl(
        tmp_path / "p.jsonl",
        [{"id": str(i), "problem": f"Problem number {i}", "answer": str(i)} for i in range(4)],
    )
    samples = {
        "0": ["0", "0", "5"],
        "1": ["1", "7", None],
        "2": ["2", "2,0", "2.0"],
        "3": [None, None, None],
    }
    report = curate(
        [SourceSpec(src)],
        str(tmp_path / "k.parquet"),
        str(tmp_path / "r.parquet"),
        cfg=CurationConfig(consistency_min=2),
        sampler=lambda problems: [samples[p["id"]] for p in problems],
    )
    assert [r["id"] for r in read_table(str(tmp_path / "k.parquet"), "problems").to_pylist()] == [
        "0",
        "2",
    ]
    assert report.dropped["inconsistent"] == 2
    detail = read_table(str(tmp_path / "r.parquet"), "rejects").to_pylist()[0]["detail"]
    assert detail == "1 of 3 sampled answers match the label (need 2)"


def test_presets_and_nested_columns(tmp_path):
    rows = [
        {
            "prompt": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "Solve 3*3."},
            ],
            "reward_model": {"ground_truth": "9", "style": "rule"},
            "data_source": "dapo",
        }
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "dapo.parquet")
    spec = SourceSpec.parse(f"{tmp_path / 'dapo.parquet'}:dapo")
    curate([spec], str(tmp_path / "k.parquet"), str(tmp_path / "r.parquet"))
    kept = read_table(str(tmp_path / "k.parquet"), "problems").to_pylist()
    assert kept[0]["problem"] == "Solve 3*3." and kept[0]["answer"] == "9"
    assert json.loads(kept[0]["metadata"]) == {"data_source": "dapo"}
    with pytest.raises(DataError, match="unknown column preset 'dpao'"):
        SourceSpec.parse("x.parquet:dpao")
    custom = SourceSpec(
        str(tmp_path / "dapo.parquet"),
        columns=Columns(problem="prompt", answer="data_source", id=None),
    )
    report = curate([custom], str(tmp_path / "k2.parquet"), str(tmp_path / "r2.parquet"))
    assert report.dropped["non_integer_answer"] == 1


def test_a_file_whose_columns_do_not_map_is_one_file_level_error_until_mapped(tmp_path):
    path = tmp_path / "qs.jsonl"
    path.write_text(
        "".join(
            json.dumps({"question": f"What is {i}+1?", "solution": str(i + 1)}) + "\n"
            for i in range(50)
        )
    )
    with pytest.raises(DataError) as e:
        curate(
            [SourceSpec.parse(str(path))], str(tmp_path / "k.parquet"), str(tmp_path / "r.parquet")
        )
    assert str(e.value).startswith(f"{path}: no column 'problem' or 'answer'")
    assert "its columns: question, solution" in str(
        e.value
    ) and f"'{path}:problem=<column>,answer=<column>'" in str(e.value)
    report = curate(
        [SourceSpec.parse(f"{path}:problem=question,answer=solution")],
        str(tmp_path / "k.parquet"),
        str(tmp_path / "r.parquet"),
    )
    assert report.kept == 50
    assert read_table(str(tmp_path / "k.parquet"), "problems").to_pylist()[1]["answer"] == "2"
    with pytest.raises(DataError, match="problem=, answer= and optionally id="):
        SourceSpec.parse(f"{path}:problem=question,answr=solution")


def test_a_problem_text_past_the_limit_is_rejected_as_too_long(tmp_path):
    rows = [
        {"problem": "Compute 2+2. " + "x" * 1_000_000, "answer": "4"},
        {"problem": "Compute 3+3.", "answer": "6"},
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "p.parquet")
    report = curate(
        [SourceSpec(str(tmp_path / "p.parquet"))],
        str(tmp_path / "k.parquet"),
        str(tmp_path / "r.parquet"),
        cfg=CurationConfig(max_problem_chars=8000),
    )
    assert report.kept == 1 and report.dropped["too_long"] == 1
    (reject,) = read_table(str(tmp_path / "r.parquet"), "rejects").to_pylist()
    assert reject["reason"] == "too_long" and "1000013 characters (limit 8000)" in reject["detail"]
    assert len(reject["raw"]) <= 2000


def test_files_that_are_not_what_they_claim(tmp_path):
    fake = tmp_path / "fake.parquet"
    fake.write_text("id,problem\n1,hello\n")
    with pytest.raises(DataError, match=r"fake\.parquet: not a readable Parquet file"):
        curate([SourceSpec(str(fake))], str(tmp_path / "k.parquet"), str(tmp_path / "r.parquet"))
    binary = tmp_path / "junk.jsonl"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00garbage\n")
    with pytest.raises(DataError, match=r"junk\.jsonl: not JSON lines"):
        curate([SourceSpec(str(binary))], str(tmp_path / "k.parquet"), str(tmp_path / "r.parquet"))
    csv = tmp_path / "data.csv"
    csv.write_text("a,b\n")
    with pytest.raises(DataError, match=r"data\.csv: unknown file type"):
        curate([SourceSpec(str(csv))], str(tmp_path / "k.parquet"), str(tmp_path / "r.parquet"))
    write_table([], str(tmp_path / "rej.parquet"), "rejects")
    with pytest.raises(DataError, match=r"expected a 'problems' file, found 'rejects'"):
        read_table(str(tmp_path / "rej.parquet"), "problems")


def test_hub_loading_path_reports_a_clear_error_offline(tmp_path, monkeypatch):
    # as on this machine: no hub; fail fast instead of retrying. Both libraries read the
    # variables once, at import, which an earlier test of the session has done: set what they
    # read too (without it the hub was asked, ~23 s of retries in the suite, not alone)
    import datasets
    import huggingface_hub

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(DataError, match="no-such-org/no-such-dataset-rstar: not a local file"):
        curate(
            [SourceSpec("no-such-org/no-such-dataset-rstar")],
            str(tmp_path / "k.parquet"),
            str(tmp_path / "r.parquet"),
        )


def test_normalised_text():
    assert normalize_text("What is  $2+2$ ?\\quad") == normalize_text("what is 2 + 2?")


def test_mining_keeps_problems_not_solved_every_time():
    problems = [
        {"id": p, "problem": p, "answer": "1", "source": "t", "metadata": "{}"} for p in "abcd"
    ]
    rollouts = (
        [{"problem_id": "a", "reward": 1.0}] * 8
        + [{"problem_id": "b", "reward": 1.0}] * 7
        + [{"problem_id": "b", "reward": 0.0}]
        + [{"problem_id": "c", "reward": 1.0}] * 3
        + [{"problem_id": "zz", "reward": 1.0}]
    )
    hard, report = mine_hard(problems, rollouts, k=8)
    assert [h["id"] for h in hard] == ["b", "c", "d"]
    assert [(h["n_samples"], h["n_correct"], h["pass_rate"]) for h in hard] == [
        (8, 7, 0.875),
        (3, 3, 1.0),
        (0, 0, 0.0),
    ]
    assert (report.problems, report.kept, report.dropped_solved, report.undersampled) == (
        4,
        3,
        1,
        2,
    )
    assert report.mean_pass_rate == pytest.approx((1 + 0.875 + 1 + 0) / 4)


def test_mining_draws_its_problems_from_the_whole_set():
    """Two sources one after the other, as curation writes them: a draw of 32 takes from both
    (the first 32 rows were all the first source's), the same for one seed, others for another."""
    rows = [{"id": f"gsm/{i}"} for i in range(600)] + [{"id": f"arith/{i}"} for i in range(600)]
    drawn = candidates(rows, 32, seed=0)
    assert len(drawn) == len({r["id"] for r in drawn}) == 32
    assert {r["id"].split("/")[0] for r in drawn} == {"gsm", "arith"}
    assert drawn == candidates(rows, 32, seed=0) != candidates(rows, 32, seed=1)
    assert candidates(rows, None, seed=0) == candidates(rows, 5000, seed=0) == rows


def test_generator_is_deterministic_and_varied():
    a, b = synth.generate(130, seed=7), synth.generate(130, seed=7)
    assert a == b
    assert synth.generate(130, seed=8) != a
    assert len({r["id"] for r in a}) == 130
    families = {json.loads(r["metadata"])["family"] for r in a}
    assert families == {f.name for f in synth.FAMILIES}
    templates = {
        (json.loads(r["metadata"])["family"], json.loads(r["metadata"])["template"]) for r in a
    }
    assert len(templates) >= 2 * len(synth.FAMILIES)  # several phrasings per family are in use


def _independent_answer(meta: dict) -> int:
    """Each family's answer, computed a different way (sympy, brute force) from its parameters."""
    p, fam = meta["params"], meta["family"]
    if fam == "power_mod":
        return int(sympy.Mod(sympy.Integer(p["a"]) ** p["b"], p["m"]))
    if fam == "big_product":
        return math.prod(int(x) for x in p["x"].split(" \u00d7 "))
    if fam == "big_power":
        return int(sympy.Integer(p["a"]) ** p["b"])
    if fam == "divisor_count":
        return int(sympy.divisor_count(p["n"]))
    if fam == "divisor_sum":
        return int(sympy.divisor_sigma(p["n"]))
    if fam == "digit_sum_power":
        return sum(int(d) for d in str(sympy.Integer(p["a"]) ** p["b"]))
    if fam == "digit_sum_factorial":
        return sum(int(d) for d in str(sympy.factorial(p["n"])))
    if fam == "prime_count":
        return int(sympy.primepi(p["hi"]) - sympy.primepi(p["lo"] - 1))
    if fam == "prime_sum":
        return int(sum(sympy.primerange(2, p["n"])))
    if fam == "committee":
        return int(sympy.binomial(p["n"], p["k"]))
    if fam == "arrangements":
        return int(
            sympy.multinomial_coefficients(len(set(p["word"])), len(p["word"]))[
                tuple(p["word"].count(c) for c in sorted(set(p["word"])))
            ]
        )
    if fam == "linear_diophantine":
        return sum(
            1
            for x in range(p["n"] + 1)
            for y in range(p["n"] + 1)
            if p["a"] * x + p["b"] * y == p["n"]
        )
    if fam == "bounded_sum":
        c = p["c"]
        return sum(
            1
            for x in range(c + 1)
            for y in range(c + 1)
            for z in range(c + 1)
            if x + y + z == p["n"]
        )
    if fam == "long_sum":
        return sum(int(x) for x in p["x"].split(" + "))
    raise AssertionError(fam)


def test_generator_answers_are_correct():
    for row in synth.generate(len(synth.FAMILIES) * 6, seed=3):
        meta = json.loads(row["metadata"])
        assert int(row["answer"]) == _independent_answer(meta), row["problem"]
        # the numbers in the text are the parameters the answer was computed from
        for value in meta["params"].values():
            if isinstance(value, int):
                assert re.search(rf"(?<!\d){value}(?!\d)", row["problem"]), (value, row["problem"])


def test_write_is_atomic_and_schemas_documented(tmp_path, monkeypatch):
    from rstar.data import io

    path = str(tmp_path / "p.parquet")
    write_table(synth.generate(3), path, "problems")

    def crash_midway(table, where):
        Path(where).write_bytes(b"PAR1 and half a row group")
        raise OSError("disk went away mid-write")

    monkeypatch.setattr(io.pq, "write_table", crash_midway)
    with pytest.raises(OSError, match="mid-write"):  # a write that dies half-way...
        write_table(synth.generate(5, seed=1), path, "problems")
    monkeypatch.undo()
    assert len(read_table(path, "problems")) == 3  # ...leaves the old file whole
    assert [p.name for p in tmp_path.iterdir()] == ["p.parquet"]  # and no temporary behind
    doc = Path("docs/schemas.md").read_text()
    for name, sch in SCHEMAS.items():
        assert f"## {name}" in doc
        for field in sch.names:
            assert f"| {field} |" in doc, (name, field)


def test_unknown_synthetic_families_are_named():
    import pytest as _pytest

    from rstar.data import synth

    with _pytest.raises(ValueError, match=r"unknown families \['nope'\]; known: \['arrangements'"):
        synth.generate(3, families=["big_power", "nope"])


def test_levels_may_be_given_per_family():
    """{family: levels} cycles each family through its own levels (the families are the keys);
    one list for all families gives the same problems as before the mapping existed."""
    import pytest as _pytest

    rows = synth.generate(40, seed=2, levels={"power_mod": [1], "long_sum": [1, 2]})
    seen = [(m["family"], m["level"]) for m in (json.loads(r["metadata"]) for r in rows)]
    assert seen[:4] == [("power_mod", 1), ("long_sum", 1), ("power_mod", 1), ("long_sum", 2)]
    assert set(seen) == {("power_mod", 1), ("long_sum", 1), ("long_sum", 2)}
    as_one = synth.generate(40, seed=2, levels=[1, 2], families=["power_mod", "long_sum"])
    as_map = synth.generate(40, seed=2, levels={"power_mod": [1, 2], "long_sum": [1, 2]})
    assert as_one == as_map
    with _pytest.raises(ValueError, match=r"no levels given for families \['long_sum'\]"):
        synth.generate(3, levels={"power_mod": [1]}, families=["power_mod", "long_sum"])
    with _pytest.raises(ValueError, match=r"unknown families \['nope'\]"):
        synth.generate(3, levels={"nope": [1]})
