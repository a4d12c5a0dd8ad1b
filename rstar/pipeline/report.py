"""What one pipeline run measured, as JSON (`rstar pipeline run --report-json`): each stage's
headline metrics and seconds, held-out accuracy per checkpoint, the recipe's time, the verdict.
The benchmarks (rstar.bench) build their tables from it."""

from __future__ import annotations

from rstar.eval.metrics import overall_accuracy
from rstar.pipeline.records import StageOutput
from rstar.pipeline.stage_table import trained_stages
from rstar.tracking import mlflow_log as ml


def stage_seconds(recipe, outs: dict[str, StageOutput]) -> dict[str, float]:
    """How long each stage's run took (the run that computed it, for a stage served from
    cache), from MLflow."""
    c = ml.client(recipe.tracking.tracking_uri)
    seconds = {}
    for stage, out in outs.items():
        if out.mlflow_run_id:
            info = c.get_run(out.mlflow_run_id).info
            seconds[stage] = (info.end_time - info.start_time) / 1000
    return seconds


def pipeline_report(recipe, outs: dict[str, StageOutput]) -> dict:
    """The run's report (the module's docstring says what it holds)."""
    seconds = stage_seconds(recipe, outs)
    report = {
        "metrics": {stage: out.metrics for stage, out in outs.items() if stage != "evaluate"},
        "seconds": seconds,
        "recipe_seconds": sum(seconds.get(s, 0.0) for s in trained_stages(recipe)),
    }
    if "evaluate" not in outs:  # a run stopped before it (--until)
        return report
    ev = outs["evaluate"].evaluation
    return {
        **report,
        "accuracy": {name: overall_accuracy(s) for name, s in ev.summaries.items()},
        "learnt": ev.learnt,
        "verdict": ev.verdict,
    }
