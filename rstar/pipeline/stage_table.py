"""The pipeline's stages, in one table. The flow, the cache, `rstar pipeline plan` and the
launcher all read it; adding a stage is one entry in `KINDS` (and `recipe_stages`, where it goes
in the order) plus its body in rstar.pipeline.stages (`BODIES`).

A stage has a name (an RL stage: its recipe name, rl1) and a kind, which says what every stage of
that kind needs: the recipe keys its cache key reads, what storage holds while its result may be
reused, whether it resumes after a kill, and what runs it (verl's trainers under `engine: verl`,
engine replicas serving the model). `recipe_stages` lists a recipe's stages in the order they run,
each with what it takes from earlier ones: the model it starts from, the problems it works on,
the checkpoints it evaluates.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rstar.pipeline.config import ConfigError, Recipe
from rstar.pipeline.layout import Layout
from rstar.pipeline.records import StageInputs, StageOutput


@dataclass(frozen=True)
class Kind:
    # the recipe keys its cache key reads ("rl": the stage's own entry of the list)
    section: tuple[str, ...]
    # what storage holds while a cached result may be reused; None: the stage's model
    stored: Callable[[Layout, StageInputs], list[str]] | None = None
    # continues from its working directory after a retry or a kill (checkpoints, parts written)
    resumes: Callable[[Recipe], bool] = lambda recipe: False
    trains: bool = False  # verl's trainer runs it under `engine: verl`
    serves: bool = False  # the model in engine replicas (rstar.pipeline.stages.serving)


KINDS = {
    "base": Kind(section=("base",)),
    "problems": Kind(
        section=("train_problems", "eval_problems"),
        stored=lambda layout, _: [
            layout.dataset("train_problems"),
            layout.dataset("eval_problems"),
        ],
    ),
    # the engine is in the key of every stage it runs: switching it must not serve the other
    # engine's result from cache
    "sft": Kind(
        section=("sft", "prompt_style", "engine"),
        resumes=lambda recipe: recipe.engine == "verl",  # from verl's checkpoints
        trains=True,
    ),
    "rl": Kind(section=("rl", "prompt_style", "engine"), resumes=lambda _: True, trains=True),
    "mine": Kind(
        section=("mine", "prompt_style", "engine"),
        stored=lambda layout, _: [layout.dataset("hard_problems")],
        resumes=lambda _: True,  # after its last Parquet part
        serves=True,
    ),
    "evaluate": Kind(
        section=("eval", "expect", "prompt_style", "engine"),
        stored=lambda layout, inputs: [f"{layout.reports(inputs.report_name)}/summary.json"],
        resumes=lambda _: True,  # after its last checkpoint evaluated
        serves=True,
    ),
}


@dataclass(frozen=True)
class Stage:
    name: str
    kind: str  # a key of KINDS, and of rstar.pipeline.stages.BODIES
    model_from: str | None = None  # the stage whose model it starts from
    problems_from: tuple[str, str] | None = None  # (stage, dataset) of the problems it works on
    evaluates: tuple[str, ...] = ()  # the checkpoints (stages) it evaluates

    @property
    def needs(self) -> Kind:
        return KINDS[self.kind]

    def inputs(self, outs: dict[str, StageOutput]) -> StageInputs:
        """Its inputs, from the outputs of the stages before it (by name)."""
        problems = None
        if self.problems_from:
            stage, dataset = self.problems_from
            problems = outs[stage].datasets[dataset]
        return StageInputs(
            model=outs[self.model_from].model if self.model_from else None,
            problems=problems,
            models={m: outs[m].model for m in self.evaluates},
            # what the verdict says of copying, before and after SFT (rstar.eval.copying)
            copying=(
                {
                    m: {k: v for k, v in outs[m].metrics.items() if k.startswith("copy_")}
                    for m in ("base", "sft")
                }
                if self.evaluates
                else {}
            ),
        )


def recipe_stages(recipe: Recipe) -> list[Stage]:
    """The recipe's stages in the order they run: base, problems, SFT, the RL stages with mining
    right after `mine.after` (the last RL stage trains on the mined problems), evaluation of
    every checkpoint (the base too with `eval.include_base`)."""
    train = ("problems", "train")
    stages = [Stage("base", "base"), Stage("problems", "problems"), Stage("sft", "sft", "base")]
    before = "sft"
    for s in recipe.rl:
        last = s is recipe.rl[-1]
        stages.append(Stage(s.name, "rl", before, ("mine", "hard_problems") if last else train))
        if s.name == recipe.mine.after:
            stages.append(Stage("mine", "mine", s.name, train))
        before = s.name
    checkpoints = ["base"] * recipe.eval.include_base + ["sft"] + [s.name for s in recipe.rl]
    return [*stages, Stage("evaluate", "evaluate", None, ("problems", "eval"), tuple(checkpoints))]


def stage_names(recipe: Recipe) -> list[str]:
    return [s.name for s in recipe_stages(recipe)]


def trained_stages(recipe: Recipe) -> list[str]:
    """The stages that make the recipe's result, SFT to the last RL stage (mining among them):
    what the recipe's time counts."""
    names = stage_names(recipe)
    return names[names.index("sft") : names.index("evaluate")]


def find(recipe: Recipe, stage: str) -> Stage:
    """The recipe's stage of that name; a name it does not have is an error naming its stages."""
    for s in recipe_stages(recipe):
        if s.name == stage:
            return s
    raise ConfigError(
        f"{stage!r} is no stage of recipe {recipe.name} ({', '.join(stage_names(recipe))})"
    )


def section(recipe: Recipe, stage: str) -> dict:
    """The part of the recipe a stage's result depends on (with its inputs' digests, its cache
    key): editing the evaluation protocol does not re-run SFT."""
    dump = recipe.model_dump(mode="json")
    dump["rl"] = next((s for s in dump["rl"] if s["name"] == stage), None)
    return {k: dump[k] for k in find(recipe, stage).needs.section}


def check_until(recipe: Recipe, until: str | None) -> None:
    """A run asked to stop after `until` names one of the recipe's stages."""
    if until is not None:
        try:
            find(recipe, until)
        except ConfigError as e:
            raise ConfigError(f"until: {e}") from None
