"""Failing early and plainly: one run per storage root (a second run fails at once naming the
first; a killed holder leaves nothing stale: locally the OS lock dies with it, on S3 its lease
expires), a recipe error or a dead tracking server in one line."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rstar.storage import filesystem
from rstar.storage.lock import LOCK, RootBusy, check_free, hold_root


def test_a_second_run_on_a_local_root_fails_at_once_naming_the_first(tmp_path):
    root = str(tmp_path / "root")
    with hold_root(root, "flow run double-click-1"):
        start = time.monotonic()
        with (
            pytest.raises(
                RootBusy, match=r"in use by another run \(run flow run double-click-1, host"
            ),
            hold_root(root, "flow run double-click-2"),
        ):
            pass
        assert time.monotonic() - start < 1
    with hold_root(root, "flow run later") as killed:  # released: the next run takes it
        assert json.loads(Path(os.path.join(root, LOCK)).read_text())["run"] == "flow run later"
        assert killed is None  # the first ended cleanly: nothing of it to reconcile


def test_a_killed_holder_leaves_the_local_root_free(tmp_path):
    root = str(tmp_path / "root")
    code = (
        f"import sys, time; from rstar.storage.lock import hold_root\nwith hold_root({root!r}, "
        "'doomed', flow_run_id='f-1'):\n    print('held', flush=True); time.sleep(60)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(RootBusy, match="doomed"), hold_root(root, "second"):
        pass
    with pytest.raises(RootBusy, match="doomed"):
        check_free(root)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    check_free(root)  # free now, and the check (the CLI's, before Prefect starts) keeps the record
    with hold_root(root, "after the kill") as killed:
        # the killed holder is named, so what it left RUNNING can be marked (flows.reconcile)
        assert (
            killed["run"] == "doomed"
            and killed["flow_run_id"] == "f-1"
            and killed["pid"] == holder.pid
        )
    with hold_root(root, "after a clean end") as killed:
        assert killed is None


def test_an_s3_root_takes_a_lease_refuses_a_second_run_and_breaks_an_expired_one(s3):
    root = f"{s3}/locked"
    fs, base = filesystem(root)
    with hold_root(root, "first", lease_s=30) as killed:
        assert killed is None
        holder = json.loads(fs.cat_file(f"{base}/{LOCK}"))
        assert holder["run"] == "first" and holder["expires"] > time.time()
        with pytest.raises(RootBusy, match="run first"):
            with hold_root(root, "second", lease_s=30):
                pass
        with pytest.raises(RootBusy, match="run first"):
            check_free(root)
    assert not fs.exists(f"{base}/{LOCK}")  # released on exit
    # a holder that died: its lease is left behind, expired
    fs.pipe_file(
        f"{base}/{LOCK}",
        json.dumps({"run": "dead", "flow_run_id": "f-9", "expires": time.time() - 1}).encode(),
    )
    check_free(root)  # an expired lease is no obstacle
    with hold_root(root, "third", lease_s=30) as killed:
        assert json.loads(fs.cat_file(f"{base}/{LOCK}"))["run"] == "third"
        assert killed["flow_run_id"] == "f-9"


def test_the_cli_refuses_a_pipeline_on_a_root_another_run_holds(tmp_path):
    from typer.testing import CliRunner

    from flows.cli import app
    from tests.pipeline.conftest import write_recipe

    root = str(tmp_path / "root")
    path = write_recipe(str(tmp_path), "busy", root)
    with hold_root(root, "flow run the-first-click"):
        result = CliRunner().invoke(app, ["pipeline", "run", "--config", path])
    assert result.exit_code == 1
    assert (
        "in use by another run (run flow run the-first-click" in result.output
        and "Traceback" not in result.output
    )
    assert not os.path.exists(os.path.join(root, "models"))  # nothing of the second run was written


def test_a_recipe_error_is_one_line_before_prefect_starts(tmp_path):
    from typer.testing import CliRunner

    from flows.cli import app

    result = CliRunner().invoke(
        app, ["pipeline", "run", "--config", "configs/tiny.yaml", "--set", "rl.2.stepz=3"]
    )
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "rl.2.stepz: unknown key (did you mean 'steps'?)" in result.output


def test_a_recipe_is_checked_without_loading_torch_verl_prefect_or_ray():
    """The check is quick because it loads none of the heavy libraries (verl alone takes ~10 s
    to import): a fresh interpreter runs the CLI on a bad recipe and lists what it loaded."""
    import subprocess
    import sys

    probe = (
        "import sys\nfrom flows.cli import app\nprint('exit', app(['pipeline', 'run', '--set', "
        "'rl.2.stepz=3'], standalone_mode=False))\nprint(sorted(m for m in ('torch', 'verl', "
        "'prefect', 'ray', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.stdout.splitlines()[-2:] == ["exit 1", "[]"], out.stdout + out.stderr


def test_a_bad_input_file_is_one_line_and_debug_shows_the_traceback(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "qs.jsonl"
    path.write_text('{"question": "1+1?", "solution": "2"}\n')
    cmd = [
        sys.executable,
        "-m",
        "rstar.cli",
        "data",
        "curate",
        "--source",
        str(path),
        "--out",
        str(tmp_path / "k.parquet"),
    ]
    plain = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert plain.returncode == 1 and "Traceback" not in plain.stderr
    assert plain.stderr.strip().splitlines() == [
        f"error: {path}: no column 'problem' or 'answer' for the problem and answer (its columns: "
        f"question, solution); map yours as '{path}:problem=<column>,answer=<column>' or name a "
        f"preset (generic, dapo, openmathreasoning, project_euler, aops) as '{path}:<preset>'"
    ]
    debug = subprocess.run(
        cmd[:3] + ["--debug"] + cmd[3:], capture_output=True, text=True, timeout=120
    )
    assert (
        debug.returncode == 1
        and "Traceback" in debug.stderr
        and "rstar.data.io.DataError" in debug.stderr
    )


def test_a_dead_tracking_server_is_one_line_in_seconds(tmp_path):
    """MLflow's client retried for 4.5 minutes before it said the server was down."""
    from typer.testing import CliRunner

    from flows.cli import app
    from rstar.sandbox.process import free_port
    from tests.pipeline.conftest import write_recipe

    path = write_recipe(str(tmp_path), "dead-mlflow", str(tmp_path / "root"))
    dead = f"http://127.0.0.1:{free_port()}"
    start = time.monotonic()
    result = CliRunner().invoke(
        app, ["pipeline", "run", "--config", path, "--set", f"tracking.tracking_uri={dead}"]
    )
    assert result.exit_code == 1, result.output
    assert (
        f"MLflow tracking server {dead} does not answer" in result.output
        and "Traceback" not in result.output
    )
    assert time.monotonic() - start < 15


