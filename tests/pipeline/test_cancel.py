"""Cancel from the Prefect UI, as a user does it: a run started from `rstar serve`'s deployment is
set Cancelling mid-stage (what the UI's Cancel button sends). It must end Cancelled without a
Crashed state on the way, its stage task Cancelled, the stage's Ray worker gone, and its MLflow
runs KILLED, not FAILED."""

import os
import time

from tests.pipeline.conftest import final_flow_run_state, prefect_services, until, write_recipe
from tests.pipeline.conftest import prefect_call as _call


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_cancel_mid_stage_ends_cancelled_and_killed(shipped_sft, services, tmp_path):
    from rstar.pipeline.config import load_recipe
    from rstar.pipeline.launch import pid_file
    from rstar.tracking import mlflow_log as ml

    path = write_recipe(str(tmp_path), "cancel", str(tmp_path / "root"), shipped_sft)
    _, env = prefect_services(services, path, "cancel", tmp_path / "prefect")
    api = env["PREFECT_API_URL"]
    deployment = _call(api, "/deployments/name/rstar-pipeline/cancel")
    # rl1 long enough to be cancelled in the middle
    run = _call(
        api,
        f"/deployments/{deployment['id']}/create_flow_run",
        {"parameters": {"rl_steps": [500, 1, 1]}},
    )

    def rl1_running():
        tasks = _call(api, "/task_runs/filter", {"flow_runs": {"id": {"any_": [run["id"]]}}})
        return next(
            (t for t in tasks if t["name"].startswith("rl1") and t["state_type"] == "RUNNING"),
            None,
        )

    rl1 = until("rl1 running", rl1_running, 300)
    worker = pid_file(load_recipe(path), "rl1")
    until("rl1's worker pid", lambda: os.path.exists(worker), 120)
    with open(worker) as f:
        pid = int(f.read())
    assert _alive(pid)
    time.sleep(3)  # in the middle of its steps

    _call(api, f"/flow_runs/{run['id']}/set_state", {"state": {"type": "CANCELLING"}})
    final = final_flow_run_state(api, run["id"], 120)
    history = [s["type"] for s in _call(api, f"/flow_run_states/?flow_run_id={run['id']}")]
    assert final["type"] == "CANCELLED", history
    assert "CRASHED" not in history, history
    task_state = _call(api, f"/task_runs/{rl1['id']}")["state"]
    assert task_state["type"] == "CANCELLED", task_state
    until("rl1's worker to stop", lambda: not _alive(pid), 60)

    c = ml.client(f"sqlite:///{tmp_path}/mlflow.db")
    experiment = c.get_experiment_by_name("rstar-tiny")
    runs = {r.info.run_name: r.info.status for r in c.search_runs([experiment.experiment_id])}
    assert runs["pipeline:cancel"] == "KILLED", runs
    assert runs["rl1"] == "KILLED", runs
    assert runs["sft"] == "FINISHED", runs
    serve_log = (tmp_path / "rstar-serve.log").read_text()
    assert "exit code" not in serve_log and "SIGTERM" not in serve_log, serve_log[-3000:]
