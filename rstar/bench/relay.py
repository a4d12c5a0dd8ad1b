"""`rstar sandbox bench-relay`: per-call latency through a sandbox head and its workers, with
each call answered as it ends (`relay: stream`, the default) against the whole batch answered
when its slowest call ends (`relay: batch`, and the client's whole-batch API).

A head that only dispatches and two worker nodes on loopback, as on a cluster; the calls come
in waves (a step's tool calls arrive in bursts, one per turn of many rollouts), most of them
quick and a few slow, the same calls in the same order for both relays. Both relays run in
one process, alternating, `rounds` times each: the figures of one relay are the rounds pooled.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import statistics
import time

import httpx

from rstar.bench.report import publish
from rstar.machine import cpu_model
from rstar.sandbox.client import SandboxClient
from rstar.sandbox.process import SandboxProcess
from rstar.sandbox.result import ExecRequest

RELAYS = ("batch", "stream")
WORKER_UIDS = (410_000, 420_000)


def workload(calls: int, slow_fraction: float, quick_s: float, slow_s: float, seed: int):
    """(request, is_slow) for `calls` calls, `slow_fraction` of them slow, seeded."""
    rng = random.Random(seed)
    out = []
    for i in range(calls):
        slow = rng.random() < slow_fraction
        code = f"import time\ntime.sleep({slow_s if slow else quick_s})\n{i}"
        out.append((ExecRequest(code), slow))
    return out


@contextlib.contextmanager
def head_and_workers(relay: str, slots: int, join_timeout_s: float = 60.0):
    """A dispatching head with `relay` and two worker nodes joined to it."""
    with contextlib.ExitStack() as stack:
        head = stack.enter_context(SandboxProcess("--no-local", "--relay", relay))
        for base in WORKER_UIDS:
            stack.enter_context(
                SandboxProcess(
                    "--executors", "1", "--slots", str(slots), "--uid-base", str(base),
                    "--join", head.url,
                )
            )  # fmt: skip
        deadline = time.monotonic() + join_timeout_s
        while sum(n["alive"] for n in httpx.get(f"{head.url}/health").json()["nodes"]) < 2:
            if time.monotonic() > deadline:
                raise TimeoutError(f"sandbox workers did not join the head {head.url}")
            time.sleep(0.2)
        yield head


async def _round(url: str, relay: str, calls: list, wave: int) -> tuple[list, float]:
    """Each call's (latency in seconds, is_slow), and the round's seconds."""
    async with SandboxClient(url, stream=relay == "stream") as client:
        loop = asyncio.get_running_loop()

        async def timed(req: ExecRequest, slow: bool) -> tuple[float, bool]:
            start = loop.time()
            result = await client.run_many([req])
            if not result[0].ok:
                raise RuntimeError(f"a benchmark call failed: {result[0].reason}")
            return loop.time() - start, slow

        started = loop.time()
        out = []
        for at in range(0, len(calls), wave):
            out += await asyncio.gather(*(timed(r, s) for r, s in calls[at : at + wave]))
        return out, loop.time() - started


def _ms(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return 1e3 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(
    calls: int = 2000,
    wave: int = 200,
    slow_fraction: float = 0.1,
    quick_s: float = 0.02,
    slow_s: float = 1.0,
    slots: int = 32,
    rounds: int = 2,
    seed: int = 0,
    out: str = "docs/benchmarks.md",
) -> dict[str, dict[str, float]]:
    """Measure both relays; print and write the section; return the figures per relay."""
    work = workload(calls, slow_fraction, quick_s, slow_s, seed)
    pooled: dict[str, list] = {r: [] for r in RELAYS}
    seconds: dict[str, list[float]] = {r: [] for r in RELAYS}
    for k in range(rounds):
        for relay in RELAYS:
            with head_and_workers(relay, slots) as head:
                latencies, took = asyncio.run(_round(head.url, relay, work, wave))
            pooled[relay] += latencies
            seconds[relay].append(took)
            print(f"round {k + 1}/{rounds} {relay}: {took:.1f} s", flush=True)  # noqa: T201
    figures = {}
    for relay in RELAYS:
        quick = [t for t, slow in pooled[relay] if not slow]
        slow = [t for t, slow in pooled[relay] if slow]
        figures[relay] = {
            "quick_p50_ms": _ms(quick, 0.5),
            "quick_p99_ms": _ms(quick, 0.99),
            "slow_p50_ms": _ms(slow, 0.5),
            "calls_per_s": calls / statistics.mean(seconds[relay]),
        }
    slow_count = sum(s for _, s in work)
    lines = [
        "## Sandbox relay: each call answered as it ends (`rstar sandbox bench-relay`)",
        "",
        f"{calls} calls in waves of {wave} through a head and two worker nodes ({slots} slots "
        f"each) on loopback: {calls - slow_count} quick ({quick_s:g} s of sleep) and "
        f"{slow_count} slow ({slow_s:g} s), seeded; both relays alternating, {rounds} rounds "
        f"each, pooled. Latency is from the client's call to its answer. {cpu_model()}, "
        f"{time.strftime('%Y-%m-%d')}.",
        "",
        "| relay | quick calls p50 (ms) | quick calls p99 (ms) | slow calls p50 (ms) | calls/s |",
        "|---|---|---|---|---|",
        *(
            f"| {relay} | {f['quick_p50_ms']:.0f} | {f['quick_p99_ms']:.0f} | "
            f"{f['slow_p50_ms']:.0f} | {f['calls_per_s']:.0f} |"
            for relay, f in figures.items()
        ),
        "",
        "`batch`: the client's batch and the head's batch to a worker are each answered when "
        "their slowest call ends (`relay: batch`, `SandboxClient(stream=False)`); `stream`: "
        "every call is answered as it ends (`POST /v1/execute/stream`), the default.",
    ]
    publish(out, "sandbox-relay", lines)
    return figures
