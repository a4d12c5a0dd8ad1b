"""The final verdict (did the recipe learn?) and the robustness benchmark's plan and table."""

import pytest

from rstar.bench.robustness import (
    Variant,
    failures,
    meets,
    native_capability,
    table,
    variants,
)
from rstar.pipeline.config import load_recipe, seed_overrides
from rstar.pipeline.verdict import Expect, Subset, failed_lines, verdict


def _summaries(**acc):
    return {name: {"problems": {"questions": 10, "avg_pass@1": a}} for name, a in acc.items()}


def test_a_recipe_that_learnt_is_said_to_have_learnt():
    learnt, lines = verdict(_summaries(sft=0.2, rl1=0.7, rl2=0.8, rl3=0.81), Expect(0.10, 0.40))
    assert learnt is True
    assert lines[0].startswith("ok: rl1 held-out 0.200 -> 0.700 (+0.500)")
    assert lines[-1].startswith("ok: the recipe, sft 0.200 -> rl3 0.810 (+0.610)")
    assert not any("copy probes" in line for line in lines)
    assert failed_lines(lines) == []


@pytest.mark.parametrize(
    "acc, failing",
    [
        (
            {"sft": 0.07, "rl1": 0.10, "rl2": 0.50, "rl3": 0.60},
            "rl1 held-out 0.070 -> 0.100",
        ),  # stage 1 flat
        (
            {"sft": 0.07, "rl1": 0.30, "rl2": 0.30, "rl3": 0.35},
            "the recipe, sft 0.070 -> rl3 0.350",
        ),  # too little overall
    ],
)
def test_a_recipe_that_did_not_learn_is_told_plainly_with_the_copy_probes(acc, failing):
    copying = {
        "base": {"copy_repeat": 0.95},
        "sft": {"copy_into_call": 0.95, "copy_read_back": 0.15},
    }
    learnt, lines = verdict(_summaries(**acc), Expect(0.10, 0.40), copying)
    assert learnt is False
    assert any(line.startswith("DID NOT LEARN") and failing in line for line in lines)
    assert [failing in line for line in failed_lines(lines)] == [True]
    probes = next(line for line in lines if line.startswith("copy probes"))
    assert "base repeat 0.95" in probes and "sft into_call 0.95, read_back 0.15" in probes
    assert lines[-1].startswith("where to look")


def test_paired_gain_is_a_t_interval_over_per_question_changes():
    from rstar.eval.metrics import paired_gain

    gain, low, high = paired_gain([0.0, 0.0, 1.0, 1.0], [1.0, 0.0, 1.0, 1.0])
    # changes 1, 0, 0, 0: mean 0.25, sd 0.5, se 0.25, t(0.975, 3) = 3.182
    assert gain == 0.25 and high - gain == pytest.approx(3.182 * 0.25, abs=1e-3)
    assert low == pytest.approx(0.25 - 0.7956, abs=1e-3)
    with pytest.raises(ValueError, match="same 2\\+ questions"):
        paired_gain([0.5], [1.0])


def _graded(n_per_level: int = 12) -> list[dict]:
    import json

    return [
        {"id": f"L{level}-{i}", "metadata": json.dumps({"family": "f", "level": level})}
        for level in (1, 3)
        for i in range(n_per_level)
    ]


def _questions(problems, **by_stage):
    """Per stage, avg@1 per question from a function of (level, index)."""
    return {
        stage: {p["id"]: f(int(p["id"][1]), int(p["id"].split("-")[1])) for p in problems}
        for stage, f in by_stage.items()
    }


def test_a_stage_is_judged_on_the_questions_it_is_for():
    problems = _graded()
    # rl2 lifts every level-3 question by 0.5, leaves level 1 alone
    questions = _questions(
        problems,
        sft=lambda level, i: 0.25,
        rl1=lambda level, i: 0.75 if level == 1 else 0.25,
        rl2=lambda level, i: 0.75,
    )
    summaries = _summaries(sft=0.25, rl1=0.5, rl2=0.75)
    expect = Expect(0.10, 0.40, stage_for={"rl2": Subset(levels=[3])})
    learnt, lines = verdict(summaries, expect, None, questions, problems)
    assert learnt is True
    line = next(x for x in lines if "rl2 on levels 3" in x)
    assert line.startswith("ok: rl2 on levels 3 (12 questions) 0.250 -> 0.750 (+0.500")
    # a gain on level 1 (where rl2 is not meant to act) and noise on level 3: nothing shown
    questions["rl2"] = {p["id"]: 0.75 if p["id"][1] == "1" else 0.25 for p in problems}
    questions["rl2"].update({"L1-0": 1.0, "L3-0": 1.0, "L3-1": 0.0})  # +0.04, noise
    learnt, lines = verdict(summaries, expect, None, questions, problems)
    assert learnt is False
    assert any(x.startswith("NO GAIN SHOWN: rl2 on levels 3 (12 questions)") for x in lines)


def test_question_accuracy_halves_are_the_first_and_the_other_samples_by_index():
    from rstar.eval.metrics import question_accuracy

    # q1's samples 0-1 wrong, 2-3 right, written out of order
    records = [
        {"problem_id": "q1", "sample_index": i, "reward": float(i >= 2)} for i in (3, 0, 2, 1)
    ]
    assert question_accuracy(records) == {"q1": 0.5}
    assert question_accuracy(records, 0) == {"q1": 0.0}
    assert question_accuracy(records, 1) == {"q1": 1.0}


