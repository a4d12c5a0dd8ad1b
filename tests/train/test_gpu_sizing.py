"""The cluster path's GPU settings are chosen by arithmetic (rstar.train.gpu_sizing), reach
verl's command, and `rstar pipeline plan` shows them with their derivation."""

import json

import pytest
from typer.testing import CliRunner

from flows.cli import app
from rstar.pipeline.config import load_recipe
from rstar.pipeline.plan import check_verl
from rstar.train.gpu_sizing import (
    KNOWN,
    RESERVE_GB,
    ModelShape,
    micro_batch_gb,
    size,
    size_sft,
)

QWEN = KNOWN["Qwen/Qwen3-14B-Base"]


def test_a_models_shape_counts_its_parameters(tiny_dir):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    counted = ModelShape.of(tiny_dir).params
    # every matrix; the norms' vectors are all the formula leaves out
    assert 0.99 < counted / sum(p.numel() for p in model.parameters()) <= 1.0
    assert QWEN.kv_bytes_per_token == 2 * 40 * 8 * 128 * 2


ROWS = 512 * 16 // 64  # the 14B recipe's rollouts per update, per GPU


@pytest.mark.parametrize("response", [8192, 12288])
def test_14b_settings_fit_an_80_gb_gpu_padded(response):
    sequence = 2048 + response
    s = size(QWEN, 80, 64, 2048, response, ROWS * 64, per_node=8)
    # vLLM's share leaves the reserve; the state is on the CPU while vLLM rolls out
    assert (1 - s.memory_utilization) * 80 >= RESERVE_GB
    assert s.train_state_gb == pytest.approx(16 * 14.77e9 / s.fsdp_size / 1e9)
    # each replica holds at least 32 full-length rollouts; one degree less would not
    assert s.kv_tokens_per_replica >= 32 * sequence
    smaller = s.tensor_parallel // 2
    kv_smaller = (s.memory_utilization * 80 - 2 * QWEN.params / 1e9 / smaller - 2) * smaller
    assert kv_smaller * 1e9 / QWEN.kv_bytes_per_token < 32 * sequence
    # a fixed number of rollouts a micro-batch, each at most the full length: the worst case
    # of any length mix fits beside the state, within the room verl's sleep mode leaves
    assert s.padded_tokens == s.micro_batch_rows * sequence
    assert s.micro_batch_gb == pytest.approx(micro_batch_gb(QWEN, s.padded_tokens))
    assert s.room_gb == pytest.approx(0.8 * (80 - s.train_state_gb - RESERVE_GB))
    assert s.micro_batch_gb <= s.room_gb
    # one rollout fits at both lengths, two do not (and a GPU's rollouts divide evenly)
    assert s.micro_batch_rows == 1
    assert micro_batch_gb(QWEN, 2 * sequence) > s.room_gb
    # a node's GPUs hold the state (HSDP) at both lengths: rl1 and rl2 share a sharding
    assert s.fsdp_size == 8
    assert s.checkpoint_gb == pytest.approx(177, abs=1)


def test_14b_sft_fits_padded_with_the_state_on_the_gpu():
    # the recipe's 128 chats a step over 64 GPUs: two a GPU, padded at most to two full-length
    s = size_sft(QWEN, 80, 64, 8192, 128, per_node=8)
    assert (s.micro_batch_tokens, s.padded_tokens) == (16384, 16384)
    assert s.fsdp_size == 8 and s.train_state_gb == pytest.approx(16 * 14.77e9 / 8 / 1e9)
    assert s.micro_batch_gb <= 0.8 * (80 - s.train_state_gb - RESERVE_GB)
    # three chats a GPU may pad to 24K (one long, two short): the state over four nodes
    assert size_sft(QWEN, 80, 64, 8192, 3 * 64, per_node=8).fsdp_size == 32


