"""The request and result types every sandbox layer speaks (executor, service, HTTP, client)."""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Annotated

import msgspec


class Status(str, enum.Enum):
    """What happened to a call. Every result carries one, so callers never parse text."""

    OK = "ok"  # ran to completion (exit code 0)
    ERROR = "error"  # raised, exited non-zero, or could not be parsed
    TIMEOUT = "timeout"  # wall-clock or CPU-time limit reached
    KILLED = "killed"  # stopped by a signal or a limit other than time (output, file size, crash)
    REJECTED = "rejected"  # never ran: invalid request, code too large, service overloaded


@dataclass(frozen=True)
class ExecRequest:
    code: str
    stdin: str = ""
    timeout_s: float | None = None  # None: the service default
    notebook: bool = True  # echo the value of a final bare expression, like a notebook cell


@dataclass
class ExecResult:
    status: Status
    stdout: str = ""
    stderr: str = ""  # trimmed traceback for errors, or the program's own stderr
    value: str | None = None  # repr of the final bare expression (notebook mode)
    exit_code: int | None = None
    signal: int | None = None
    reason: str = ""  # one line for humans: why it is not ok
    truncated: bool = False  # stdout or stderr was cut to the output cap
    wall_s: float = 0.0
    cpu_s: float = 0.0
    attempts: int = 1  # >1 when the call was retried after losing its worker
    extra: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status is Status.OK

    def to_dict(self) -> dict:
        d = asdict(self)
        d["status"] = self.status.value
        return d

    @classmethod
    def rejected(cls, reason: str) -> ExecResult:
        return cls(status=Status.REJECTED, reason=reason)

    def tool_text(self) -> str:
        """The text a model sees as the tool response: output, value, or the error."""
        parts = []
        if self.stdout:
            parts.append(self.stdout.rstrip("\n"))
        if self.value is not None:
            parts.append(self.value)
        if self.status is Status.OK:
            if self.stderr:
                parts.append(self.stderr.rstrip("\n"))
            return "\n".join(parts) if parts else "(no output)"
        if self.status is Status.ERROR and self.stderr:
            parts.append(self.stderr.rstrip("\n"))
        else:
            parts.append(f"{self.status.value.capitalize()}: {self.reason}".rstrip(": "))
        return "\n".join(parts)


class ExecuteBody(msgspec.Struct):
    """The native batch API's request body (`POST /v1/execute`), checked while it is parsed."""

    requests: Annotated[list[ExecRequest], msgspec.Meta(min_length=1)]


class ResultsBody(msgspec.Struct):
    results: list[ExecResult]


class Answer(msgspec.Struct):
    """One line of the streaming API's answer (`POST /v1/execute/stream`, NDJSON): the result of
    the request at `index` of the body, sent as soon as that call ends."""

    index: int
    result: ExecResult


# msgspec encodes and decodes the dataclasses above directly: the hot path skips dicts.
JSON_HEADERS = {"content-type": "application/json"}
encode_json = msgspec.json.Encoder().encode
decode_execute = msgspec.json.Decoder(ExecuteBody).decode
decode_results = msgspec.json.Decoder(ResultsBody).decode
decode_answer = msgspec.json.Decoder(Answer).decode