def test_the_flow_itself_refuses_a_busy_root(prefect_api, tmp_path):
    """A run started from the UI (no CLI check before it) fails at once too."""
    from flows.pipeline import pipeline
    from tests.pipeline.conftest import write_recipe

    root = str(tmp_path / "root")
    path = write_recipe(str(tmp_path), "busy-flow", root)
    with hold_root(root, "flow run the-first-click"):
        state = pipeline(path, return_state=True)
    assert state.is_failed() and "the-first-click" in str(state.message) + repr(
        state.result(raise_on_failure=False)
    )


def test_a_recipe_error_in_a_run_from_the_ui_is_one_line_without_a_traceback(prefect_api):
    """The flow itself (a run from the Run form has no CLI check before it): a Failed state whose
    message is the recipe check's line, and no traceback in the run's log."""
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    from flows.pipeline import pipeline

    state = pipeline("configs/tiny.yaml", {"rl3.stepz": 3}, return_state=True)
    assert state.is_failed()
    assert state.message == "configs/tiny.yaml: rl.2.stepz: unknown key (did you mean 'steps'?)"

    async def logs():
        async with get_client() as client:
            return await client.read_logs(
                LogFilter(flow_run_id=LogFilterFlowRunId(any_=[state.state_details.flow_run_id]))
            )

    assert not any("Traceback" in log.message for log in asyncio.run(logs()))


def test_an_error_retrying_cannot_fix_is_not_retried(prefect_api, tmp_path):
    """A shipped base whose manifest disagrees with the recipe: the base stage fails once (the
    recipe allows 2 retries), with the field named, instead of three times. (The recipe check
    refuses such a recipe before any stage; the stage is given it unchecked here.)"""
    from prefect import flow

    from rstar.pipeline.config import load_recipe
    from rstar.pipeline.records import StageInputs
    from rstar.tracking import mlflow_log as ml
    from tasks.stage import submit
    from tests.pipeline.conftest import write_recipe

    path = write_recipe(str(tmp_path), "no-retry", str(tmp_path / "root"))
    recipe = load_recipe(path, {"base.seed": 2, "retries.delay_s": 0}, check_inputs=False)
    uri = ml.absolute_uri(recipe.tracking.tracking_uri)
    parent = ml.start_run(uri, recipe.tracking.experiment, "pipeline:no-retry")

    @flow
    def base_only():
        return submit("base", recipe, StageInputs(), parent)

    state = base_only(return_state=True)
    assert state.is_failed()
    error = state.result(raise_on_failure=False)
    assert "seed" in str(error)  # the manifest field that differs (2 here, 1 shipped)
    runs = ml.client(uri).search_runs(
        [ml.client(uri).get_experiment_by_name(recipe.tracking.experiment).experiment_id],
        filter_string=f"tags.`{ml.STAGE}` = 'base'",
    )
    assert len(runs) == 1  # one attempt