def test_micro_batches_hold_as_many_rollouts_as_fit_dividing_a_gpus_share():
    # 192 GB leave room for five full-length 8K rollouts: four (a power of two dividing 128)
    s = size(QWEN, 192, 64, 2048, 8192, ROWS * 64, per_node=8)
    assert int(s.room_gb // micro_batch_gb(QWEN, s.sequence)) == 5
    assert s.micro_batch_rows == 4 and s.micro_batch_gb <= s.room_gb
    # 12 rollouts a GPU: 4 does not divide them evenly into micro-batches, 2 does
    assert size(QWEN, 192, 64, 2048, 8192, 12 * 64, per_node=8).micro_batch_rows == 4
    assert size(QWEN, 192, 64, 2048, 8192, 6 * 64, per_node=8).micro_batch_rows == 2


def test_the_gpu_probe_takes_log_probs_as_verls_padded_path_and_frees_each_gradient(monkeypatch):
    import torch

    from rstar.bench import gpu_probe

    reduced = []
    scatter = gpu_probe._reduce_scatter
    monkeypatch.setattr(gpu_probe, "_reduce_scatter", lambda p: reduced.append(p) or scatter(p))
    model = gpu_probe.build(gpu_probe.SMALL | {"num_hidden_layers": 1}, 1, "sdpa", "cpu")
    ids = torch.randint(0, 2048, (2, 5))
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    logits = torch.randn(2, 5, 2048)
    want = torch.log_softmax(logits, -1).gather(-1, ids[..., None]).squeeze(-1)
    # the real tokens only, row after row
    got = gpu_probe.verl_log_probs(logits, ids, mask)
    torch.testing.assert_close(got, torch.cat([want[0], want[1, :3]]))
    gpu_probe.step_peak(model, 2, 16, True, "cpu")
    # every weight's gradient went to its reduce-scatter and was freed there, as FSDP does
    assert {id(p) for p in reduced} == {id(p) for p in model.parameters()}
    assert all(p.grad is None for p in model.parameters())


def test_a_stage_that_cannot_fit_says_so():
    with pytest.raises(ValueError, match="padded micro-batch of .* more than"):
        size(QWEN, 40, 8, 2048, 30_000, 8 * 16, per_node=8)


def test_the_14b_plan_runs_the_sized_settings_and_prints_their_derivation():
    result = CliRunner().invoke(
        app, ["pipeline", "plan", "--config", "configs/qwen3-14b.yaml", "--json"]
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    recipe = load_recipe("configs/qwen3-14b.yaml", check_inputs=False)
    assert "data.max_prompt_length: 2048 here" in out["placeholders"]
    (sft,) = [s for s in out["stages"] if s["name"] == "sft"]
    assert "engine.fsdp_size=8" in sft["command"]
    assert any(line.startswith("sharding: fsdp_size 8,") for line in sft["gpu_settings"])
    for stage in [s for s in out["stages"] if s["name"] in ("rl1", "rl2", "rl3")]:
        cfg = check_verl(stage["command"][3:])
        rl = next(r for r in recipe.rl if r.name == stage["name"])
        rows = rl.prompts_per_step * rl.roc.group_size // rl.mini_batches
        want = size(QWEN, 80, 64, 2048, rl.sampling.max_response_tokens, rows, per_node=8)
        rollout, actor = cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.actor
        assert rollout.tensor_model_parallel_size == want.tensor_parallel
        assert rollout.gpu_memory_utilization == want.memory_utilization
        assert rollout.agent.num_workers == 64 and rollout.max_num_batched_tokens == 16384
        # micro-batches of a fixed number of rollouts, for the update and the old log-probs
        assert not actor.use_dynamic_bsz and not rollout.log_prob_use_dynamic_bsz
        assert actor.ppo_micro_batch_size_per_gpu == want.micro_batch_rows
        assert rollout.log_prob_micro_batch_size_per_gpu == want.micro_batch_rows
        # FSDP2, as CI trains, and attention that needs no flash-attn
        assert actor.strategy == "fsdp2" and cfg.actor_rollout_ref.ref.strategy == "fsdp2"
        # sharded within a node or two, replicated across the rest; offloaded during rollouts
        assert actor.fsdp_config.fsdp_size == want.fsdp_size
        assert actor.fsdp_config.param_offload and actor.fsdp_config.optimizer_offload
        assert cfg.actor_rollout_ref.model.override_config.attn_implementation == "sdpa"
        lines = stage["gpu_settings"]
        assert any(line.startswith("attention: PyTorch's (sdpa)") for line in lines)
        assert any(line.startswith(f"sharding: fsdp_size {want.fsdp_size},") for line in lines)
        assert any(f"tensor parallel {want.tensor_parallel}:" in line for line in lines)
        assert any(line.startswith("checkpoints: ") and "TB written" in line for line in lines)
        # across nodes the gradient shards once an update: 2 x 7/8 x 7.4 GB a GPU, x 8 a node
        assert any(
            "once an update" in line and "12.9 GB a GPU, 103 GB a node" in line for line in lines
        )
        worst = f"at most {want.micro_batch_rows} x {want.sequence:,} = {want.padded_tokens:,}"
        assert any(line.startswith("training micro-batch:") and worst in line for line in lines)


def test_the_gpu_probe_measures_the_plans_micro_batches(tmp_path):
    """The probe for a lent GPU (rstar.bench.gpu_probe) runs without verl, so it keeps the
    plan's micro-batch shapes and Qwen3-14B's config itself: both must be the plan's."""
    from rstar.bench import gpu_probe

    (tmp_path / "config.json").write_text(json.dumps(gpu_probe.QWEN3_14B))
    assert ModelShape.of(str(tmp_path)).params == pytest.approx(QWEN.params, rel=0.01)
    for case, response in zip(gpu_probe.CASES, (8192, 12288)):
        s = size(QWEN, 80, 64, 2048, response, ROWS * 64, per_node=8)
        assert (case.rows, case.longest, case.fsdp_size) == (
            s.micro_batch_rows,
            s.sequence,
            s.fsdp_size,
        )
    # the weights FSDP holds gathered: Qwen3-14B's embeddings and head, and two layers, in bf16
    layer = 5120 * 128 * (2 * 40 + 2 * 8) + 3 * 5120 * 17408
    assert gpu_probe.gathered_gb(gpu_probe.QWEN3_14B) == pytest.approx(
        2 * (2 * 151_936 * 5120 + 2 * layer) / 1e9
    )
    # a small shape runs the whole path here (no memory figures without a GPU)
    text = gpu_probe.main(["--small"])
    assert "| small | sdpa | 3 x 64 padded |" in text
    assert "| small | sdpa | 1 x 192 packed |" in text
