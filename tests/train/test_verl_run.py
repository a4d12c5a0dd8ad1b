"""verl's own trainer, two RL steps: `python -m rstar.train.verl_trainer` (verl's main_ppo,
its legacy RayPPOTrainer with RoC) trains the tiny SFT model through verl's FSDP2 workers, the
project's agent loop, the real sandbox service and the answer-only reward; verl's model merger
turns the last checkpoint into a Hugging Face model that loads. Rollouts run on vLLM through
verl's own vLLM replicas and weight sync: on this machine's CPU (gloo, vLLM's CPU build:
rstar.train.verl_cpu, rstar.rollout.vllm_cpu) in CI; on a GPU (marked `gpu`, run by
scripts/gpu-check.sh).

The SFT model is the shipped tiny base after the tiny recipe's own SFT (the session's
`tiny_sft`); the problems are ones it solves about half the time (`product_problems`), so
every step has reward to learn from on any CPU."""

import os
import re
import subprocess
import time

import pytest

from rstar.agent.sampling import Sampling
from rstar.algo.roc import RoCConfig
from rstar.data.io import read_table
from rstar.pipeline.layout import Layout
from rstar.train.config import RLConfig
from tests.conftest import product_problems

PROMPTS, G, STEPS = 8, 2, 2
LR, LR_METRIC = 5e-5, "actor/lr"  # verl logs its scheduler's rate after a step: the next one's
RESPONSE = 128  # tokens per rollout
RANKS = 2  # training processes on the CPU: sharded checkpoints, as on many GPUs


def metrics_by_step(log: str) -> dict[int, dict[str, float]]:
    """verl's console logger: `step:N - key:value - key:np.float64(value) ...`."""
    steps = {}
    for line in log.splitlines():
        m = re.search(r"step:(\d+) - (.*)", line)
        if m:
            steps[int(m.group(1))] = {
                k: float(v)
                for k, v in re.findall(
                    r"([\w/@.\-]+):(?:np\.\w+\()?(-?[\d.]+(?:e[-+]?\d+)?)", m.group(2)
                )
            }
    return steps


