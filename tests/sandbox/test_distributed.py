"""Resilience: calls survive a dead executor, a dead worker node, and a service that is not up yet;
the client batches, bounds what it has in flight, and honours deadlines."""

import asyncio
import os
import signal
import threading
import time

import httpx
import pytest

from rstar.sandbox.client import SandboxClient
from rstar.sandbox.process import SandboxProcess, free_port
from rstar.sandbox.result import ExecRequest, ExecResult, Status
from rstar.sandbox.service import SandboxService
from tests.sandbox.conftest import small_config, wait_until_gone


async def test_call_survives_its_executor_dying():
    async with SandboxService(small_config(uid_base=350_000, warm_executors=0)) as sb:
        executor = sb.nodes[0].pool.executors["lean"][0]
        call = asyncio.create_task(sb.run("import time\ntime.sleep(1.0)\nprint('done')"))
        await asyncio.sleep(0.4)
        os.kill(executor.proc.pid, signal.SIGKILL)
        r = await call
        assert r.status is Status.OK and r.stdout == "done\n"
        assert r.attempts == 2
        assert sb.health()["nodes"][0]["executor_restarts"] == 1
        assert (await sb.run("'after restart'")).value == "'after restart'"
    assert wait_until_gone(350_000, 350_000 + 12) == []


@pytest.fixture(scope="module")
def cluster():
    """A head that only dispatches, and two worker nodes on loopback that join it."""
    with SandboxProcess("--no-local", "--batch-size", "8") as head:
        workers = [
            SandboxProcess(
                "--executors", "1", "--slots", "4", "--uid-base", str(base), "--join", head.url
            )
            for base in (360_000, 370_000)
        ]
        for w in workers:
            w.start()
        deadline = time.monotonic() + 60
        while sum(n["alive"] for n in httpx.get(f"{head.url}/health").json()["nodes"]) < 2:
            assert time.monotonic() < deadline, "workers did not join the head"
            time.sleep(0.2)
        yield head, workers
        for w in workers:
            w.stop()


async def test_two_worker_nodes_share_the_load(cluster):
    head, workers = cluster
    async with SandboxClient(head.url, batch_size=8) as client:
        results = await client.run_many(
            [ExecRequest(f"import time\ntime.sleep(0.05)\n{i}") for i in range(64)]
        )
    assert [r.value for r in results] == [str(i) for i in range(64)]
    assert {r.extra["node"] for r in results} == {w.url for w in workers}


async def test_a_slow_call_holds_no_other_call_of_its_batch(cluster):
    """Calls are answered as they finish, through the client's batch and the head's relay to a
    worker alike: the quick calls of a batch that also holds a slow one come back long before
    it (with whole batches answered at once, every call waited for the slowest)."""
    head, _ = cluster
    loop = asyncio.get_running_loop()
    async with SandboxClient(head.url, batch_size=8, batch_window_ms=50) as client:
        start = loop.time()

        async def timed(code: str) -> float:
            result = await client.run(code)
            assert result.ok, result
            return loop.time() - start

        slow, *quick = await asyncio.gather(
            timed("import time\ntime.sleep(3)"),
            *(timed(f"import time\ntime.sleep(0.05)\n{i}") for i in range(7)),
        )
    assert slow >= 3.0
    assert max(quick) < 1.5, quick


async def test_a_node_lost_mid_stream_keeps_what_it_answered_and_the_rest_runs_elsewhere():
    from rstar.sandbox.service import NodeLost

    class AnswersOneThenDies:
        name, capacity, inflight, alive = "flaky", 1000, 0, True  # picked first: most room

        async def start(self): ...

        async def close(self): ...

        def describe(self):
            return {"name": self.name, "alive": self.alive}

        async def run_stream(self, reqs, deliver):
            deliver(0, ExecResult(status=Status.OK, stdout="answered before the loss"))
            raise NodeLost("flaky: connection reset")

    async with SandboxService(small_config(uid_base=395_000, batch_window_ms=200)) as sb:
        flaky = AnswersOneThenDies()
        sb.nodes.insert(0, flaky)
        results = await sb.run_many([ExecRequest(f"{i} * 2") for i in range(4)])
    assert results[0].stdout == "answered before the loss" and results[0].attempts == 1
    assert [r.value for r in results[1:]] == ["2", "4", "6"]
    assert {r.extra["node"] for r in results[1:]} == {"local"}
    assert [r.attempts for r in results[1:]] == [2, 2, 2]
    assert not flaky.alive and flaky.inflight == 0


