"""The pipeline's recipe: one YAML file, validated whole before any stage starts.

An unknown key, a wrong type or a missing input file is one error naming the file and the
key path (`rl.1.sampling.max_turns`) or the path that does not exist. The trainers' own dataclasses
(SFTConfig, RLConfig, RoCConfig, EvalConfig, Sampling) are the schema of their sections, so a
field added to a trainer is a field of the recipe.
"""

from __future__ import annotations

import hashlib
import json
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from rstar.agent.format import STYLES
from rstar.agent.sampling import Sampling
from rstar.data import check_names, synth
from rstar.data import sft as sft_data
from rstar.data.curate import SourceSpec
from rstar.data.io import DataError
from rstar.data.packaged import check as check_packaged
from rstar.data.packaged import is_packaged
from rstar.data.sources import column_error
from rstar.errors import NotRetryable
from rstar.eval.benchmarks import BENCHMARKS
from rstar.eval.config import EvalConfig
from rstar.pipeline.verdict import Expect
from rstar.train.config import RLConfig, SFTConfig


class ConfigError(NotRetryable, ValueError):
    """A recipe that cannot run; the message names the file and the key or path."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Synthetic(_Strict):
    """`n` generated problems cycling through `families` (default: all) and `levels`, one list
    for all of them or one per family ({power_mod: [1], long_sum: [1, 2]}, whose keys are then
    the families)."""

    n: int = Field(gt=0)
    seed: int = 0
    levels: list[int] | dict[str, list[int]] = [1, 2, 3]
    families: list[str] | None = None

    @model_validator(mode="after")
    def _known(self):
        synth.family_levels(self.levels, self.families)
        return self


class ProblemSet(_Strict):
    """Synthetic problems, or files to curate (Parquet/JSONL, local or s3://, 'path:preset', a
    hub dataset, or problems a package ships: 'champ://', 'reasoning-gym://<dataset>?n=..',
    rstar.data.packaged); for the held-out set also (or instead) `benchmarks`: name -> a file in
    the benchmark's public layout, or null for its hub dataset (rstar.eval.benchmarks), taken as
    published."""

    synthetic: Synthetic | None = None
    files: list[str] = []
    benchmarks: dict[str, str | None] = {}
    # keep only problems with an integer answer (the paper's filter); by default training
    # problems are filtered and held-out files keep every answer form math-verify can score
    integer_answers: bool | None = None

    @model_validator(mode="after")
    def _one(self):
        if (self.synthetic is None) == (not self.files and not self.benchmarks):
            raise ValueError("give exactly one of 'synthetic' or 'files' (or 'benchmarks')")
        check_names("benchmark(s)", list(self.benchmarks), BENCHMARKS)
        return self


class BaseModelSpec(_Strict):
    """The model SFT starts from: a tiny one built here (tokenizer trained, weights pretrained
    on generated text), a Hugging Face directory or hub name, or a GGUF file (a path, or
    'pkg://<distribution>/<file>' that an installed package ships; rstar.model.gguf)."""

    build_tiny: bool = True
    path: str | None = None
    gguf: str | None = None
    hidden: int = 192
    layers: int = 4
    # digits per number token, 0: one per digit (rstar.model.tiny.build_tokenizer)
    number_chunk: int = Field(0, ge=0, le=3)
    pretrain_steps: int = 1500
    pretrain_lr: float = 2e-3
    pretrain_batch: int = 16  # rows of pretrain_seq_len packed tokens
    pretrain_seq_len: int = 192
    seed: int = 0
    # A directory holding this tiny base already built (`rstar model build-base`): used when its
    # manifest matches the fields above and its files their digest (rstar.model.shipped).
    shipped: str | None = None

    @model_validator(mode="after")
    def _one(self):
        if [self.build_tiny, self.path is not None, self.gguf is not None].count(True) != 1:
            raise ValueError("give one of build_tiny: true, a path or a gguf file")
        if self.shipped and not self.build_tiny:
            raise ValueError("shipped names a built tiny base: it needs build_tiny: true")
        return self


class SFTSection(_Strict):
    """Generated non-reasoning chats (`examples` of `tasks`), or chat files to load instead
    (JSONL/Parquet of OpenAI-style messages, local or s3://)."""

    examples: int = Field(1000, gt=0)
    tasks: list[str] | None = None
    files: list[str] = []
    seed: int = 1
    train: SFTConfig = SFTConfig()

    @model_validator(mode="after")
    def _known(self):
        check_names("SFT task(s)", self.tasks, sft_data.TASKS)
        return self


class MineSection(_Strict):
    after: str = "rl2"  # the stage whose policy decides what is hard
    k: int = 4  # rollouts per problem; a problem solved k/k is easy
    problems: int | None = None  # mine among this many training problems (all by default),
    seed: int = 0  # drawn at random from the whole set with this seed
    sampling: Sampling = Field(default_factory=Sampling)
    # rollouts sampled at once (whole problems' groups): enough to keep every replica's KV
    # cache full, and no more, since the driver holds each until its group is written
    in_flight: int = Field(256, gt=0)


class Resources(_Strict):
    cpus: float = 1  # per stage job
    gpus: float = 0  # per stage job (the verl engine: GPUs per node)
    nodes: int = 1  # the verl engine: nodes per RL stage
    gpu_memory_gb: float = Field(80, gt=0)  # per GPU: sizes verl's settings (train.gpu_sizing)


class Rehearsal(_Strict):
    """This recipe is a rehearsal on CPU ranks (rstar pipeline rehearse) of the recipe in
    `plan`: verl's stages run on the CPU (rstar.train.verl_cpu) with the GPU settings sized for
    the plan's model and GPUs, mapped onto `resources.nodes` x `resources.gpus` ranks
    (rstar.train.gpu_sizing.GPUSettings.on_ranks). Stage results are keyed as the plan's: a
    rehearsal keeps its own storage (its S3 and MLflow), never a real run's."""

    plan: str  # the recipe file rehearsed
    plan_overrides: dict = {}  # its --set values
    # the agent loop's worker processes (the plan's: one a GPU); each imports verl and vLLM
    # (0.85 GB): one a node keeps the rehearsal within 24 GB
    agent_workers: int = Field(2, ge=1)
    threads: int = Field(1, ge=1)  # torch threads per training process: the ranks share the cores


class Retries(_Strict):
    count: int = 2
    delay_s: float = 5


class Tracking(_Strict):
    tracking_uri: str = "sqlite:///mlruns.db"
    experiment: str = "rstar"
    registered_model: str = "rstar"


class Recipe(_Strict):
    name: str
    storage_root: str
    prompt_style: Literal[tuple(STYLES)] = "paper"  # type: ignore[valid-type]
    engine: Literal["local", "verl"] = (
        "local"  # RL stages: this machine's trainer, or verl on the Ray cluster
    )
    sandbox_url: str | None = (
        None  # the verl engine's sandbox service (rstar sandbox serve); on CPU, started per stage
    )
    base: BaseModelSpec = BaseModelSpec()
    train_problems: ProblemSet
    eval_problems: ProblemSet
    sft: SFTSection = SFTSection()
    rl: list[RLConfig]
    mine: MineSection = MineSection()
    eval: EvalConfig = EvalConfig()
    expect: Expect = Expect()  # what the final verdict calls learning (rstar.pipeline.verdict)
    resources: Resources = Resources()
    retries: Retries = Retries()
    tracking: Tracking = Tracking()
    rehearsal: Rehearsal | None = None

    @model_validator(mode="after")
    def _stages(self):
        if self.rehearsal and (self.engine != "verl" or not self.resources.gpus):
            raise ValueError(
                "a rehearsal runs engine 'verl' on CPU ranks: it needs resources.gpus (ranks a "
                "node) and engine: verl"
            )
        if self.engine == "verl" and self.resources.gpus and not self.sandbox_url:
            raise ValueError(
                "engine 'verl' on GPUs needs sandbox_url, the cluster's sandbox service (with "
                "resources.gpus: 0 verl runs on this CPU and starts its own)"
            )
        names = [s.name for s in self.rl]
        if len(set(names)) != len(names):
            raise ValueError(f"RL stage names repeat: {names}")
        for s in self.rl:
            if s.mini_batches < 1 or s.prompts_per_step % s.mini_batches:
                raise ValueError(
                    f"rl stage {s.name}: mini_batches ({s.mini_batches}) must divide "
                    f"prompts_per_step ({s.prompts_per_step})"
                )
        if unknown := set(self.expect.stage_for) - set(names):
            raise ValueError(
                f"expect.stage_for names {sorted(unknown)}, not RL stages of this recipe ({names})"
            )
        if self.train_problems.benchmarks:
            raise ValueError("train_problems.benchmarks: benchmarks are for eval_problems only")
        if self.mine.after not in names[:-1]:
            raise ValueError(
                f"mine.after must name an RL stage before the last ({names[:-1]}), not "
                f"{self.mine.after!r}"
            )
        return self

    def digest(self) -> str:
        """Content digest of the whole resolved recipe."""
        return json_digest(self.model_dump(mode="json"))


def json_digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


_UNKNOWN = ("extra_forbidden", "unexpected_keyword_argument")


def _where(loc: tuple) -> str:
    return ".".join(str(p) for p in loc) or "(top level)"


def _keys_of(cls) -> dict:
    """Field name -> type of a pydantic model or a dataclass."""
    import dataclasses
    import typing

    if isinstance(cls, type) and issubclass(cls, BaseModel):
        return {name: f.annotation for name, f in cls.model_fields.items()}
    if dataclasses.is_dataclass(cls):
        return typing.get_type_hints(cls)
    return {}


def _did_you_mean(loc: tuple) -> str:
    """For an unknown key: the known key at the same place it most resembles, if any."""
    import difflib
    import typing

    cls = Recipe
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        cls = _keys_of(cls).get(part)
        while typing.get_origin(cls) is not None:  # list[X], X | None -> X
            cls = next((a for a in typing.get_args(cls) if a is not type(None)), None)
    keys = _keys_of(cls)
    if "sampling" in keys and loc[-1] in _keys_of(Sampling):
        return f" (it belongs under sampling: {_where((*loc[:-1], 'sampling', loc[-1]))})"
    close = difflib.get_close_matches(str(loc[-1]), list(keys), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def load_recipe(path: str, overrides: dict | None = None, *, check_inputs: bool = True) -> Recipe:
    """Read and validate a recipe file; `overrides` ({"rl.0.steps": 2}) replace values first.
    `check_inputs` also checks that every input file exists (the pipeline always does)."""
    from rstar.storage import filesystem

    fs, inner = filesystem(path)
    if not fs.exists(inner):
        raise ConfigError(f"{path}: no such recipe file")
    with fs.open(inner, "r") as f:
        try:
            raw = yaml.safe_load(f) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: not valid YAML ({e})") from None
    for dotted, value in (overrides or {}).items():
        _set(raw, dotted.split("."), value, path)
    try:
        recipe = Recipe.model_validate(raw)
    except ValidationError as e:
        problems = [
            f"{_where(err['loc'])}: "
            + (f"unknown key{_did_you_mean(err['loc'])}" if err["type"] in _UNKNOWN else err["msg"])
            for err in e.errors()
        ]
        raise ConfigError(f"{path}: " + "; ".join(problems)) from None
    for where, source in _packaged_sources(recipe) if check_inputs else ():
        try:
            check_packaged(source)
        except DataError as e:
            raise ConfigError(f"{path}: {where}: {e}") from None
    if check_inputs and (why := _unusable_root(recipe.storage_root)):
        raise ConfigError(f"{path}: storage_root {recipe.storage_root}: {why}")
    if check_inputs and recipe.base.build_tiny and recipe.base.shipped:
        import os

        from rstar.model.shipped import ShippedBaseError, check_shipped

        try:  # the base stage checks it again; a mismatch is the recipe's error, said now
            check_shipped(os.path.abspath(recipe.base.shipped), recipe.base)
        except ShippedBaseError as e:
            raise ConfigError(f"{path}: {e}") from None
    if recipe.base.gguf and check_inputs:
        from rstar.model.gguf import BaseModelError, gguf_path

        try:
            gguf_path(recipe.base.gguf)
        except BaseModelError as e:
            raise ConfigError(f"{path}: base.gguf: {e}") from None
    for where, uri, spec in input_files(recipe) if check_inputs else ():
        try:
            fs, inner = filesystem(uri)
            found = fs.exists(inner)
        except Exception as e:  # noqa: BLE001 - no credentials, no endpoint, no network: say which
            raise ConfigError(
                f"{path}: {where}: cannot check {uri} ({type(e).__name__}: {e})"
            ) from None
        if not found:
            raise ConfigError(f"{path}: {where}: {uri} does not exist")
        problem, names = _unreadable(fs, inner)
        if problem:
            raise ConfigError(f"{path}: {where}: {uri} {problem}")
        wrong = column_error(uri, spec.columns, names) if spec and names is not None else None
        if wrong:
            raise ConfigError(f"{path}: {where}: {wrong}")
    return recipe


def seed_overrides(recipe: Recipe, seed: int, rebuild_base: bool = False) -> dict:
    """--set values that move every seeded part of the recipe by `seed` (the held-out
    evaluation keeps its own, so runs differ only by what they trained)."""
    over = {"sft.seed": recipe.sft.seed + seed, "sft.train.seed": recipe.sft.train.seed + seed}
    over.update({f"rl.{i}.seed": s.seed + seed for i, s in enumerate(recipe.rl)})
    if rebuild_base:
        over.update({"base.shipped": None, "base.seed": recipe.base.seed + seed})
    return over


def run_overrides(
    path: str,
    overrides: dict | None = None,
    *,
    storage_root: str | None = None,
    rl_steps: list[int] | None = None,
    seed: int = 0,
) -> dict:
    """The overrides a run form's typed fields stand for (the storage root, each RL stage's steps
    in order, a seed that moves every seeded part), then the free-form `overrides`, which win."""
    out: dict = {"storage_root": storage_root} if storage_root else {}
    out.update({f"rl.{i}.steps": steps for i, steps in enumerate(rl_steps or [])})
    if seed:
        out.update(seed_overrides(load_recipe(path, check_inputs=False), seed))
    return {**out, **(overrides or {})}


def _unusable_root(root: str) -> str | None:
    """Why a local storage root cannot be made (a file where a directory must be), else None.
    Remote roots are checked by the stages that reach them."""
    import os

    from rstar.storage import is_remote

    if is_remote(root):
        return None
    path = os.path.abspath(root)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    if not os.path.isdir(path):
        return f"{path} is a file, not a directory"
    if not os.access(path, os.W_OK | os.X_OK):
        return f"{path} is not writable"
    return None


def _unreadable(fs, inner: str) -> tuple[str | None, list[str] | None]:
    """Why a data file cannot be read, from its cheapest part (a Parquet footer, a JSONL first
    line), so a truncated file fails the recipe check instead of a stage minutes later; and the
    columns that part shows (None where it shows none)."""
    import json

    import pyarrow.parquet as pq

    try:
        if inner.endswith(".parquet"):
            with fs.open(inner, "rb") as f:
                return None, pq.read_schema(f).names
        if inner.endswith(".jsonl"):
            with fs.open(inner, "r") as f:
                first = f.readline()
            row = json.loads(first) if first.strip() else None
            return None, list(row) if isinstance(row, dict) else None
    except Exception as e:  # noqa: BLE001 - pyarrow's and json's errors: say what they said
        return f"is not readable ({type(e).__name__}: {str(e)[:200]})", None
    return None, None


def _packaged_sources(recipe: Recipe):
    for section in ("train_problems", "eval_problems"):
        for i, text in enumerate(getattr(recipe, section).files):
            if is_packaged(text):
                yield f"{section}.files.{i}", text


def input_files(recipe: Recipe):
    """(where in the recipe, URI, the problem source's spec or None) of every input file."""
    for i, uri in enumerate(recipe.sft.files):
        yield f"sft.files.{i}", uri, None
    for name, uri in recipe.eval_problems.benchmarks.items():
        if uri:
            yield f"eval_problems.benchmarks.{name}", uri, None
    for section in ("train_problems", "eval_problems"):
        for i, text in enumerate(getattr(recipe, section).files):
            spec = SourceSpec.parse(text)
            if is_packaged(spec.path):
                continue
            if spec.path.startswith(("/", ".", "s3://")) or spec.path.endswith(
                (".parquet", ".jsonl")
            ):
                yield f"{section}.files.{i}", spec.path, spec  # anything else is a hub dataset name
    if recipe.base.path and recipe.base.path.startswith(("/", ".", "s3://")):
        yield "base.path", recipe.base.path, None
    if recipe.base.shipped:
        yield "base.shipped", recipe.base.shipped, None


def _set(tree: dict, keys: list[str], value, path: str) -> None:
    """Set the value at a dotted key. An RL stage is named by its name (`rl1.steps`) or its
    position in `rl` (`rl.0.steps`)."""
    stages = [s.get("name") for s in tree.get("rl") or [] if isinstance(s, dict)]
    if keys[0] in stages:
        keys = ["rl", str(stages.index(keys[0])), *keys[1:]]
    node = tree
    for depth, k in enumerate(keys):
        if isinstance(node, list):
            if not k.isdigit() or int(k) >= len(node):
                where = ".".join(keys[:depth])
                raise ConfigError(
                    f"{path}: {'.'.join(keys)}: {where} has {len(node)} entries, numbered from 0"
                    + (f" (or by name: {', '.join(map(str, stages))})" if where == "rl" else "")
                )
            k = int(k)
        elif not isinstance(node, dict):
            raise ConfigError(f"{path}: {'.'.join(keys)}: {'.'.join(keys[:depth])} is a value")
        if depth == len(keys) - 1:
            node[k] = value
        else:
            node = node[k] if isinstance(node, list) else node.setdefault(k, {})
