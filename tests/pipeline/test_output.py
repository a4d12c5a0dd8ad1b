"""What a person reads: a run piped to a file or a CI log carries no terminal colour codes."""

import os
import subprocess
import sys

PROBE = """
from rstar.environment import apply_defaults

apply_defaults()  # the project's defaults, as every entry point sets them
import ray
from prefect import flow


@ray.remote
def work():
    print("from a ray worker", flush=True)


@flow(log_prints=True)
def run():
    ray.init(num_cpus=1, include_dashboard=False, object_store_memory=10**8, log_to_driver=True)
    ray.get(work.remote())
    print("from the flow")


run()
"""


def test_a_piped_run_has_no_colour_codes(prefect_api):
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RAY_ADDRESS", "RAY_COLOR_PREFIX", "PREFECT_LOGGING_COLORS")
    }
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        env={**env, "PREFECT_API_URL": prefect_api},
        capture_output=True,
        text=True,
        timeout=300,
        cwd=os.getcwd(),
    )
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    assert "from a ray worker" in text and "from the flow" in text
    assert "\x1b[" not in text, [line for line in text.splitlines() if "\x1b[" in line][:3]


def test_a_stage_summary_links_the_mlflow_ui_of_a_tracking_server(monkeypatch):
    """On an MLflow server the stage's artifact links the run's page (the UI is at the server's
    address); on a file store it names the store and the command that shows it."""
    from types import SimpleNamespace

    from rstar.pipeline.records import StageOutput
    from rstar.tracking import mlflow_log as ml
    from tasks.summary import summary_markdown

    run = SimpleNamespace(info=SimpleNamespace(experiment_id="7"))
    monkeypatch.setattr(ml, "client", lambda uri: SimpleNamespace(get_run=lambda run_id: run))
    out = StageOutput("rl1", {"accuracy": 0.5})
    served = summary_markdown(out, {"MLflow": ml.where("http://mlflow:5000/", "abc")})
    page = "http://mlflow:5000/#/experiments/7/runs/abc"
    assert f"- MLflow: [{page}]({page})" in served
    store = "sqlite:////x/m.db"
    local = summary_markdown(out, {"MLflow": ml.where(store, "abc")})
    assert f"`run abc in {store} (mlflow ui --backend-store-uri {store})`" in local
