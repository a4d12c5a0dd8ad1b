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
