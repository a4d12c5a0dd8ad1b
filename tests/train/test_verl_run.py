"""verl's own trainer, two RL steps: `python -m rstar.train.verl_trainer` (verl's main_ppo,
its legacy RayPPOTrainer with RoC) trains the tiny SFT model through verl's FSDP2 workers, the
project's agent loop, the real sandbox service and the answer-only reward; verl's model merger
turns the last checkpoint into a Hugging Face model that loads. On this machine's CPU (gloo,
the HF engine as verl's rollout replica: rstar.train.verl_cpu) in CI; on a GPU with vLLM
rollouts (marked `gpu`, run by scripts/gpu-check.sh).

The SFT model is the shipped tiny base after the tiny recipe's own SFT (about 4 minutes
here); the problems are the recipe's own (recipe_problems)."""

import os
import re
import subprocess
from dataclasses import replace

import pytest

pytest.importorskip("verl")

from rstar.algo.roc import RoCConfig
from rstar.train.config import StageConfig

PROMPTS, G, STEPS = 8, 2, 2


@pytest.fixture(scope="module")
def tiny_sft(tmp_path_factory):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rstar.data import sft as sft_data
    from rstar.pipeline.config import load_recipe
    from rstar.train.sft import train_sft

    recipe = load_recipe("configs/tiny.yaml")
    model = AutoModelForCausalLM.from_pretrained(recipe.base.shipped, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(recipe.base.shipped)
    rows = sft_data.generate(recipe.sft.examples, seed=recipe.sft.seed, tasks=recipe.sft.tasks)
    train_sft(model, tok, rows, replace(recipe.sft.train, prompt_style=recipe.prompt_style))
    out = str(tmp_path_factory.mktemp("tiny-sft"))
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def recipe_problems(n: int) -> list[dict]:
    """The tiny recipe's own kind of problem (big_product, power_mod; level 1). Its SFT model
    solves about 1 in 10 at these limits here, so 64 rollouts all failing is about a 1-in-500
    event; the RL stages start from there."""
    from rstar.data import synth

    return synth.generate(n, seed=7, levels=(1,), families=["big_product", "power_mod"])


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


def two_verl_steps(model: str, tmp_path, device: str, extra: list[str] = ()) -> None:
    from rstar.data.io import write_table
    from rstar.sandbox.process import SandboxProcess
    from rstar.train.verl_launcher import build_verl_run, verl_env

    problems = write_table(
        recipe_problems(PROMPTS * STEPS), str(tmp_path / "problems.parquet"), "problems"
    )
    stage = StageConfig(
        name="rl1",
        steps=STEPS,
        prompts_per_step=PROMPTS,
        roc=RoCConfig(group_size=G),
        max_response_tokens=128,
        max_turns=2,
        temperature=0.8,
        lr=5e-5,
        warmup_steps=1,
        prompt_style="compact",
    )
    work = str(tmp_path / "run")
    env = {**os.environ, **verl_env(device)}
    with SandboxProcess("--executors", "1") as sandbox:
        cmd = build_verl_run(
            stage,
            model=model,
            problems=problems,
            sandbox_url=sandbox.url,
            out_dir=work,
            n_gpus=1,
            device=device,
        )
        cmd = [c for c in cmd if not c.startswith("trainer.logger")] + [
            "trainer.logger=[console]",
            *extra,
        ]
        print("running:", " ".join(cmd), flush=True)
        run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800, cwd=work)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-6000:]
    steps = metrics_by_step(log)
    assert sorted(steps) == [1, 2], log[-3000:]
    # verl routed through the project's balancer
    assert "[rstar] KV-balanced load balancer over 1 replica(s)" in log
    for m in steps.values():  # RoC inside verl's step: 2G sampled per prompt, G kept
        print({k: v for k, v in m.items() if k.startswith("roc/")}, flush=True)
        assert m["roc/sampled"] == PROMPTS * 2 * G and m["roc/kept"] == PROMPTS * G
        # verl's own update ran on what was kept
        assert "actor/pg_loss" in m and "timing_s/update_actor" in m
    # real reward: some rollouts solved it
    assert max(m["roc/accuracy_sampled"] for m in steps.values()) > 0
    actor = os.path.join(work, f"global_step_{STEPS}", "actor")
    assert os.path.exists(os.path.join(work, "latest_checkpointed_iteration.txt"))
    moved, _ = merged_changes(actor, model, str(tmp_path / "hf"), env)
    assert moved, "the merged model equals the SFT model: no update reached the checkpoint"


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


def test_verls_trainer_runs_grpo_roc_on_cpu(tiny_sft, tmp_path):
    two_verl_steps(tiny_sft, tmp_path, "cpu")


@pytest.mark.gpu
def test_verls_trainer_runs_grpo_roc_on_a_gpu_with_vllm(tiny_sft, tmp_path):
    # one GPU: vLLM unsharded, leaving the actor room on the same device
    two_verl_steps(
        tiny_sft,
        tmp_path,
        "gpu",
        [
            "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
            "actor_rollout_ref.rollout.gpu_memory_utilization=0.3",
        ],
    )
