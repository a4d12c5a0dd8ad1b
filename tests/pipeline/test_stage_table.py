"""The stage table (rstar.pipeline.stage_table): the order stages run in, what each is given
from the earlier ones, and one body and one cache section per kind."""

import pytest

from rstar.pipeline.config import ConfigError, Recipe, load_recipe
from rstar.pipeline.records import ModelRef, StageOutput, Stored
from rstar.pipeline.stage_table import KINDS, find, recipe_stages, stage_names, trained_stages
from rstar.pipeline.stages import BODIES

TINY = "configs/tiny.yaml"


def _outputs(names: list[str]) -> dict[str, StageOutput]:
    """A distinct model per stage and the problems' and mining's datasets, as stages return them."""
    outs = {n: StageOutput(n, model=ModelRef(f"models/{n}"), metrics={"copy_x": n}) for n in names}
    outs["problems"] = StageOutput(
        "problems", datasets={"train": Stored("train"), "eval": Stored("eval")}
    )
    outs["mine"] = StageOutput("mine", datasets={"hard_problems": Stored("hard")})
    return outs


def _wiring(recipe: Recipe) -> dict[str, tuple]:
    """Per stage: (the model it starts from, its problems) as the flow would hand them over."""
    outs, got = _outputs(stage_names(recipe)), {}
    for stage in recipe_stages(recipe):
        inputs = stage.inputs(outs)
        model = inputs.model.uri if inputs.model else None
        got[stage.name] = (model, inputs.problems.uri if inputs.problems else None)
    return got


def test_the_recipe_runs_its_stages_in_order_each_from_the_one_before():
    recipe = load_recipe(TINY)
    assert stage_names(recipe) == [
        "base", "problems", "sft", "rl1", "rl2", "mine", "rl3", "evaluate",
    ]  # fmt: skip
    assert _wiring(recipe) == {
        "base": (None, None),
        "problems": (None, None),
        "sft": ("models/base", None),
        "rl1": ("models/sft", "train"),
        "rl2": ("models/rl1", "train"),
        "mine": ("models/rl2", "train"),  # what rl2's policy fails
        "rl3": ("models/rl2", "hard"),  # the last stage trains on the mined problems
        "evaluate": (None, "eval"),
    }
    evaluate = recipe_stages(recipe)[-1].inputs(_outputs(stage_names(recipe)))
    assert {k: m.uri for k, m in evaluate.models.items()} == {
        n: f"models/{n}" for n in ["sft", "rl1", "rl2", "rl3"]
    }
    assert evaluate.copying == {"base": {"copy_x": "base"}, "sft": {"copy_x": "sft"}}
    assert trained_stages(recipe) == ["sft", "rl1", "rl2", "mine", "rl3"]


def test_mining_follows_the_stage_the_recipe_names_and_the_base_is_evaluated_when_asked():
    recipe = load_recipe(
        TINY,
        {
            "rl": [{"name": n, "steps": 1} for n in ("a", "b", "c", "d")],
            "mine.after": "a",
            "eval.include_base": True,
            "expect.stage_for": {},  # tiny.yaml's names rl2 and rl3
        },
    )
    assert stage_names(recipe) == [
        "base",
        "problems",
        "sft",
        "a",
        "mine",
        "b",
        "c",
        "d",
        "evaluate",
    ]
    wiring = _wiring(recipe)
    assert wiring["mine"] == ("models/a", "train") and wiring["b"] == ("models/a", "train")
    assert wiring["d"] == ("models/c", "hard")
    evaluate = recipe_stages(recipe)[-1].inputs(_outputs(stage_names(recipe)))
    assert list(evaluate.models) == ["base", "sft", "a", "b", "c", "d"]


def test_every_kind_has_one_body_and_a_cache_section_the_recipe_has():
    assert set(KINDS) == set(BODIES)
    fields = set(Recipe.model_fields)
    for name, kind in KINDS.items():
        assert set(kind.section) <= fields, name
    recipe = load_recipe(TINY)
    assert {s.kind for s in recipe_stages(recipe)} == set(KINDS)
    # what resumes after a kill: the RL stages, mining, evaluation; SFT only on verl
    resumes = [s.name for s in recipe_stages(recipe) if s.needs.resumes(recipe)]
    assert resumes == ["rl1", "rl2", "mine", "rl3", "evaluate"]
    verl = load_recipe(TINY, {"engine": "verl"})
    assert find(verl, "sft").needs.resumes(verl)


def test_a_stage_the_recipe_lacks_is_named_with_the_ones_it_has():
    with pytest.raises(ConfigError, match=r"'rl9' is no stage of recipe tiny \(base, problems"):
        find(load_recipe(TINY), "rl9")