def test_a_hard_subset_is_chosen_on_half_the_samples_and_scored_on_the_others():
    """rl3 is for the questions rl2 did not always solve. Questions chosen for a bad first half
    must not rise by chance: rl3 no better than rl2 shows no gain even though rl2's mean over
    all its samples is lower on the chosen questions (regression to the mean)."""
    problems = _graded()
    ids = [p["id"] for p in problems]
    hard = set(ids[::2])  # rl2 missed these in its first half of samples
    first = {"rl2": {i: 0.5 if i in hard else 1.0 for i in ids}, "rl3": dict.fromkeys(ids, 1.0)}
    # the other half: rl2 at 0.5 everywhere (a bad first draw on the chosen ones did not last)
    other = {"rl2": dict.fromkeys(ids, 0.5), "rl3": dict.fromkeys(ids, 0.5)}
    questions = {
        name: {i: (first[name][i] + other[name][i]) / 2 for i in ids} for name in ("rl2", "rl3")
    }
    summaries = _summaries(rl2=0.6, rl3=0.7)
    expect = Expect(stage_for={"rl3": Subset(hard=True)})
    learnt, lines = verdict(summaries, expect, None, questions, problems, (first, other))
    assert learnt is False
    assert any(x.startswith("NO GAIN SHOWN: rl3 on hard (rl2 wrong in its") for x in lines), lines
    assert any("(12 questions) 0.500 -> 0.500" in x for x in lines)
    # rl3 lifts the chosen questions on the other half: shown
    other["rl3"] = {i: 1.0 if i in hard else 0.5 for i in ids}
    learnt, lines = verdict(summaries, expect, None, questions, problems, (first, other))
    assert learnt is True
    assert any(x.startswith("ok: rl3 on hard") and "0.500 -> 1.000 (+0.500" in x for x in lines)


def test_a_hard_subset_with_one_sample_a_question_is_not_called_a_gain():
    expect = Expect(stage_for={"rl3": Subset(hard=True)})
    questions = {"rl2": {"a": 0.0, "b": 0.0}, "rl3": {"a": 1.0, "b": 1.0}}
    learnt, lines = verdict(
        _summaries(rl2=0.0, rl3=1.0),
        expect,
        None,
        questions,
        [{"id": i, "metadata": "{}"} for i in "ab"],
    )
    assert learnt is False
    assert any(x.startswith("NO GAIN SHOWN: rl3 on hard") and "eval.k >= 2" in x for x in lines)


def test_a_stage_whose_questions_are_missing_is_not_called_a_gain():
    expect = Expect(stage_for={"rl2": Subset(families=["absent"])})
    learnt, lines = verdict(_summaries(sft=0.2, rl1=0.5, rl2=0.9), expect, None, {}, _graded())
    assert learnt is False and any("0 held-out questions match" in x for x in lines)


def test_a_recipe_may_only_name_its_own_stages_in_stage_for():
    from rstar.pipeline.config import ConfigError

    with pytest.raises(ConfigError, match=r"expect.stage_for names \['rl9'\]"):
        load_recipe("configs/tiny.yaml", {"expect.stage_for": {"rl9": {"levels": [1]}}})


def test_robustness_runs_vary_seeds_kernels_and_threads():
    recipe = load_recipe("configs/tiny.yaml")
    plan = variants(recipe, seeds=3, rebuild_base=False)
    native = native_capability()
    assert [v.seed for v in plan[:3]] == [0, 1, 2] and all(not v.env for v in plan[:3])
    kernels = {v.env["ATEN_CPU_CAPABILITY"] for v in plan if v.env}
    assert "default" in kernels and native not in kernels
    one_thread = [v for v in plan if v.overrides.get("resources.cpus") == 1]
    assert len(one_thread) == 1 and one_thread[0].seed == 0
    # every seeded part moves with the seed, the shipped base stays unless it is rebuilt
    over = seed_overrides(recipe, 2, rebuild_base=False)
    assert (
        over["sft.seed"] == recipe.sft.seed + 2
        and over["sft.train.seed"] == recipe.sft.train.seed + 2
    )
    assert [over[f"rl.{i}.seed"] for i in range(len(recipe.rl))] == [s.seed + 2 for s in recipe.rl]
    assert "base.shipped" not in over
    rebuilt = seed_overrides(recipe, 1, rebuild_base=True)
    assert rebuilt["base.shipped"] is None and rebuilt["base.seed"] == recipe.base.seed + 1
    # and every variant's overrides make a valid recipe
    for v in plan:
        load_recipe("configs/tiny.yaml", v.overrides)


def test_robustness_targets_hold_per_run_not_on_the_mean():
    good = {
        "accuracy": {"sft": 0.2, "rl1": 0.7, "rl2": 0.8, "rl3": 0.8},
        "learnt": True,
        "recipe_seconds": 400,
        "metrics": {
            "base": {"copy_repeat": 1.0},
            "sft": {"copy_into_call": 0.95, "copy_read_back": 0.95},
        },
    }
    bad = {
        **good,
        "accuracy": {"sft": 0.07, "rl1": 0.1, "rl2": 0.1, "rl3": 0.13},
        "learnt": False,
        "verdict": ["ok: rl1 held-out", "rl2 held-out", "NO GAIN SHOWN: rl3 on hard", "where"],
    }
    assert all(meets(good).values())
    assert meets(bad) == {"sft": True, "final": False, "gain": False, "verdict": False}
    # a stage that showed no gain where it is meant to fails the run whatever the totals
    assert meets({**good, "learnt": False})["verdict"] is False
    rows = table([(Variant("seed 0"), good), (Variant("seed 1"), bad)])
    assert rows[2].endswith("| met |") and "| 0.800 |" in rows[2]
    assert rows[3].endswith("| NOT met: final, gain, verdict |") and "0.95 / 0.95" in rows[3]
    # and which verdict line it was, by run
    assert failures([(Variant("seed 0"), {**good, "verdict": []}), (Variant("seed 1"), bad)]) == [
        "- seed 1: NO GAIN SHOWN: rl3 on hard"
    ]
