"""The by-group table: where each checkpoint gained, per family and level, with paired
intervals."""

import json

from rstar.eval.groups import group_of, group_table


def _problems():
    return [
        {"id": f"{fam}-{lvl}-{i}", "metadata": json.dumps({"family": fam, "level": lvl})}
        for fam, lvl in (("big_power", 1), ("power_mod", 3), ("big_product", 2))
        for i in range(10)
    ]


def test_each_group_shows_its_own_paired_gain():
    problems = _problems()
    before = {p["id"]: 0.25 for p in problems}
    # power_mod L3 gains 0.5 on every question; big_power L1 moves both ways, +0.075 on average
    after = {**before, **{p["id"]: 0.75 for p in problems if "power_mod" in p["id"]}}
    after.update({"big_power-1-0": 1.0, "big_power-1-1": 0.0, "big_power-1-2": 0.5})
    # and big_product L2 loses 0.25 on every question: a loss is shown as plainly as a gain
    after.update({p["id"]: 0.0 for p in problems if "big_product" in p["id"]})
    table = group_table({"rl1": before, "rl2": after}, problems)
    rows = {line.split(" | ")[0].strip("| "): line for line in table.splitlines()}
    assert rows["power_mod L3"] == (
        "| power_mod L3 | 10 | 0.250 | 0.750 (**+0.500**, +0.500 to +0.500) |"
    )
    assert rows["big_power L1"].startswith("| big_power L1 | 10 | 0.250 | 0.325 (+0.075, -")
    assert "0.000 (**-0.250**, -0.250 to -0.250)" in rows["big_product L2"]
    assert "bold: the interval excludes zero" in table


def test_no_table_without_groups_or_a_second_checkpoint():
    problems = _problems()
    one = {p["id"]: 0.5 for p in problems}
    assert group_table({"sft": one}, problems) == ""
    plain = [{"id": "a", "metadata": "{}"}, {"id": "b", "metadata": json.dumps({"level": 2})}]
    assert group_of(plain[0]) is None and group_of(plain[1]) is None
    assert group_table({"sft": {"a": 0, "b": 1}, "rl1": {"a": 1, "b": 1}}, plain) == ""
