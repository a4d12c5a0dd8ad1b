"""Isolated, fast execution of untrusted Python: the model's tool.

Public API::

    from rstar.sandbox import SandboxClient, SandboxConfig, SandboxService
    from rstar.sandbox import ExecRequest, ExecResult, Status

    async with SandboxService() as sb:              # executors on this machine, no HTTP
        r = await sb.run("import sympy; sympy.factorint(2**64 - 1)")
        r.status, r.value                           # Status.OK, '{3: 1, 5: 1, ...}'

    async with SandboxClient("http://127.0.0.1:8080") as sb:   # a running `rstar sandbox serve`
        results = await sb.run_many([ExecRequest("print(input())", stdin="7")])

Every call returns an `ExecResult` with a structured `status` (ok / error / timeout /
killed / rejected), stdout, stderr (a trimmed traceback on errors), the value of a final
bare expression, and timings. `ExecResult.tool_text()` is what the model reads.

Each call runs in a process forked from a warm executor, in its own session, under its own
uid with hard rlimits, in an empty network namespace and a read-only filesystem except a
private working directory that is removed afterwards; everything it started is killed when
it ends. See `isolation.py` and `executor.py` for how, and README.md for the HTTP APIs.
"""

from __future__ import annotations

import importlib

# Lazy on purpose: executors import this package and every module they load makes forks dearer.
_EXPORTS = {
    "SandboxConfig": "rstar.sandbox.config",
    "ExecRequest": "rstar.sandbox.result",
    "ExecResult": "rstar.sandbox.result",
    "Status": "rstar.sandbox.result",
    "SandboxService": "rstar.sandbox.service",
    "SandboxClient": "rstar.sandbox.client",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(name)
