"""What the pipeline's stages pass each other: references to what storage holds (a URI and the
content digest of what is there), never the data itself.

The flow builds each stage's `StageInputs` from earlier stages' `StageOutput`s. Both are
plain dataclasses: Prefect persists an output as its task's result, Ray ships both to the
stage's worker, and `StageInputs.key()` is the part of a stage's cache key that names its
inputs (rstar.pipeline.cache.key).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace


@dataclass(frozen=True)
class Stored:
    """A dataset or report in storage: its URI and the digest of its content then."""

    uri: str
    digest: str | None = None


@dataclass(frozen=True)
class ModelRef(Stored):
    """A model directory in storage, and once the stage's task registers it, its MLflow model
    version ("name/N"), which the next stage's model version names as the one it started from."""

    version: str | None = None

    def registered(self, version: str) -> ModelRef:
        return replace(self, version=version)


@dataclass
class StageInputs:
    model: ModelRef | None = None  # sft, RL stages, mining: the model it starts from
    problems: Stored | None = None  # RL stages, mining, evaluation: the problems it works on
    models: dict[str, ModelRef] = field(default_factory=dict)  # evaluation: checkpoints by name
    # evaluation: copy_* probes of base and SFT
    copying: dict[str, dict] = field(default_factory=dict)
    report_name: str = "eval"  # evaluation: its directory under reports/ (a re-evaluation's own)

    def key(self) -> dict:
        """What names these inputs in a cache key (every field, as plain JSON values)."""
        return asdict(self)


@dataclass
class Evaluation:
    """What the evaluation stage found: per checkpoint and benchmark, the protocol's figures."""

    summaries: dict[str, dict]
    table: str  # the markdown table, checkpoints side by side
    learnt: bool | None  # the recipe's verdict (None for a re-evaluation's own pick of models)
    verdict: list[str]

    def accuracy(self) -> dict[str, float]:
        """Held-out accuracy per checkpoint, over every benchmark (each question weighing the
        same), in the order evaluated: the pipeline's headline."""
        from rstar.eval.metrics import overall_accuracy

        return {name: overall_accuracy(s) for name, s in self.summaries.items()}

    def headline(self) -> str:
        """The verdict and the table, as markdown."""
        if self.learnt is None:
            lines = []
        else:
            lines = ["**Learnt.**" if self.learnt else "**DID NOT LEARN.**", ""]
        return "\n".join([*lines, *(f"- {v}" for v in self.verdict), "", self.table]) + "\n"


@dataclass
class StageOutput:
    stage: str
    metrics: dict = field(default_factory=dict)  # headline figures, shown in the stage's summary
    model: ModelRef | None = None  # the stages that make a model
    datasets: dict[str, Stored] = field(default_factory=dict)  # problems: train, eval; mining: hard
    trajectories: str | None = None  # RL stages, mining: their rollouts (Parquet)
    report: str | None = None  # evaluation: the report's directory
    evaluation: Evaluation | None = None
    mlflow_run_id: str | None = None  # set by the stage's task

    def links(self) -> dict[str, str]:
        """Where to find what the stage made, for its summary."""
        out = {"model": self.model.uri, "model_version": self.model.version} if self.model else {}
        out.update({name: d.uri for name, d in self.datasets.items()})
        if self.trajectories:
            out["trajectories"] = self.trajectories
        if self.report:
            out["report"] = self.report
        return {k: v for k, v in out.items() if v}