async def test_a_worker_that_holds_its_calls_without_answering_is_left_naming_it():
    """A node that keeps the connection open and never answers (hung, not dead) loses its
    calls after `node_silence_s`; they go back on the queue, and after `max_attempts` end
    with a status naming the node, instead of holding the head's send worker for ever."""
    from aiohttp import web

    async def health(_):
        return web.json_response({"status": "ok", "capacity": 8})

    async def never_answer(_):
        await asyncio.sleep(3600)

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_post("/v1/execute/stream", never_answer)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    hung = f"http://127.0.0.1:{port}"
    try:
        cfg = small_config(node_silence_s=0.5, max_attempts=2)
        async with SandboxService(cfg, local=False, remotes=[hung]) as sb:
            result = await asyncio.wait_for(sb.run("1 + 1"), 30)
    finally:
        await runner.cleanup()
    assert result.status is Status.KILLED and result.attempts == 2
    assert "lost 2 times with its node" in result.reason and hung in result.reason


async def test_killing_a_worker_mid_batch_loses_no_call(cluster):
    head, (doomed, survivor) = cluster
    n = 96
    async with SandboxClient(head.url, batch_size=8) as client:
        calls = asyncio.create_task(
            client.run_many(
                [ExecRequest(f"import time\ntime.sleep(0.1)\nprint({i})") for i in range(n)]
            )
        )
        await asyncio.sleep(0.6)
        doomed.kill()
        results = await calls
    assert [r.status for r in results] == [Status.OK] * n
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(n)]  # none lost, none mixed up
    assert any(r.attempts > 1 for r in results)  # some were re-queued from the dead node
    stats = httpx.get(f"{head.url}/stats").json()
    assert stats["requeued"] > 0 and stats["nodes_alive"] == 1
    assert wait_until_gone(360_000, 360_000 + 8) == []  # the dead node's calls died with it


async def test_client_batches_concurrent_calls():
    with SandboxProcess("--executors", "1", "--slots", "4", "--uid-base", "380000") as server:
        async with SandboxClient(server.url, batch_size=16, batch_window_ms=50) as client:
            results = await asyncio.gather(*(client.run(f"{i} + 1") for i in range(48)))
            assert [r.value for r in results] == [str(i + 1) for i in range(48)]
            assert client.batches_sent == 3

        async with SandboxClient(server.url, max_inflight=2) as client:  # back-pressure
            start = time.monotonic()
            results = await client.run_many([ExecRequest("import time\ntime.sleep(0.3)")] * 6)
            assert all(r.ok for r in results)
            assert time.monotonic() - start >= 0.85  # three waves of two, never six at once

        async with SandboxClient(server.url) as client:  # a per-call deadline
            start = time.monotonic()
            r = await client.run("import time\ntime.sleep(5)", deadline_s=0.5)
            assert r.status is Status.TIMEOUT and "client deadline" in r.reason
            assert time.monotonic() - start < 2.0


async def test_client_retries_until_the_service_is_up():
    port = free_port()
    server = SandboxProcess("--executors", "1", "--slots", "2", "--uid-base", "390000", port=port)
    starter = threading.Timer(0.5, server.start)
    starter.start()
    try:
        async with SandboxClient(server.url, retry_for_s=60, backoff_s=0.5) as client:
            r = await client.run("'made it'")
        assert r.status is Status.OK and r.value == "'made it'"
        assert r.attempts > 1
    finally:
        starter.join()
        server.stop()


