"""The Prefect and MLflow UIs as a user meets them, in a real browser: Debian's headless Chromium
(installed by scripts/setup.sh) driven by Playwright. A Prefect server and `rstar serve` run as
they would for a user; the test opens the pipeline deployment, fills the Run form with a small
override, submits it, and watches the flow run finish with its progress and summary artifacts;
then it opens the MLflow UI on the store the run wrote and finds the headline on the parent run.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.pipeline.conftest import write_recipe

# as root, in a container, with no network beyond loopback: no sandbox, no GPU, no background
# connections (they would be refused, many at a time)
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(url: str, proc: subprocess.Popen, what: str, timeout_s: float = 180) -> None:
    """Until `url` answers 200; an error naming `what` if its process ends or time runs out."""
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: {url} did not answer within {timeout_s:.0f} s")
        time.sleep(1)


@pytest.fixture
def services(tmp_path):
    """Start processes in their own sessions; stop exactly those at the end."""
    started: list[subprocess.Popen] = []

    def start(args: list[str], env: dict, name: str) -> subprocess.Popen:
        with open(tmp_path / f"{name}.log", "w") as log:  # the child keeps its own copy
            proc = subprocess.Popen(
                args, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in started:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def test_a_run_from_the_prefect_form_and_its_headline_in_mlflow(shipped_sft, services, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    chromium = shutil.which("chromium")
    assert chromium, "Debian's chromium is missing: `make setup` installs it (apt-get)"
    bin_dir = os.path.dirname(sys.executable)
    recipe = write_recipe(str(tmp_path), "ui", str(tmp_path / "root"), shipped_sft)
    store = f"sqlite:///{tmp_path}/mlflow.db"

    port = _port()
    api = f"http://127.0.0.1:{port}/api"
    env = {
        **os.environ,
        "PREFECT_HOME": str(tmp_path / "prefect"),
        "PREFECT_API_URL": api,
        "PREFECT_UI_API_URL": api,  # what the UI's pages call (its default is port 4200)
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    }
    server = services(
        [f"{bin_dir}/prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env,
        "prefect-server",
    )
    _wait_for(f"{api}/health", server, "prefect server")
    serve = services(
        [sys.executable, "-m", "flows.cli", "serve", "--config", recipe, "--name", "ui"],
        env,
        "rstar-serve",
    )
    _wait_for(f"{api}/deployments/name/rstar-pipeline/ui", serve, "rstar serve")

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        try:
            # the deployment, Run -> Custom run, the form with its descriptions
            page.goto(f"http://127.0.0.1:{port}/deployments")
            page.get_by_role("link", name="ui", exact=True).click()
            page.get_by_role("button", name="Run", exact=True).click()
            page.get_by_text("Custom run").click()
            expect(page.get_by_text("Steps of each RL stage in order")).to_be_visible()
            page.locator(".flow-run-name-input input").fill("from-the-form")
            seed = page.locator(".schema-form-property").filter(has_text="seed (Optional)")
            seed.locator("input[type=number]").fill("1")
            page.get_by_role("button", name="Submit").click()
            # back on the deployment, the run is listed: open it
            page.get_by_role("link", name="from-the-form").first.click()
            page.wait_for_url("**/runs/flow-run/**")
            run_id = page.url.split("/runs/flow-run/")[1].split("?")[0].split("/")[0]
            # the verdict names the final state; a reduced recipe does not learn
            expect(page.get_by_text("Did not learn").first).to_be_visible(timeout=480_000)
            page.get_by_text("Artifacts", exact=True).click()
            for key in ("ui-summary", "ui-rl1-progress-rl1", "ui-evaluate"):
                expect(page.get_by_text(key, exact=True).first).to_be_visible()
        except Exception:
            page.screenshot(path=str(tmp_path / "prefect-failure.png"), full_page=True)
            raise

        with urllib.request.urlopen(f"{api}/flow_runs/{run_id}") as r:
            params = json.load(r)["parameters"]
        assert params["seed"] == 1  # what the form sent

        # the MLflow UI on the store the run wrote: the parent run's headline metric
        from rstar.tracking import mlflow_log as ml

        c = ml.client(store)
        experiment = c.get_experiment_by_name("rstar-tiny")
        (parent,) = c.search_runs(
            [experiment.experiment_id], filter_string=f"tags.`{ml.PIPELINE}` = 'root'"
        )
        mport = _port()
        mlflow = services(
            [
                f"{bin_dir}/mlflow",
                "server",
                "--backend-store-uri",
                store,
                "--host",
                "127.0.0.1",
                "--port",
                str(mport),
                "--workers",
                "1",
            ],
            env,
            "mlflow-server",
        )
        _wait_for(f"http://127.0.0.1:{mport}/health", mlflow, "mlflow server")
        try:
            page.goto(
                f"http://127.0.0.1:{mport}/#/experiments/{experiment.experiment_id}/runs/"
                f"{parent.info.run_id}"
            )
            expect(page.get_by_text("heldout/rl3").first).to_be_visible(timeout=60_000)
        except Exception:
            page.screenshot(path=str(tmp_path / "mlflow-failure.png"), full_page=True)
            raise
        finally:
            browser.close()
