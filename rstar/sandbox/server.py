"""HTTP front of a `SandboxService`: the native batch API plus drop-in compatible endpoints.

- `POST /v1/execute` {"requests": [{"code", "stdin", "timeout_s", "notebook"}]} -> {"results":
  [...]}
- `POST /run`, `/run/batch`, `/run/long-batch` code-judge's API (what the rStar2-Agent release
  calls)
- `POST /run_code`               SandboxFusion's API (what verl's SandboxFusion tool calls)
- `GET /health`, `GET /stats` liveness, capacity, nodes, queue depth, calls/s, latency percentiles
- `POST /v1/nodes`               a worker node joins this head: {"url": "http://host:port"}

Malformed requests get a 4xx whose message names the field; the service keeps serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import uuid
from typing import Literal

import aiohttp
import msgspec
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr

from rstar.sandbox.client import STREAM_PATH
from rstar.sandbox.result import (
    Answer,
    ExecRequest,
    ExecResult,
    Status,
    decode_execute,
    encode_json,
)
from rstar.sandbox.service import SandboxService

MAX_BODY_BYTES = 256 * 2**20
BATCH_QUEUE_ALLOWANCE_S = (
    60.0  # /run/batch gives up on calls still queued this long after their limit
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="ignore")


class Submission(_Strict):
    sub_id: StrictStr | None = None
    type: Literal["python"]
    solution: StrictStr
    input: StrictStr | None = None
    expected_output: StrictStr | None = None
    options: dict[str, StrictStr] | None = None


class BatchSubmission(_Strict):
    sub_id: StrictStr | None = None
    type: Literal["batch"] = "batch"
    submissions: list[Submission] = Field(min_length=1)


class RunCodeIn(_Strict):
    code: StrictStr
    language: Literal["python", "python3"] = "python"
    compile_timeout: StrictFloat | StrictInt = 10
    run_timeout: StrictFloat | StrictInt = 10
    memory_limit_MB: StrictInt = -1
    stdin: StrictStr | None = ""
    files: dict[str, StrictStr | None] = Field(default_factory=dict, max_length=0)
    fetch_files: list[StrictStr] = Field(default_factory=list, max_length=0)


class NodeIn(_Strict):
    url: StrictStr


class TooLarge(Exception):
    def __init__(self, message: str) -> None:
        self.message = message


class BodyLimit:
    """Refuses bodies over `max_bytes` with a 413 (a plain ASGI middleware: no per-request task)."""

    def __init__(self, app, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            length = dict(scope["headers"]).get(b"content-length", b"0")
            if length.isdigit() and int(length) > self.max_bytes:
                response = JSONResponse(
                    {
                        "detail": f"request body is {int(length)} bytes; "
                        f"the limit is {self.max_bytes}"
                    },
                    status_code=413,
                )
                return await response(scope, receive, send)
        await self.app(scope, receive, send)


def _unprocessable(problems: list[tuple[str, str]]) -> JSONResponse:
    """422 naming each (field, message), whichever parser found them."""
    errors = [{"field": f, "message": m} for f, m in problems]
    summary = "; ".join(f"{e['field']}: {e['message']}" for e in errors[:5])
    return JSONResponse({"detail": summary, "errors": errors[:50]}, status_code=422)


def _msgspec_problem(e: Exception) -> tuple[str, str]:
    """("requests.0.code", "Expected `str`, got `int`") from msgspec's "... - at
    `$.requests[0].code`"."""
    if not isinstance(e, msgspec.ValidationError):
        return "body", f"invalid JSON: {e}"
    message, _, where = str(e).partition(" - at `$")
    path = re.sub(r"\[(\d+)\]", r".\1", where.rstrip("`")).strip(".")
    missing = re.search(r"missing required field `(\w+)`", message)
    if missing:
        path = f"{path}.{missing.group(1)}".strip(".")
    return path or "body", message


def _field_path(loc) -> str:
    parts = [str(p) for p in loc if p != "body"]
    return ".".join(parts) or "body"


