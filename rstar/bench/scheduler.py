"""`rstar bench-scheduler`: static split vs KV-aware balanced scheduling.

1. Calibrate a replica model from real timings of the local engine (decode step time as a
   function of batch size, prefill time per token), and use a GPU-like profile beside it.
2. Simulate a long-tailed agentic workload (1K-12K tokens per rollout, 1-6 turns, tool waits
   of 0.05-2 s) on 8, 16 and 64 replicas under both policies; report makespan, idle
   fraction, evictions and the lower bound.
3. Run both schedulers for real on 2 local Ray replicas of the tiny model, with long-tailed
   request lengths and tool waits, and report their makespans.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time

from rich.console import Console
from rich.table import Table

from rstar.bench.report import write_section
from rstar.bench.simulate import ReplicaModel, Workload, lower_bound, simulate
from rstar.cluster import ray_session

GEN_CHUNK = (
    256  # tokens a balanced request reserves beyond its context; a turn continues in further chunks
)


def calibrate(model_dir: str) -> ReplicaModel:
    """Fit step(b) = a + c*b on the local engine, and measure prefill seconds per token."""
    import torch
    from transformers import AutoModelForCausalLM

    from rstar.rollout.hf_engine import HFEngine

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)

    async def step_time(batch: int) -> float:
        engine = HFEngine(model, max_batch=batch)
        start = time.perf_counter()
        await asyncio.gather(
            *(engine.generate(f"c{i}", [5] * 64, {"max_tokens": 128}) for i in range(batch))
        )
        elapsed = time.perf_counter() - start
        steps = engine.steps
        await engine.close()
        return elapsed / steps

    sizes = [1, 4, 8, 16, 32]
    asyncio.run(step_time(4))  # warm-up: the first steps pay one-off allocations
    # noise only adds time
    times = [min(asyncio.run(step_time(b)) for _ in range(3)) for b in sizes]
    mb, mt = statistics.fmean(sizes), statistics.fmean(times)
    c = sum((b - mb) * (t - mt) for b, t in zip(sizes, times)) / sum((b - mb) ** 2 for b in sizes)
    a = max(1e-4, mt - c * mb)

    def prefill_time() -> float:
        with torch.no_grad():
            start = time.perf_counter()
            model(torch.full((1, 1024), 5))
            return (time.perf_counter() - start) / 1024

    prefill = min(prefill_time() for _ in range(3))
    return ReplicaModel(a=a, c=max(c, 0.0), prefill_s_per_token=prefill, capacity=0)


def _real_run(model_dir: str, policy: str, rollouts: int, seed: int) -> float:
    """Makespan of a long-tailed multi-turn workload on 2 local Ray replicas under `policy`."""
    import ray

    from rstar.rollout.ray_replica import RayReplica
    from rstar.rollout.scheduler import BalancedScheduler, StaticScheduler

    rng = random.Random(seed)
    plan = [
        [
            (int(min(192, max(16, rng.lognormvariate(3.6, 0.8)))), rng.uniform(0.05, 0.5))
            for _ in range(rng.randint(1, 3))
        ]
        for _ in range(rollouts)
    ]
    replicas = [RayReplica.start(model_dir, num_cpus=0.5, seed=s) for s in (0, 1)]
    sched = (
        BalancedScheduler(replicas, 6 * (64 + 192 * 3))
        if policy == "balanced"
        else StaticScheduler(replicas)
    )

    async def one(r: int) -> None:
        context = [5] * 64
        for turn, (n, wait) in enumerate(plan[r]):
            out = await sched.generate(
                f"r{r}/{turn}", context, {"max_tokens": n, "temperature": 1.0}
            )
            context = context + out.token_ids + [7] * 16  # the tool response
            await asyncio.sleep(wait)

    async def main() -> float:
        await asyncio.gather(*(r.generate("warm", [5] * 8, {"max_tokens": 2}) for r in replicas))
        start = time.monotonic()
        await asyncio.gather(*(one(r) for r in range(rollouts)))
        return time.monotonic() - start

    try:
        return asyncio.run(main())
    finally:
        for r in replicas:
            ray.kill(r.actor)


def run_scheduler_benchmark(
    model_dir: str, out: str, rollouts_per_replica: int = 256, real_rollouts: int = 24
) -> list[dict]:

    console = Console()
    with console.status("calibrating the replica model on the local engine..."):
        local = calibrate(model_dir)
    profiles = {
        # (a, c, prefill) measured here; the KV cache holds 24 worst-case rollouts
        "local engine (measured)": ReplicaModel(
            local.a, local.c, local.prefill_s_per_token, 24 * 12_600
        ),
        # a 14B model on one GPU: memory-bound decode, cheap batching, ~320K KV tokens
        "GPU-like (assumed)": ReplicaModel(0.025, 0.0001, 1e-4, 320_000),
    }
    rows = []
    for name, model in profiles.items():
        for replicas in (8, 16, 64):
            work = Workload.long_tail(replicas * rollouts_per_replica, seed=replicas)
            with console.status(f"simulating {name} on {replicas} replicas..."):
                static = simulate(work, model, replicas, "static", chunk=128)
                balanced = simulate(
                    work, model, replicas, "balanced", chunk=128, gen_chunk=GEN_CHUNK
                )
            rows.append(
                {
                    "profile": name,
                    "replicas": replicas,
                    "static": static,
                    "balanced": balanced,
                    "bound": lower_bound(work, model, replicas),
                }
            )
    with ray_session(2), console.status("real run: 2 local Ray replicas, static then balanced..."):
        real = {p: _real_run(model_dir, p, real_rollouts, seed=1) for p in ("static", "balanced")}

    table = Table(title="rollout scheduling: static split vs KV-aware balanced")
    for col in (
        "profile",
        "replicas",
        "static s",
        "balanced s",
        "speed-up",
        "bound s",
        "balanced/bound",
        "static/bound",
        "idle static",
        "idle balanced",
        "evictions static/balanced",
        "moves",
    ):
        table.add_column(col)
    lines, out_of_reach = [], []
    for r in rows:
        s, b, lb = r["static"], r["balanced"], r["bound"]
        ceiling = s.makespan_s / lb  # the most any schedule could gain over static
        if ceiling < 1.5:
            out_of_reach.append(f"{r['profile']} at {r['replicas']} replicas: {ceiling:.2f}")
        cells = [
            r["profile"],
            str(r["replicas"]),
            f"{s.makespan_s:.0f}",
            f"{b.makespan_s:.0f}",
            f"{s.makespan_s / b.makespan_s:.2f}x",
            f"{lb:.0f}",
            f"{b.makespan_s / lb:.2f}",
            f"{ceiling:.2f}",
            f"{s.idle_fraction:.1%}",
            f"{b.idle_fraction:.1%}",
            f"{s.evictions}/{b.evictions}",
            str(b.moved),
        ]
        table.add_row(*cells)
        lines.append("| " + " | ".join(cells) + " |")
    console.print(table)
    console.print(
        f"real run, 2 Ray replicas, {real_rollouts} rollouts: static {real['static']:.1f}s, "
        f"balanced {real['balanced']:.1f}s"
    )
    doc = [
        "## Rollout scheduling (`rstar bench-scheduler`)",
        "",
        f"Measured {time.strftime('%Y-%m-%d')}. Workload: {rollouts_per_replica} rollouts per "
        "replica, the paper's load (512 prompts x 32 samples on 64 GPUs), in groups of 32 samples "
        "per prompt (the 2G sampled, of which GRPO-RoC keeps 16) stored contiguously as verl "
        "stores them; response length depends on the problem: each prompt draws a median "
        "(log-normal around 2.5K, sigma 0.6), its samples vary around it (sigma 0.45), clipped to "
        "1K-12K tokens; 1-6 turns, tool waits uniform in 0.05-2 s, tool responses of 120 tokens. "
        "Replica model: a decode step costs a + c x batch seconds, prefill a fixed time per "
        f"token. Measured on the local engine here: a = {local.a * 1e3:.2f} ms, c = "
        f"{local.c * 1e3:.3f} ms, prefill {local.prefill_s_per_token * 1e6:.1f} us/token (KV "
        "capacity set to 24 worst-case rollouts). The GPU-like profile is an assumption (25 ms + "
        "0.1 ms x batch, 100 us/token prefill, 320K KV tokens), not a measurement. Static (the "
        "public release's split): the batch cut into equal contiguous chunks up front (verl's "
        "AgentLoopManager); each replica admits while current contexts fit and evicts (then "
        "recomputes) the newest on overflow, as vLLM does. Balanced: one shared queue; a new "
        "rollout goes to the replica with the most free KV, reserving its context plus a "
        f"{GEN_CHUNK}-token generation chunk (zero over-commit by construction); its later "
        "requests (the next chunk, the turn after a tool call) go to that replica, where its "
        "prefix is cached; when it is full, they move to a replica with room that no one waits on "
        "and recompute their context there (moves below), or wait; new rollouts never take room a "
        "rollout in progress waits for. Both policies find a rollout's prefix cached on its "
        "replica between turns unless it was evicted or moved (optimistic for static). Bound (no "
        "schedule beats it): generating a token holds its context's KV for one step and a step "
        "holds at most the cache, so all replicas together run at least (summed contexts of all "
        "tokens) / (cache) steps, costing a per step plus c per token, plus the prompts' prefill, "
        "spread evenly; or the longest rollout alone at batch 1 with its tool waits, whichever is "
        "longer.",
        "",
        "| profile | replicas | static s | balanced s | speed-up | bound s | balanced/bound | "
        "static/bound | idle static | idle balanced | evictions static/balanced | moves |",
        "|" + "---|" * 12,
        *lines,
        "",
        f"Real run, 2 local Ray replicas of the tiny model, {real_rollouts} rollouts of 1-3 turns "
        f"(16-192 tokens per turn, tool waits 0.05-0.5 s): static {real['static']:.1f} s, balanced "
        f"{real['balanced']:.1f} s.",
        "",
        "Targets (issue: balanced >= 1.5x faster than static and within 15% of the bound, zero "
        "evictions): zero evictions holds by construction in every row; the speed-up and bound "
        "targets are read off the table above. static/bound is the most any schedule could gain "
        "over static, since none beats the bound: where it is below 1.5 ("
        + (", ".join(out_of_reach) or "no row")
        + ") the 1.5x target is out of reach on this workload.",
        "",
        "Reproduce: `.venv/bin/rstar bench-scheduler --model <tiny model dir>` (build one with "
        "`rstar.model.tiny.build_tiny`).",
    ]
    write_section(out, "scheduler", "\n".join(doc))
    console.print(f"wrote {out}")
    return rows
