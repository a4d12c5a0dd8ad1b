"""What a person sees of a finished stage in the Prefect UI: a markdown artifact with its
headline metrics, where its outputs are and, for the evaluation, the table and the verdict."""

from __future__ import annotations

from rstar.pipeline.records import StageOutput


def artifact_key(pipeline: str, stage: str) -> str:
    """The stage's Prefect artifact key (keys allow lowercase letters, digits and dashes)."""
    return f"{pipeline}-{stage}".lower().replace("_", "-")


def as_markdown(place: str) -> str:
    """A web address as a link (the MLflow UI of a tracking server), anything else as code."""
    return f"[{place}]({place})" if place.startswith(("http://", "https://")) else f"`{place}`"


def summary_markdown(out: StageOutput, links: dict) -> str:
    lines = [f"# {out.stage}", "", "| metric | value |", "|---|---|"]
    lines += [
        f"| {k} | {v:.4g} |" if isinstance(v, float) else f"| {k} | {v} |"
        for k, v in out.metrics.items()
    ]
    lines += ["", *(f"- {k}: {as_markdown(v)}" for k, v in links.items())]
    if out.evaluation:
        lines += ["", out.evaluation.table]
        if out.evaluation.verdict:
            lines += ["", "## Did it learn?", "", *(f"- {line}" for line in out.evaluation.verdict)]
    return "\n".join(lines) + "\n"