def _check_sizes(service: SandboxService, items: list[tuple[str, str]]) -> None:
    limit = service.cfg.max_code_bytes
    for where, code in items:
        n = len(code.encode("utf-8", "surrogatepass"))
        if n > limit:
            raise TooLarge(f"{where} is {n} bytes; the limit is {limit} bytes")


def _code_judge_result(sub_id: str, r: ExecResult, expected: str | None) -> dict:
    run_success = r.status is Status.OK
    success = run_success and (expected is None or r.stdout.rstrip() == expected.rstrip())
    reason = {Status.TIMEOUT: "worker_timeout", Status.REJECTED: "internal_error"}.get(r.status, "")
    if r.status is Status.KILLED and r.reason.startswith("lost"):
        reason = "internal_error"
    return {
        "sub_id": sub_id,
        "success": success,
        "run_success": run_success,
        "cost": r.wall_s,
        "stdout": r.stdout,
        "stderr": r.stderr or (r.reason if not run_success else ""),
        "reason": reason,
    }


log = logging.getLogger(__name__)


async def _keep_joined(head: str, me: str) -> None:
    """Register with a head service, and again every few seconds in case it restarted."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5.0)) as http:
        while True:
            try:
                async with http.post(
                    f"{head.rstrip('/')}/v1/nodes", json={"url": me}, raise_for_status=True
                ):
                    pass
            except (TimeoutError, aiohttp.ClientError) as e:
                log.warning("could not join head %s: %r", head, e)
            await asyncio.sleep(5.0)


def create_app(
    service: SandboxService, *, join: str | None = None, public_url: str | None = None
) -> FastAPI:
    """The HTTP app; it starts and stops `service` with its lifespan. With `join`, this service
    registers itself (as `public_url`) as a worker node of the head service at `join`."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        await service.start()
        joiner = asyncio.create_task(_keep_joined(join, public_url)) if join else None
        try:
            yield
        finally:
            if joiner:
                joiner.cancel()
            await service.close()

    app = FastAPI(title="rstar sandbox", version="1", lifespan=lifespan)

    app.add_middleware(BodyLimit, max_bytes=MAX_BODY_BYTES)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError):
        return _unprocessable([(_field_path(e["loc"]), e["msg"]) for e in exc.errors()])

    @app.exception_handler(TooLarge)
    async def too_large(_: Request, exc: TooLarge):
        return JSONResponse({"detail": exc.message}, status_code=413)

    def json_response(obj) -> Response:
        return Response(encode_json(obj), media_type="application/json")

    @app.get("/ping")
    async def ping():
        return "pong"

    @app.get("/health")
    async def health():
        # 503 unless calls can run (a live node): readiness probes and an RL stage's pre-check
        # must not pass a head whose workers are all gone; /ping says the process answers
        state = service.health()
        return Response(
            encode_json(state),
            media_type="application/json",
            status_code=200 if state["status"] == "ok" else 503,
        )

    @app.get("/stats")
    async def stats():
        return json_response(service.stats_snapshot())

    @app.post("/v1/nodes")
    async def add_node(node: NodeIn):
        added = service.add_remote(node.url)
        return {"url": added.url, "nodes": len(service.nodes)}

    async def calls_of(request: Request) -> list | Response:
        """An execute request's calls, parsed and checked in one pass (msgspec), or the 422
        answer to a body that is not one."""
        try:
            body = decode_execute(await request.body())
        except msgspec.DecodeError as e:  # bad JSON, or a ValidationError (a DecodeError too)
            return _unprocessable([_msgspec_problem(e)])
        _check_sizes(service, [(f"requests.{i}.code", r.code) for i, r in enumerate(body.requests)])
        return body.requests

    async def execute(request: Request) -> Response:
        """The hot path, so plain Starlette + msgspec (results encoded straight from their
        dataclasses); FastAPI's per-request work cost more here than running the call."""
        calls = await calls_of(request)
        if isinstance(calls, Response):
            return calls
        return json_response({"results": await service.run_many(calls)})

    app.add_route("/v1/execute", execute, methods=["POST"])

    async def execute_stream(request: Request) -> Response:
        """/v1/execute's calls, each answered by a line (`Answer`, NDJSON) as soon as it ends:
        a slow call holds no other call of its batch. Used by the client and by a head relaying
        to its workers."""
        calls = await calls_of(request)
        if isinstance(calls, Response):
            return calls
        futures = await service.submit(calls)
        index = {f: i for i, f in enumerate(futures)}

        async def answers():
            pending = set(futures)
            try:
                while pending:
                    done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    yield b"".join(encode_json(Answer(index[f], f.result())) + b"\n" for f in done)
            finally:  # the caller went away: nobody takes these results
                for f in pending:
                    f.cancel()

        return StreamingResponse(answers(), media_type="application/x-ndjson")

    app.add_route(STREAM_PATH, execute_stream, methods=["POST"])

    async def run_submissions(subs: list[Submission], wait_s: float | None) -> list[dict]:
        ids = [s.sub_id or str(uuid.uuid4()) for s in subs]
        task = asyncio.ensure_future(
            service.run_many(
                [ExecRequest(s.solution, s.input or "", None, notebook=False) for s in subs]
            )
        )
        try:
            results = await asyncio.wait_for(asyncio.shield(task), wait_s) if wait_s else await task
        except TimeoutError:
            return [
                {
                    "sub_id": i,
                    "success": False,
                    "run_success": False,
                    "cost": 0.0,
                    "stdout": "",
                    "stderr": "",
                    "reason": "queue_timeout",
                }
                for i in ids
            ]
        return [_code_judge_result(i, r, s.expected_output) for i, r, s in zip(ids, results, subs)]

    @app.post("/run")
    async def run(sub: Submission):
        _check_sizes(service, [("solution", sub.solution)])
        return json_response((await run_submissions([sub], None))[0])

    @app.post("/run/batch")
    async def run_batch(batch: BatchSubmission):
        _check_sizes(
            service,
            [(f"submissions.{i}.solution", s.solution) for i, s in enumerate(batch.submissions)],
        )
        wait = service.cfg.max_timeout_s + BATCH_QUEUE_ALLOWANCE_S
        return json_response(
            {
                "sub_id": batch.sub_id or str(uuid.uuid4()),
                "results": await run_submissions(batch.submissions, wait),
            }
        )

    @app.post("/run/long-batch")
    async def run_long_batch(batch: BatchSubmission):
        _check_sizes(
            service,
            [(f"submissions.{i}.solution", s.solution) for i, s in enumerate(batch.submissions)],
        )
        return json_response(
            {
                "sub_id": batch.sub_id or str(uuid.uuid4()),
                "results": await run_submissions(batch.submissions, None),
            }
        )

    @app.post("/run_code")
    async def run_code(body: RunCodeIn):
        _check_sizes(service, [("code", body.code)])
        r = (
            await service.run_many(
                [ExecRequest(body.code, body.stdin or "", body.run_timeout, notebook=False)]
            )
        )[0]
        if r.status is Status.REJECTED or (
            r.status is Status.KILLED and r.reason.startswith("lost")
        ):
            return json_response(
                {
                    "status": "SandboxError",
                    "message": r.reason,
                    "compile_result": None,
                    "run_result": None,
                    "executor_pod_name": None,
                    "files": {},
                }
            )
        run_status = {Status.TIMEOUT: "TimeLimitExceeded", Status.KILLED: "Error"}.get(
            r.status, "Finished"
        )
        ok = r.status is Status.OK
        return json_response(
            {
                "status": "Success" if ok else "Failed",
                "message": "" if ok else r.reason,
                "compile_result": None,
                "run_result": {
                    "status": run_status,
                    "execution_time": r.wall_s,
                    "return_code": r.exit_code,
                    "stdout": r.stdout,
                    "stderr": r.stderr,
                },
                "executor_pod_name": None,
                "files": {},
            }
        )

    return app
