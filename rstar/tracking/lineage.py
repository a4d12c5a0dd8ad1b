"""`rstar lineage`: the chain data -> base -> SFT -> RL stages -> evaluation of one model
version, read from MLflow alone (the datasets the problems stage wrote, model-version tags, the
runs behind them, the datasets they read and wrote with digests, and the evaluation runs that
name the version)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from rstar.tracking.mlflow_log import (
    DIGEST,
    EVAL_LABEL,
    EVALUATES,
    INPUT_MODEL,
    OUTPUT,
    PIPELINE,
    STAGE,
    client,
)


@dataclass
class Link:
    version: str  # "name/version"
    stage: str
    run_id: str
    source: str
    digest: str
    datasets: list[dict] = field(default_factory=list)  # name, digest, context, source
    metrics: dict = field(default_factory=dict)


@dataclass
class Lineage:
    data: list[dict]  # the problems stage's datasets (train and held-out, with digests)
    chain: list[Link]  # oldest (base) first, the asked-for version last
    # per run evaluating it: run_id, label, date, settings, data, held_out, avg pass@1 metrics
    evaluations: list[dict]


def _split(version: str, default_name: str | None) -> tuple[str, str]:
    name, sep, number = version.rpartition("/")
    if not sep:
        if not default_name:
            raise ValueError(f"{version!r}: give MODEL_NAME/VERSION")
        return default_name, version
    return name, number


def lineage(tracking_uri: str, version: str, default_name: str | None = None) -> Lineage:
    c = client(tracking_uri)
    chain: list[Link] = []
    seen = set()
    current: str | None = "/".join(_split(version, default_name))
    while current and current not in seen:
        seen.add(current)
        name, number = _split(current, None)
        mv = c.get_model_version(name, number)
        run = c.get_run(mv.run_id)
        chain.append(
            Link(
                current,
                mv.tags.get(STAGE, "?"),
                mv.run_id,
                mv.source,
                mv.tags.get(DIGEST, ""),
                _datasets(run),
                dict(run.data.metrics),
            )
        )
        current = mv.tags.get(INPUT_MODEL)
    chain.reverse()
    exp_ids = [e.experiment_id for e in c.search_experiments()]
    # the data the chain trained on: the problems stage of the pipeline run that made its first
    # model
    first = c.get_run(chain[0].run_id)
    pipeline = first.data.tags.get(PIPELINE, "")
    made = c.search_runs(
        [first.info.experiment_id],
        f"tags.`{STAGE}` = 'problems' and tags.`{PIPELINE}` = '{pipeline}'",
    )
    data = _datasets(made[0]) if made else []
    target = chain[-1].version
    tag = f"{EVALUATES}.{target}"  # its value: the model's name inside that evaluation
    runs = c.search_runs(exp_ids, filter_string=f"tags.`{tag}` LIKE '%'") if exp_ids else []
    evaluations = [
        {
            "run_id": r.info.run_id,
            "label": r.data.tags.get(EVAL_LABEL, r.info.run_name),
            "date": time.strftime("%Y-%m-%d %H:%M", time.localtime(r.info.start_time / 1000)),
            "settings": {
                k.split(".", 1)[1]: v
                for k, v in sorted(r.data.params.items())
                if k.split(".", 1)[0] == "eval"
            },
            "data": [
                f"{d.dataset.name} digest {d.dataset.digest}" for d in r.inputs.dataset_inputs
            ],
            "held_out": _held_out(r),
            "metrics": {
                k.split("/", 2)[2]: v
                for k, v in r.data.metrics.items()
                if k.startswith(f"eval/{r.data.tags[tag]}/") and "avg_pass" in k
            },
        }
        for r in sorted(runs, key=lambda r: r.info.start_time)
    ]
    return Lineage(data, chain, evaluations)


def _held_out(run) -> dict | None:
    """The held-out set an evaluation run read: {"uri", "digest"}."""
    import json

    for d in run.inputs.dataset_inputs:
        if d.dataset.name == "eval_problems":
            return {"uri": json.loads(d.dataset.source)["uri"], "digest": d.dataset.digest}
    return None


def _datasets(run) -> list[dict]:
    """What the run read (its dataset inputs) and wrote (its `OUTPUT` tags)."""
    import json

    read = [
        {
            "name": d.dataset.name,
            "digest": d.dataset.digest,
            "source": d.dataset.source,
            "context": next((t.value for t in d.tags if t.key == "mlflow.data.context"), ""),
        }
        for d in run.inputs.dataset_inputs
    ]
    wrote = [
        {
            "name": key[len(OUTPUT) :],
            "digest": json.loads(value)["digest"],
            "source": json.dumps({"uri": json.loads(value)["uri"]}),
            "context": "output",
        }
        for key, value in sorted(run.data.tags.items())
        if key.startswith(OUTPUT)
    ]
    return read + wrote


def format_lineage(lin: Lineage) -> str:
    lines = [
        f"   data      dataset {d['name']} digest {d['digest']} {d['source']}" for d in lin.data
    ]
    for i, link in enumerate(lin.chain):
        arrow = "   " if i == 0 and not lin.data else "-> "
        lines.append(
            f"{arrow}{link.stage:<9} {link.version:<16} run {link.run_id[:12]}  digest "
            f"{link.digest}  {link.source}"
        )
        for d in link.datasets:
            lines.append(
                f"       {d['context']:<8} dataset {d['name']} digest {d['digest']} {d['source']}"
            )
    for ev in lin.evaluations:
        scores = ", ".join(f"{k}={v:.3f}" for k, v in sorted(ev["metrics"].items()))
        lines.append(
            f"-> evaluation {ev['label']} {ev['date']} run {ev['run_id'][:12]}: "
            f"{scores or 'no scores'}"
        )
        lines.append("       settings " + " ".join(f"{k}={v}" for k, v in ev["settings"].items()))
        lines += [f"       on {d}" for d in ev["data"]]
    if not lin.evaluations:
        lines.append("   (no evaluation run names this version yet)")
    return "\n".join(lines)