def run_verl(
    model: str,
    tmp_path,
    device: str,
    extra: list[str] = (),
    *,
    steps: int = STEPS,
    name: str = "rl1",
    optimizer_from: str | None = None,
    warmup_steps: int = 1,
    processes: int = 1,
) -> tuple[str, subprocess.CompletedProcess, dict]:
    """`steps` RL steps of verl's trainer on the tiny recipe's problems (`processes` training
    processes: FSDP ranks, on the CPU Ray slots): verl's checkpoint directory, the run and its
    environment."""
    from rstar.data.io import write_table
    from rstar.sandbox.process import SandboxProcess
    from rstar.train.verl_launcher import build_verl_run, verl_env

    rows = [
        {**p, "source": "product_problems", "metadata": "{}"}
        for p in product_problems(PROMPTS * steps)
    ]
    problems = write_table(rows, str(tmp_path / "problems.parquet"), "problems")
    stage = RLConfig(
        name=name,
        steps=steps,
        prompts_per_step=PROMPTS,
        roc=RoCConfig(group_size=G),
        sampling=Sampling(max_response_tokens=RESPONSE, max_turns=2, temperature=0.8),
        lr=LR,
        warmup_steps=warmup_steps,
        prompt_style="compact",
    )
    work = str(tmp_path / "run")
    env = {**os.environ, **verl_env(device, max(1, (os.cpu_count() or 1) // processes))}
    with SandboxProcess("--executors", "1") as sandbox:
        cmd = build_verl_run(
            stage,
            model=model,
            problems=problems,
            sandbox_url=sandbox.url,
            out_dir=work,
            n_gpus=processes,
            device=device,
            optimizer_from=optimizer_from,
            # the pipeline's layout (a Hive-style `stage=<name>` folder, an `=` in the path)
            trajectories=Layout(str(tmp_path)).trajectories(name),
            gpu=one_gpu(model) if device == "gpu" else None,
        )
        cmd = [c for c in cmd if not c.startswith("trainer.logger")] + [
            "trainer.logger=[console]",
            *extra,
        ]
        print("running:", " ".join(cmd), flush=True)
        run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800, cwd=work)
    return work, run, env


def verl_steps(
    model: str,
    tmp_path,
    device: str,
    extra: list[str] = (),
    *,
    steps: int = STEPS,
    **kw,
) -> tuple[str, dict[int, dict[str, float]]]:
    """`run_verl`, checked as it ran: verl's checkpoint directory and each step's metrics. The
    merged model differs from `model`."""
    work, run, env = run_verl(model, tmp_path, device, extra, steps=steps, **kw)
    processes = kw.get("processes", 1)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-6000:]
    # the rollouts ran on verl's vLLM replica (vLLM's CPU build here): its server actor logged
    assert "(vLLMHttpServer pid=" in log, log[-3000:]
    by_step = metrics_by_step(log)
    assert sorted(by_step) == list(range(1, steps + 1)), log[-3000:]
    # verl routed through the project's balancer
    assert f"[rstar] KV-balanced load balancer over {processes} replica(s)" in log
    for m in by_step.values():  # RoC inside verl's step: 2G sampled per prompt, G kept
        print({k: v for k, v in m.items() if k.startswith(("roc/", "rollout/"))}, flush=True)
        assert m["rollout/rollouts"] == PROMPTS * 2 * G and m["roc/kept"] == PROMPTS * G
        # verl's own update ran on what was kept
        assert "actor/pg_loss" in m and "timing_s/update_actor" in m
        # the rollout engine sampled with the actor's weights: its log-probs are the actor's
        # (float32 on both sides on the CPU; bfloat16 vLLM on a GPU)
        assert m["training/rollout_probs_diff_valid"] == 1
        assert m["training/rollout_probs_diff_max"] < (1e-3 if device == "cpu" else 0.1), m
        assert m["training/rollout_actor_probs_pearson_corr"] > 0.99, m
    # real reward: some rollouts solved it
    assert max(m["rollout/accuracy"] for m in by_step.values()) > 0
    # every rollout sampled, one file per step, as the local trainer writes them
    for step, m in by_step.items():
        rows = read_table(
            f"{Layout(str(tmp_path)).trajectories(kw.get('name', 'rl1'))}/step={step:05d}.parquet",
            "trajectories",
        ).to_pylist()
        assert len(rows) == m["rollout/rollouts"] and sum(r["kept"] for r in rows) == m["roc/kept"]
        assert sum(r["reward"] > 0 for r in rows) / len(rows) == m["rollout/accuracy"]
        assert all(r["response_len"] == len(r["response_ids"]) > 0 for r in rows)
        assert all(
            len(r["response_mask"]) == len(r["log_probs"]) == r["response_len"] for r in rows
        )
        assert sum(r["num_tool_calls"] for r in rows) > 0 and rows[0]["prompt_text"]
        assert m["timing_s/rstar_trajectories"] > 0
    actor = os.path.join(work, f"global_step_{steps}", "actor")
    assert os.path.exists(os.path.join(work, "latest_checkpointed_iteration.txt"))
    moved, _ = merged_changes(actor, model, str(tmp_path / "hf"), env)
    assert moved, "the merged model equals the one it started from: no update reached it"
    return work, by_step


def merged_changes(checkpoint: str, before: str, merged: str, env: dict) -> tuple[list[str], int]:
    """Merge verl's checkpoint with verl's model merger into `merged`, load it: (the names of the
    parameters that differ from the model at `before`, how many parameters it has)."""
    import torch
    from transformers import AutoModelForCausalLM

    from rstar.train.verl_launcher import merge_command

    subprocess.run(merge_command(checkpoint, merged), check=True, env=env, timeout=600)
    trained = AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32).named_parameters()
    start = list(
        AutoModelForCausalLM.from_pretrained(before, dtype=torch.float32).named_parameters()
    )
    return [n for (n, a), (_, b) in zip(trained, start) if not torch.equal(a, b)], len(start)


