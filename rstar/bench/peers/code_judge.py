"""This project's sandbox against code-judge, the rStar2-Agent release's own sandbox, through
code-judge's API with one client for both: `/run/long-batch` (100 submissions a batch, 4 batches
in flight) for throughput, `/run` one call at a time for latency.

code-judge is not on PyPI. The bench takes a checkout and starts it as its README does, on
loopback in a scratch directory: a Redis server (the distribution's `redis-server`), the API
(uvicorn) and the workers (`run_workers.py`), with this project's interpreter (it has
code-judge's requirements: fastapi, uvicorn, redis, psutil, and sympy for the snippets), and
stops them by PID.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

from rstar.bench.sandbox import SYMPY, TRIVIAL
from rstar.sandbox.process import SandboxProcess, free_port

MEASURED_AT = "fbc5293"  # the code-judge commit the anchors were measured at
GET_IT = f"git clone https://github.com/0xWJ/code-judge && git -C code-judge checkout {MEASURED_AT}"
# trivial calls/s over code-judge's; ours, through its API
TARGETS = {"throughput_x": 20.0, "p50_ms": 3.0}
PER_BATCH, IN_FLIGHT = 100, 4


@dataclass
class Result:
    system: str
    trivial_per_s: float
    sympy_per_s: float
    p50_ms: float


def _submission(code: str) -> dict:
    return {"type": "python", "solution": code, "input": "", "expected_output": None}


async def _throughput(client, url: str, code: str, calls: int) -> float:
    """Calls per second through `/run/long-batch`, every call checked to have run."""
    gate = asyncio.Semaphore(IN_FLIGHT)

    async def batch(n: int) -> None:
        async with gate:
            r = await client.post(
                f"{url}/run/long-batch",
                json={"type": "batch", "submissions": [_submission(code)] * n},
            )
            r.raise_for_status()
            failed = [x for x in r.json()["results"] if not x["run_success"]]
            if failed:
                raise RuntimeError(f"{url}: {len(failed)} of {n} calls did not run: {failed[0]}")

    start = time.perf_counter()
    await asyncio.gather(*(batch(min(PER_BATCH, calls - i)) for i in range(0, calls, PER_BATCH)))
    return calls / (time.perf_counter() - start)


async def _p50_ms(client, url: str, calls: int) -> float:
    latencies = []
    for _ in range(calls):
        start = time.perf_counter()
        r = await client.post(f"{url}/run", json=_submission(TRIVIAL))
        r.raise_for_status()
        latencies.append(time.perf_counter() - start)
    return statistics.median(latencies) * 1e3


async def measure(system: str, url: str, trivial: int, sympy: int, single: int) -> Result:
    import httpx

    async with httpx.AsyncClient(timeout=600) as client:
        await _throughput(client, url, TRIVIAL, min(trivial, 200))  # warm-up: interpreters, imports
        await _throughput(client, url, SYMPY, min(sympy, 20))
        p50 = await _p50_ms(client, url, single)
        return Result(
            system,
            await _throughput(client, url, TRIVIAL, trivial),
            await _throughput(client, url, SYMPY, sympy),
            p50,
        )


def _wait_http(url: str, proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"{' '.join(proc.args[:3])} exited with {proc.returncode} during start-up"
            )
        try:
            urllib.request.urlopen(url, timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"{url} did not answer within {timeout_s:.0f} s")


@contextmanager
def _process(cmd: list[str], **kw):
    """A child in its own process group, stopped (group and all) on exit."""
    proc = subprocess.Popen(
        cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kw
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@contextmanager
def code_judge(checkout: str, workers: int):
    """code-judge from `checkout` on loopback; yields its URL."""
    redis = shutil.which("redis-server")
    if redis is None:
        raise FileNotFoundError(
            "code-judge needs a Redis server: install the distribution's package (Debian: apt-get "
            "install redis-server)"
        )
    if not os.path.isfile(os.path.join(checkout, "app", "main.py")):
        raise FileNotFoundError(
            f"{checkout} is not a code-judge checkout (no app/main.py); get one: {GET_IT}"
        )
    with tempfile.TemporaryDirectory(prefix="code-judge-") as scratch, ExitStack() as stack:
        redis_port, api_port = free_port(), free_port()
        stack.enter_context(
            _process(
                [
                    redis,
                    "--bind",
                    "127.0.0.1",
                    "--port",
                    str(redis_port),
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                    scratch,
                ]
            )
        )
        env = {
            **os.environ,
            "REDIS_URI": f"redis://127.0.0.1:{redis_port}",
            "MAX_WORKERS": str(workers),
            "PYTHON_EXECUTOR_PATH": sys.executable,
            "TMPDIR": scratch,
        }
        stack.enter_context(_process([sys.executable, "run_workers.py"], cwd=checkout, env=env))
        api = stack.enter_context(
            _process(
                [
                    sys.executable,
                    "-m",
                    "uvicorn",
                    "app.main:app",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(api_port),
                    "--workers",
                    str(workers),
                ],
                cwd=checkout,
                env=env,
            )
        )
        url = f"http://127.0.0.1:{api_port}"
        _wait_http(f"{url}/ping", api)
        yield url


def commit_of(checkout: str) -> str:
    out = subprocess.run(
        ["git", "-C", checkout, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return out.stdout.strip() or "unknown"


def compare(
    checkout: str | None, trivial: int = 2000, sympy: int = 200, single: int = 200, workers: int = 2
) -> list[Result]:
    """This project's sandbox service, then code-judge when a checkout is given."""
    results = []
    with SandboxProcess() as ours:
        results.append(
            asyncio.run(measure("rstar sandbox (code-judge API)", ours.url, trivial, sympy, single))
        )
    if checkout:
        with code_judge(checkout, workers) as url:
            results.append(
                asyncio.run(
                    measure(f"code-judge {commit_of(checkout)}", url, trivial, sympy, single)
                )
            )
    return results


