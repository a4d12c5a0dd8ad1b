"""The HTTP service: native, code-judge and SandboxFusion APIs, health/stats, and bad requests."""

import httpx
import pytest

from rstar.sandbox.process import SandboxProcess


@pytest.fixture(scope="module")
def server():
    with SandboxProcess(
        "--executors", "1", "--slots", "4", "--uid-base", "320000", "--timeout-s", "3"
    ) as proc:
        yield proc


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


def test_native_batch(http):
    r = http.post(
        "/v1/execute",
        json={
            "requests": [
                {"code": "print(input())", "stdin": "hi"},
                {"code": "2**10"},
                {"code": "1/0"},
                {"code": "import time\ntime.sleep(5)", "timeout_s": 0.3},
            ]
        },
    )
    assert r.status_code == 200
    res = r.json()["results"]
    assert [x["status"] for x in res] == ["ok", "ok", "error", "timeout"]
    assert res[0]["stdout"] == "hi\n" and res[1]["value"] == "1024"
    assert res[2]["reason"] == "ZeroDivisionError: division by zero"


def test_code_judge_run_and_batches(http):
    r = http.post(
        "/run", json={"type": "python", "solution": "print(int(input()) + 1)", "input": "41"}
    ).json()
    assert set(r) == {"sub_id", "success", "run_success", "cost", "stdout", "stderr", "reason"}
    assert r["success"] and r["run_success"] and r["stdout"] == "42\n" and r["reason"] == ""
    subs = [
        {"type": "python", "solution": "print(9)", "expected_output": "9"},
        {"type": "python", "solution": "print(8)", "expected_output": "9"},
        {"type": "python", "solution": "raise ValueError('x')"},
        {"type": "python", "solution": "while True: pass"},
    ]
    for path in ("/run/batch", "/run/long-batch"):
        body = http.post(path, json={"type": "batch", "sub_id": "b1", "submissions": subs}).json()
        assert body["sub_id"] == "b1"
        res = body["results"]
        assert [(x["success"], x["run_success"]) for x in res] == [
            (True, True),
            (False, True),
            (False, False),
            (False, False),
        ]
        assert "ValueError: x" in res[2]["stderr"] and res[3]["reason"] == "worker_timeout"
        assert res[0]["stdout"] == "9\n"  # no notebook echo on the compatible APIs


def test_sandbox_fusion_run_code(http):
    ok = http.post(
        "/run_code",
        json={
            "code": "print(input() * 2)",
            "language": "python",
            "stdin": "ab",
            "compile_timeout": 10,
            "run_timeout": 5,
            "memory_limit_MB": -1,
            "files": {},
            "fetch_files": [],
        },
    ).json()
    assert ok["status"] == "Success" and ok["compile_result"] is None
    assert ok["run_result"]["status"] == "Finished" and ok["run_result"]["return_code"] == 0
    assert ok["run_result"]["stdout"] == "abab\n"
    err = http.post(
        "/run_code", json={"code": "import sys; sys.exit(4)", "language": "python"}
    ).json()
    assert err["status"] == "Failed" and err["run_result"]["return_code"] == 4
    slow = http.post(
        "/run_code", json={"code": "import time; time.sleep(9)", "run_timeout": 0.5}
    ).json()
    assert slow["status"] == "Failed" and slow["run_result"]["status"] == "TimeLimitExceeded"


def test_health_and_stats(http):
    health = http.get("/health").json()
    assert health["status"] == "ok" and health["capacity"] == 8 and health["warnings"] == []
    http.post("/v1/execute", json={"requests": [{"code": "1"}] * 20})
    stats = http.get("/stats").json()
    assert stats["calls"] >= 20 and stats["by_status"]["ok"] >= 20
    assert stats["calls_per_s"] > 0 and stats["latency_ms"]["p50"] <= stats["latency_ms"]["p99"]
    assert stats["queue_depth"] == 0 and stats["nodes_alive"] == 1


@pytest.mark.parametrize(
    "body,status,names",
    [
        (b"{not json", 422, "JSON"),
        (b'{"requests": [{"stdin": "x"}]}', 422, "requests.0.code"),
        (b'{"requests": [{"code": 123}]}', 422, "requests.0.code"),
        (b'{"requests": [{"code": "1", "timeout_s": "soon"}]}', 422, "requests.0.timeout_s"),
        (b'{"requests": []}', 422, "requests"),
        (
            b'{"type": "batch", "submissions": [{"type": "cpp", "solution": "x"}]}',
            422,
            "submissions.0.type",
        ),
    ],
)
def test_malformed_requests_get_a_4xx_naming_the_problem(http, body, status, names):
    paths = ["/run/batch"] if b"submissions" in body else ["/v1/execute", "/v1/execute/stream"]
    for path in paths:
        r = http.post(path, content=body, headers={"content-type": "application/json"})
        assert r.status_code == status, path
        assert names in r.json()["detail"], path
    assert (
        http.post("/v1/execute", json={"requests": [{"code": "'still serving'"}]}).json()[
            "results"
        ][0]["value"]
        == "'still serving'"
    )


def test_oversized_code_is_refused(http):
    big = "#" * (256 * 1024 + 1)
    r = http.post("/v1/execute", json={"requests": [{"code": "1"}, {"code": big}]})
    assert (
        r.status_code == 413
        and "requests.1.code" in r.json()["detail"]
        and "limit" in r.json()["detail"]
    )
    r = http.post("/run", json={"type": "python", "solution": big})
    assert r.status_code == 413 and "solution" in r.json()["detail"]
    assert http.get("/health").json()["status"] == "ok"
