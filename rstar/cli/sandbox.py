"""`rstar sandbox ...`: the isolated Python sandbox that runs the model's tool calls."""

from __future__ import annotations

import asyncio
import logging

import typer

app = typer.Typer(
    help="The isolated Python sandbox that runs the model's tool calls.", no_args_is_help=True
)


def _sandbox_config(
    executors: int | None,
    slots: int | None,
    uid_base: int | None,
    timeout_s: float | None,
    batch_size: int | None = None,
    config: str | None = None,
    relay: str | None = None,
):
    from dataclasses import replace

    from rstar.sandbox.config import SandboxConfig

    cfg = SandboxConfig.from_yaml(config) if config else SandboxConfig()
    if batch_size is not None:
        cfg.batch_size = batch_size
    if relay is not None:
        cfg = replace(cfg, relay=relay)  # checked as the config is built
    if executors is not None:
        cfg.lean_executors = cfg.warm_executors = executors
    if slots is not None:
        cfg.slots_per_executor = slots
    if uid_base is not None:
        cfg.uid_base = uid_base
    if timeout_s is not None:
        cfg.timeout_s = timeout_s
    return cfg


@app.command()
def serve(
    host: str = typer.Option(
        "127.0.0.1", help="Address to bind (keep loopback unless behind a firewall)."
    ),
    port: int = typer.Option(8080),
    config: str = typer.Option(
        None, help="YAML file of sandbox settings (see configs/sandbox.yaml)."
    ),
    executors: int = typer.Option(
        None, help="Executors per flavour (lean and warm); default: CPU count."
    ),
    slots: int = typer.Option(None, help="Concurrent calls per executor."),
    uid_base: int = typer.Option(
        None, help="First uid for calls; give each node on one host its own range."
    ),
    timeout_s: float = typer.Option(None, help="Default wall-clock limit per call."),
    batch_size: int = typer.Option(None, help="Calls per batch sent to a node."),
    relay: str = typer.Option(
        None,
        help="How a node answers a batch: 'stream' (each call as it ends, the default) or "
        "'batch' (all when the slowest ends).",
    ),
    worker: list[str] = typer.Option([], help="URL of a worker node to dispatch to (repeatable)."),
    join: str = typer.Option(None, help="URL of a head service to register with as a worker node."),
    public_url: str = typer.Option(
        None,
        help="URL the head reaches this node at (default: the bound address; bound to 0.0.0.0, "
        "this host's address on the route to the head).",
    ),
    local: bool = typer.Option(
        True, help="Run calls on this machine (--no-local: a head that only dispatches)."
    ),
    log_level: str = typer.Option("warning"),
) -> None:
    """Serve the sandbox over HTTP: native, code-judge and SandboxFusion APIs."""
    from rstar.sandbox.process import serve as _serve

    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    _serve(
        host,
        port,
        _sandbox_config(executors, slots, uid_base, timeout_s, batch_size, config, relay),
        local=local,
        workers=worker,
        join=join,
        public_url=public_url,
        log_level=log_level,
    )


@app.command()
def bench(
    trivial_calls: int = typer.Option(4000, help="Calls of print(1+1) through the batch API."),
    sympy_calls: int = typer.Option(
        800, help="Calls of a sympy factorisation through the batch API."
    ),
    baseline_calls: int = typer.Option(200, help="Calls for each subprocess-per-call baseline."),
    single_calls: int = typer.Option(300, help="Sequential single calls for the latency figure."),
    out: str = typer.Option(
        "docs/benchmarks.md", help="Markdown file whose sandbox section is rewritten."
    ),
) -> None:
    """Measure the service against a subprocess-per-call baseline; write docs/benchmarks.md."""
    from rstar.bench.sandbox import run_benchmarks

    run_benchmarks(trivial_calls, sympy_calls, baseline_calls, single_calls, out)


@app.command("bench-relay")
def bench_relay(
    calls: int = typer.Option(2000, help="Calls per round."),
    wave: int = typer.Option(200, help="Calls sent at once; the next wave when they are answered."),
    slow_fraction: float = typer.Option(0.1, help="Share of slow calls."),
    rounds: int = typer.Option(2, help="Rounds of each relay, alternating."),
    out: str = typer.Option(
        "docs/benchmarks.md", help="Markdown file whose sandbox-relay section is rewritten."
    ),
) -> None:
    """Per-call latency through a head and two workers: each call answered as it ends vs. a
    batch answered when its slowest call ends; writes docs/benchmarks.md."""
    from rstar.bench.relay import run

    run(calls=calls, wave=wave, slow_fraction=slow_fraction, rounds=rounds, out=out)


@app.command()
def demo() -> None:
    """Run friendly and hostile snippets in the embedded sandbox and show what happened."""
    from rstar.sandbox.demo import run_demo

    asyncio.run(run_demo())


@app.command("exec")
def exec_(
    code: str = typer.Argument(..., help="Python code; '-' reads standard input."),
    stdin: str = typer.Option("", help="Text given to the code on its standard input."),
    timeout_s: float = typer.Option(None),
) -> None:
    """Run one snippet in the embedded sandbox and print its result as JSON."""
    import json
    import sys

    from rstar.sandbox.service import SandboxService

    if code == "-":
        code = sys.stdin.read()

    async def one():
        cfg = _sandbox_config(1, 2, None, None)
        async with SandboxService(cfg) as sb:
            return await sb.run(code, stdin, timeout_s=timeout_s)

    print(json.dumps(asyncio.run(one()).to_dict(), indent=2))