def report(results: list[Result], checkout: str | None, workers: int = 2) -> list[str]:
    lines = [
        "### The sandbox against code-judge, through code-judge's API",
        "",
        f"One httpx client for both: `/run/long-batch` ({PER_BATCH} a batch, {IN_FLIGHT} in "
        f"flight) for calls/s, `/run` one at a time for p50. Trivial: `{TRIVIAL}`; sympy: "
        f"`{SYMPY}`.",
        "",
        "| system | trivial calls/s | sympy calls/s | p50 ms, one in flight |",
        "|---|---|---|---|",
        *(
            f"| {r.system} | {r.trivial_per_s:,.1f} | {r.sympy_per_s:,.1f} | {r.p50_ms:.1f} |"
            for r in results
        ),
        "",
    ]
    ours = results[0]
    if len(results) == 1:
        lines.append(
            "code-judge: not measured in this run (no `--code-judge` checkout; get one: "
            f"`{GET_IT}`)."
        )
        return lines
    theirs = results[1]
    ratio = ours.trivial_per_s / theirs.trivial_per_s
    lines += [
        f"code-judge as its README runs it without Docker: Redis, the API (uvicorn, {workers} "
        f"workers) and {workers} judge workers on loopback, this project's interpreter for the "
        f"snippets (measured at {MEASURED_AT} in the issue).",
        "",
        f"Targets: trivial calls/s at least {TARGETS['throughput_x']:.0f}x code-judge's: "
        f"{ratio:.1f}x, {'met' if ratio >= TARGETS['throughput_x'] else 'NOT met'}; p50 through "
        f"code-judge's API at most {TARGETS['p50_ms']:.0f} ms: {ours.p50_ms:.1f} ms, "
        f"{'met' if ours.p50_ms <= TARGETS['p50_ms'] else 'NOT met'}; sympy "
        f"{ours.sympy_per_s / theirs.sympy_per_s:.0f}x, p50 {theirs.p50_ms / ours.p50_ms:.1f}x "
        "lower.",
    ]
    return lines