@pytest.fixture(scope="module")
def verl_rl1(tiny_sft, tmp_path_factory):
    """Two verl RL steps on the CPU (checked as they run): verl's checkpoint directory."""
    work, by_step = verl_steps(
        tiny_sft, tmp_path_factory.mktemp("verl-rl1"), "cpu", processes=RANKS
    )
    # a warm-up of one step: every update at the full rate
    assert by_step[STEPS][LR_METRIC] == pytest.approx(LR), by_step[STEPS]
    # sharded, as a many-GPU run writes them: one model and optimizer shard per rank
    actor = os.path.join(work, f"global_step_{STEPS}", "actor")
    for part in ("model", "optim", "extra_state"):
        assert all(
            os.path.exists(os.path.join(actor, f"{part}_world_size_{RANKS}_rank_{r}.pt"))
            for r in range(RANKS)
        ), os.listdir(actor)
    return work


def test_verls_trainer_runs_grpo_roc_on_cpu(verl_rl1):
    assert os.path.isdir(os.path.join(verl_rl1, f"global_step_{STEPS}", "actor"))


def adam_steps(actor_dir: str) -> set[int]:
    """The step counts in an actor checkpoint's optimizer state (every rank's shard)."""
    import glob

    import torch

    shards = glob.glob(os.path.join(actor_dir, "optim_world_size_*_rank_*.pt"))
    states = [torch.load(p, weights_only=False)["state"] for p in shards]
    return {int(s["step"]) for state in states for s in state.values()}


def test_a_next_verl_stage_carries_the_adam_moments_and_starts_at_its_own_warm_up_rate(
    verl_rl1, tiny_sft, tmp_path
):
    """rl2 starts from rl1's merged model and its last actor checkpoint (`rstar.optimizer_from`,
    reset_optimizer false), as the pipeline chains them: after its one step AdamW has counted
    rl1's two steps and its own, and rl2's own warm-up runs, from a quarter with 4 warm-up steps
    (verl alone would have run the first update at rl1's last rate, restored with the moments;
    its own warm-up starts at 0, a wasted update). test_verl_fsdp checks the rate the
    optimizer's groups get before the first update; here, the rate verl logs after it."""
    previous = os.path.join(verl_rl1, f"global_step_{STEPS}", "actor")
    assert adam_steps(previous) == {STEPS}
    rl1_model = os.path.join(os.path.dirname(verl_rl1), "hf")  # verl_steps merged it there
    work, by_step = verl_steps(
        rl1_model,
        tmp_path,
        "cpu",
        steps=1,
        name="rl2",
        optimizer_from=previous,
        warmup_steps=4,
        processes=RANKS,
    )
    # verl logs its scheduler's rate after the update: the next one's, 2/4 (1/4 ran, 2/4 next;
    # verl's own warm-up would log 1/4 after an update at 0)
    assert by_step[1][LR_METRIC] == pytest.approx(LR / 2), by_step[1]
    assert adam_steps(os.path.join(work, "global_step_1", "actor")) == {STEPS + 1}


def one_gpu(model: str):
    """The plan's own GPU sizing (rstar.train.gpu_sizing), scaled to this machine's one GPU."""
    import torch

    from rstar.train.gpu_sizing import ModelShape, size

    memory_gb = torch.cuda.get_device_properties(0).total_memory / 1e9
    return lambda prompt_tokens: size(
        ModelShape.of(model), memory_gb, 1, prompt_tokens, RESPONSE, PROMPTS * G
    )


def test_a_weight_sync_that_cannot_land_ends_the_run_naming_the_engine_and_step(tiny_sft, tmp_path):
    """vLLM's CPU build without the project's plugin (rstar.rollout.vllm_cpu) empties its
    linear layers' weights, so verl's sync cannot land; verl alone would wait for ever."""
    start = time.monotonic()
    _, run, _ = run_verl(
        tiny_sft,
        tmp_path,
        "cpu",
        [
            "++ray_kwargs.ray_init.runtime_env.env_vars.VLLM_PLUGINS=none",
            "rstar.weight_sync_timeout_s=20",
        ],
        steps=1,
    )
    log = run.stdout + run.stderr
    assert run.returncode != 0
    assert "verl's weight sync to the vllm rollout replicas at step" in log, log[-4000:]
    assert time.monotonic() - start < 600


@pytest.mark.gpu
def test_verls_trainer_runs_grpo_roc_on_a_gpu_with_vllm(tiny_sft, tmp_path):
    verl_steps(tiny_sft, tmp_path, "gpu")
