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
