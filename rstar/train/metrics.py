"""An RL step's metrics, one definition and one namespace for both trainers, so that a local
stage's curves and a verl stage's overlay in MLflow (CleanRL's habit: a prefix per kind):

- `rollout/`: what the policy sampled (accuracy, reward, lengths, tool calls and errors, the
  sandbox's own failures, truncation, format violations, entropy where the engine gives it);
- `roc/`: what RoC kept and the tool-error rate inside correct trajectories, among all sampled
  (the paper's Fig. 4 quantity) and among those kept, with the counts behind each rate;
- `losses/`: the update (the local trainer's; verl logs its own under `actor/`);
- `charts/`: learning rate, throughput and the step's phases in seconds.

Both trainers compute the step's rollout and RoC figures with `summarize_step` over the step's
trajectory rows (the local trainer's records; verl's `rstar.train.verl_trajectories` rows).
"""

from __future__ import annotations

from rstar.rollout.runner import summarize, tool_error_rate

LOSSES = ("loss", "clip_fraction", "grad_norm", "optimizer_steps")
CHARTS = ("lr", "tokens_per_s")


def summarize_step(records: list[dict], kept: list[dict]) -> dict:
    """Rollout metrics plus the tool-error rate inside correct trajectories: among all sampled
    (what the policy does: the paper's measure, which RoC is meant to drive down) and among
    those RoC kept for the update (lower by selection alone)."""
    metrics = {k: v for k, v in summarize(records).items() if k != "finish_reasons"}
    for name, rows in (("positive", records), ("positive_kept", kept)):
        rows = [r for r in rows if r["reward"] > 0]
        metrics[f"tool_error_rate_{name}"] = tool_error_rate(rows)
        # the counts behind the rate, so that rates over several steps or seeds can be pooled
        metrics[f"tool_calls_{name}"] = sum(r["num_tool_calls"] for r in rows)
        metrics[f"tool_errors_{name}"] = sum(r["num_tool_errors"] for r in rows)
    metrics["kept"] = len(kept)
    return metrics


def kind(name: str) -> str:
    """The namespace of a step metric named as `summarize_step` and the local trainer name it."""
    if name == "kept" or name.endswith(("_positive", "_positive_kept")):
        return "roc"
    if name in LOSSES:
        return "losses"
    if name in CHARTS or name.startswith("time_"):
        return "charts"
    return "rollout"


def namespaced(metrics: dict) -> dict[str, float]:
    """`metrics` (a step's, by their plain names) under their namespaces, numbers only."""
    return {
        f"{kind(k)}/{k}": v
        for k, v in metrics.items()
        if k != "step" and isinstance(v, int | float) and not isinstance(v, bool)
    }
