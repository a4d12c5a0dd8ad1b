"""`rstar sandbox demo`: ordinary tool calls and attacks, run in the embedded sandbox."""

from __future__ import annotations

import os
import tempfile

from rich.console import Console
from rich.table import Table

from rstar.sandbox.config import SandboxConfig
from rstar.sandbox.hostile import ATTACKS
from rstar.sandbox.result import ExecRequest
from rstar.sandbox.service import SandboxService

ORDINARY = [
    ("stdout", "print(sum(i * i for i in range(10**6)))", ""),
    ("final expression", "from math import comb\ncomb(52, 5)", ""),
    ("standard input", "n = int(input())\nprint(n * (n + 1) // 2)", "100"),
    ("sympy", "import sympy\nsympy.factorint(2**64 - 1)", ""),
    (
        "numpy",
        "import numpy as np\nint(np.linalg.matrix_power(np.array([[1, 1], [1, 0]]), 30)[0, 1])",
        "",
    ),
    ("error", "def f(n):\n    return 1 // n\nf(0)", ""),
    ("syntax error", "print(1 +)", ""),
]


async def run_demo() -> None:
    console = Console()
    cfg = SandboxConfig(
        lean_executors=1, warm_executors=1, slots_per_executor=8, timeout_s=3.0, cpu_time_s=2
    )
    outside = os.path.join(tempfile.gettempdir(), "rstar-demo-outside.txt")
    with console.status("starting the sandbox (warm executors import numpy and sympy)..."):
        sb = await SandboxService(cfg).start()
    try:
        table = Table(title="rstar sandbox: what each call returned")
        for col in ("call", "status", "ms", "the model sees"):
            table.add_column(col, overflow="fold")
        for name, code, stdin in ORDINARY:
            r = await sb.run(code, stdin)
            table.add_row(name, r.status.value, f"{r.wall_s * 1e3:.1f}", r.tool_text()[-160:])
        codes = [a.code.format(port=9, path=outside) for a in ATTACKS]
        with console.status(f"running {len(ATTACKS)} attacks concurrently..."):
            results = await sb.run_many([ExecRequest(c) for c in codes])
        for attack, r in zip(ATTACKS, results):
            verdict = "contained" if r.status in attack.expect else "UNEXPECTED"
            table.add_row(
                f"attack: {attack.name}",
                f"{r.status.value} ({verdict})",
                f"{r.wall_s * 1e3:.0f}",
                f"{attack.what}. {r.reason or r.tool_text()[-100:]}",
            )
        console.print(table)
        health = sb.health()
        console.print(
            f"service after the attacks: {health['status']}; "
            f"{os.path.exists(outside) and 'FILE WRITTEN OUTSIDE' or 'nothing written outside'}"
        )
        for w in health["warnings"]:
            console.print(f"[yellow]isolation warning:[/] {w}")
    finally:
        await sb.close()
