"""The cluster path's GPU settings are chosen by arithmetic (rstar.train.gpu_sizing), reach
verl's command, and `rstar pipeline plan` shows them with their derivation."""

import json

import pytest
from typer.testing import CliRunner

from flows.cli import app
from rstar.pipeline.config import load_recipe
from rstar.pipeline.plan import check_verl
from rstar.train.gpu_sizing import KNOWN, RESERVE_GB, ModelShape, micro_batch_gb, size

QWEN = KNOWN["Qwen/Qwen3-14B-Base"]


def test_a_models_shape_counts_its_parameters(tiny_dir):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    counted = ModelShape.of(tiny_dir).params
    # every matrix; the norms' vectors are all the formula leaves out
    assert 0.99 < counted / sum(p.numel() for p in model.parameters()) <= 1.0
    assert QWEN.kv_bytes_per_token == 2 * 40 * 8 * 128 * 2


@pytest.mark.parametrize("sequence", [2048 + 8192, 2048 + 12288])
def test_14b_settings_fit_an_80_gb_gpu(sequence):
    s = size(QWEN, 80, 64, sequence)
    # the state sharded over 64 GPUs, and vLLM's share leaves room for it beside the reserve
    assert s.train_state_gb == pytest.approx(16 * 14.77e9 / 64 / 1e9)
    assert (1 - s.memory_utilization) * 80 >= s.train_state_gb + RESERVE_GB
    # each replica holds at least 32 full-length rollouts; one degree less would not
    assert s.kv_tokens_per_replica >= 32 * sequence
    smaller = s.tensor_parallel // 2
    kv_smaller = (s.memory_utilization * 80 - 2 * QWEN.params / 1e9 / smaller - 2) * smaller
    assert kv_smaller * 1e9 / QWEN.kv_bytes_per_token < 32 * sequence
    # whole sequences per micro-batch, within the memory verl's sleep mode leaves the actor
    assert s.micro_batch_tokens % sequence == 0
    assert s.micro_batch_gb + s.train_state_gb + RESERVE_GB <= 80
    # the 12K stages' old setting (two sequences) would not have fit
    if sequence == 2048 + 12288:
        assert micro_batch_gb(QWEN, 2 * sequence) > 0.8 * (80 - s.train_state_gb - RESERVE_GB)
    assert s.checkpoint_gb == pytest.approx(177, abs=1)


def test_the_14b_plan_runs_the_sized_settings_and_prints_their_derivation():
    result = CliRunner().invoke(
        app, ["pipeline", "plan", "--config", "configs/qwen3-14b.yaml", "--json"]
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    recipe = load_recipe("configs/qwen3-14b.yaml", check_inputs=False)
    assert "data.max_prompt_length: 2048 here" in out["placeholders"]
    for stage in [s for s in out["stages"] if s["name"] in ("rl1", "rl2", "rl3")]:
        cfg = check_verl(stage["command"][3:])
        rl = next(r for r in recipe.rl if r.name == stage["name"])
        want = size(QWEN, 80, 64, 2048 + rl.max_response_tokens)
        rollout, actor = cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.actor
        assert rollout.tensor_model_parallel_size == want.tensor_parallel
        assert rollout.gpu_memory_utilization == want.memory_utilization
        assert rollout.agent.num_workers == 64 and rollout.max_num_batched_tokens == 16384
        assert actor.ppo_max_token_len_per_gpu == want.micro_batch_tokens
        assert actor.entropy_from_logits_with_chunking
        # FSDP2, as CI trains, and attention that needs no flash-attn
        assert actor.strategy == "fsdp2" and cfg.actor_rollout_ref.ref.strategy == "fsdp2"
        assert cfg.actor_rollout_ref.model.override_config.attn_implementation == "sdpa"
        lines = stage["gpu_settings"]
        assert any(f"tensor parallel {want.tensor_parallel}:" in line for line in lines)
        assert any(line.startswith("checkpoints: ") and "TB written" in line for line in lines)