async def test_client_gives_up_with_a_clear_status():
    async with SandboxClient(
        f"http://127.0.0.1:{free_port()}", retry_for_s=0.3, backoff_s=0.05
    ) as client:
        r = await client.run("1")
    assert r.status is Status.REJECTED and "unreachable for 0.3s" in r.reason


async def test_a_restarted_service_loses_no_call_that_still_has_time():
    """A service killed mid-stream and back on its port seconds later: every call with a
    deadline longer than the outage comes back from the service, none "unreachable" (a fixed
    4 tries with 0.2 s doubling gave up after 1.5-4.5 s, losing calls that had 20 s left)."""
    port = free_port()
    first = SandboxProcess(
        "--executors", "1", "--slots", "4", "--uid-base", "391000", port=port
    ).start()
    second = SandboxProcess("--executors", "1", "--slots", "4", "--uid-base", "391500", port=port)
    async with SandboxClient(first.url, batch_size=8, backoff_s=0.2) as client:
        assert (await client.run("1")).ok
        first.kill()
        restart = threading.Timer(5.0, second.start)  # down for longer than 4 doubling tries take
        restart.start()
        try:
            results = await client.run_many(
                [ExecRequest(f"{i}*2") for i in range(20)], deadline_s=60
            )
        finally:
            restart.join()
    try:
        assert [r.status for r in results] == [Status.OK] * 20, [
            r.reason for r in results if not r.ok
        ][:3]
        assert [r.value for r in results] == [str(i * 2) for i in range(20)]
        assert max(r.attempts for r in results) > 4
    finally:
        second.stop()


@pytest.fixture
def worker_host():
    """A second host for the test: a network namespace with its own address on a bridge to this
    host (rstar.pipeline.hosts); removed afterwards."""
    from rstar.pipeline.hosts import Hosts

    with Hosts(1) as hosts:
        yield hosts.netns(0), hosts.here, hosts.address(0)


async def test_a_worker_bound_to_every_interface_joins_under_an_address_the_head_can_call(
    worker_host,
):
    """The cluster's layout on two hosts: a head that only dispatches answers /health with 503
    (and the RL stage's pre-check fails naming it) until a worker bound to 0.0.0.0 on another
    host joins; the worker is listed under its own address, not 0.0.0.0, and runs the calls."""
    import subprocess
    import sys

    from rstar.sandbox.client import SandboxUnreachable, check_health

    ns, host_ip, worker_ip = worker_host
    with SandboxProcess("--no-local", host=host_ip) as head:
        down = httpx.get(f"{head.url}/health")
        assert down.status_code == 503 and down.json()["status"] == "down"
        with pytest.raises(SandboxUnreachable, match=r"HTTP 503: status down, 0 node\(s\)"):
            check_health(head.url)
        command = [sys.executable, "-m", "rstar.cli", "sandbox", "serve", "--host", "0.0.0.0"]
        command += ["--port", "8081", "--join", head.url, "--executors", "1", "--slots", "2"]
        command += ["--uid-base", "380000"]
        worker = subprocess.Popen(["ip", "netns", "exec", ns, *command], start_new_session=True)
        try:
            deadline = time.monotonic() + 90
            while httpx.get(f"{head.url}/health").status_code != 200:
                assert worker.poll() is None and time.monotonic() < deadline, "no worker joined"
                time.sleep(0.2)
            nodes = httpx.get(f"{head.url}/health").json()["nodes"]
            assert [(n["name"], n["alive"]) for n in nodes] == [(f"http://{worker_ip}:8081", True)]
            check_health(head.url)
            async with SandboxClient(head.url) as client:
                r = await client.run("print(6 * 7)")
            assert r.status is Status.OK and r.stdout == "42\n"
        finally:
            os.killpg(worker.pid, signal.SIGTERM)
            worker.wait(timeout=30)
