"""vLLM behind the engine interface, on this machine's CPU (vLLM's CPU build) and on a GPU: the
same greedy tokens as the local engine, and weights that a trainer's update reaches."""

import pytest
import torch


def _devices():
    return ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device", _devices())
async def test_vllm_engine_matches_hf_engine_greedy(tiny_dir, device):
    from transformers import AutoModelForCausalLM

    from rstar.rollout.hf_engine import HFEngine
    from rstar.rollout.vllm_engine import VLLMEngine

    vllm = VLLMEngine(tiny_dir, gpu_memory_utilization=0.2, max_model_len=1024)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).to(device)
    hf = HFEngine(model)
    params = {"max_tokens": 24, "temperature": 0}
    a = await vllm.generate("r", [5, 6, 7, 8], params)
    b = await hf.generate("r", [5, 6, 7, 8], params)
    assert a.token_ids == b.token_ids and a.stop_reason == "length"
    # log-probs of the same tokens agree with the local engine's (float32 on both sides)
    assert a.log_probs == pytest.approx(b.log_probs, abs=1e-3)
    assert vllm.kv_capacity_tokens > 0
    await vllm.close()
    await hf.close()


def test_cpu_kv_cache_holds_full_length_sequences(tmp_path, tiny_dir):
    """A CPU replica's cache fits a few sequences of the model's longest length: SmolLM2's shape
    (30 layers, 3 KV heads of 64, 8,192 positions) needs more than the tiny model's 256 MiB floor,
    which vLLM refused to start with (0.35 GiB for one sequence); the tiny model keeps the floor."""
    from rstar.rollout.vllm_engine import CPU_KV_CACHE_BYTES, CPU_KV_SEQUENCES, cpu_kv_cache_bytes
    from tests.conftest import smollm2_shaped_config

    smollm2_shaped_config(tmp_path)
    one_sequence = 8192 * 30 * 2 * 3 * 64 * 4
    assert cpu_kv_cache_bytes(str(tmp_path)) == CPU_KV_SEQUENCES * one_sequence
    assert cpu_kv_cache_bytes(str(tmp_path), max_model_len=1024) == CPU_KV_CACHE_BYTES
    assert cpu_kv_cache_bytes(tiny_dir) == CPU_KV_CACHE_BYTES