def test_runs_left_running_by_a_killed_pipeline_are_marked_failed_by_the_next(tmp_path):
    from rstar.tracking import mlflow_log as ml

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    root, other = str(tmp_path / "root"), str(tmp_path / "other")
    parent = ml.start_run(uri, "exp", "pipeline:tiny", tags={ml.ROOT: root})  # killed: never ended
    stage = ml.start_run(uri, "exp", "rl1", parent=parent)
    # another root's: not ours
    elsewhere = ml.start_run(uri, "exp", "pipeline:tiny", tags={ml.ROOT: other})
    assert sorted(ml.fail_stale_runs(uri, "exp", root)) == sorted([parent, stage])
    c = ml.client(uri)
    assert [c.get_run(r).info.status for r in (parent, stage, elsewhere)] == [
        "FAILED",
        "FAILED",
        "RUNNING",
    ]
    assert "marked FAILED" in c.get_run(parent).data.tags["rstar.reconciled"]
    assert ml.fail_stale_runs(uri, "exp", root) == []


def test_concurrent_first_uses_of_a_fresh_sqlite_store_do_not_corrupt_it(tmp_path):
    """Two runs' first start_run on a fresh store died in MLflow's migration 3 times in 3."""
    uri = f"sqlite:///{tmp_path}/fresh.db"
    code = (
        f"import sys\nfrom rstar.tracking import mlflow_log as ml\nprint(ml.start_run({uri!r}, "
        "'exp', sys.argv[1]))"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, f"run{i}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(3)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e[-800:] for _, e in outs]
    from rstar.tracking import mlflow_log as ml

    runs = ml.client(uri).search_runs([ml.client(uri).get_experiment_by_name("exp").experiment_id])
    assert sorted(r.info.run_name for r in runs) == ["run0", "run1", "run2"]


@pytest.mark.parametrize(
    "setting, message",
    [
        # a storage root under a regular file: the lock, the first write, used to fail in 20 s
        # with a 116-line double traceback
        ("storage_root={file}/x", "storage_root {file}/x: {file} is a file, not a directory"),
        # a base setting the shipped base was not built with: it used to fail in the base stage
        (
            "base.pretrain_steps=20",
            "models/tiny-base was built from another recipe (pretrain_steps: built with 2400, "
            "recipe says 20)",
        ),
    ],
)
def test_a_root_or_base_that_cannot_be_used_is_one_line_before_prefect_starts(
    tmp_path, setting, message
):
    from typer.testing import CliRunner

    from flows.cli import app

    file = tmp_path / "a-file"
    file.write_text("")
    result = CliRunner().invoke(
        app,
        [
            "pipeline",
            "run",
            "--set",
            setting.format(file=file),
            "--set",
            f"tracking.tracking_uri=sqlite:///{tmp_path}/mlflow.db",
        ],
    )
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith("configs/tiny.yaml: ") and message.format(file=file) in line, line


def test_an_unwritable_prefect_home_is_one_line_in_seconds(tmp_path):
    """Prefect's local server waited two minutes for a database it could not create, then
    printed a traceback that did not name PREFECT_HOME."""
    from tests.pipeline.conftest import write_recipe

    path = write_recipe(str(tmp_path), "no-home", str(tmp_path / "root"))
    (tmp_path / "a-file").write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env["PREFECT_HOME"] = str(tmp_path / "a-file" / "home")
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "flows.cli", "pipeline", "run", "--config", path],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    assert f"PREFECT_HOME={tmp_path}/a-file/home cannot be written" in done.stderr
    assert "Traceback" not in done.stderr and time.monotonic() - start < 60


def test_a_missing_prefect_home_is_made(tmp_path):
    """Prefect does not make a home whose parent is missing; the check does."""
    home = tmp_path / "not" / "yet" / "home"
    done = subprocess.run(
        [sys.executable, "-c", "from rstar.environment import check_prefect_home as c; c()"],
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")},
            "PREFECT_HOME": str(home),
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert home.is_dir()
