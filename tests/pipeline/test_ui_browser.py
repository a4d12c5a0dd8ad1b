"""The Prefect and MLflow UIs as a user meets them, in a real browser: Debian's headless Chromium
(installed by scripts/setup.sh) driven by Playwright. A Prefect server and `rstar serve` run as
they would for a user; the test opens the pipeline deployment, fills the Run form with a small
override, submits it, and watches the flow run finish with its progress and summary artifacts;
then it opens the MLflow UI on the store the run wrote and finds the headline on the parent run.
"""

import os
import shutil
import sys

from tests.pipeline.conftest import (
    final_flow_run_state,
    free_port,
    prefect_call,
    prefect_services,
    wait_for,
    write_recipe,
)

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


def test_a_run_from_the_prefect_form_and_its_headline_in_mlflow(shipped_sft, services, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    chromium = shutil.which("chromium")
    assert chromium, "Debian's chromium is missing: `make setup` installs it (apt-get)"
    bin_dir = os.path.dirname(sys.executable)
    recipe = write_recipe(str(tmp_path), "ui", str(tmp_path / "root"), shipped_sft)
    store = f"sqlite:///{tmp_path}/mlflow.db"

    port, env = prefect_services(services, recipe, "ui", tmp_path / "prefect")
    api = env["PREFECT_API_URL"]
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
            # the run is waited for through the API and its page opened once it is over: a
            # flow-run page left open re-renders as logs and states stream in, and so shared
            # the two cores with the stages it showed
            page.goto("about:blank")
            final_flow_run_state(api, run_id, 480)
            page.goto(f"http://127.0.0.1:{port}/runs/flow-run/{run_id}")
            # the verdict names the final state; a reduced recipe does not learn
            expect(page.get_by_text("Did not learn").first).to_be_visible(timeout=60_000)
            page.get_by_text("Artifacts", exact=True).click()
            for key in ("ui-summary", "ui-rl1-progress-rl1", "ui-evaluate"):
                expect(page.get_by_text(key, exact=True).first).to_be_visible()
        except Exception:
            page.screenshot(path=str(tmp_path / "prefect-failure.png"), full_page=True)
            raise

        params = prefect_call(api, f"/flow_runs/{run_id}")["parameters"]
        assert params["seed"] == 1  # what the form sent

        # the MLflow UI on the store the run wrote: the parent run's headline metric
        from rstar.tracking import mlflow_log as ml

        c = ml.client(store)
        experiment = c.get_experiment_by_name("rstar-tiny")
        (parent,) = c.search_runs(
            [experiment.experiment_id], filter_string=f"tags.`{ml.PIPELINE}` = 'root'"
        )
        mport = free_port()
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
        wait_for(f"http://127.0.0.1:{mport}/health", mlflow, "mlflow server")
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
