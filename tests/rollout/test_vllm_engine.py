"""vLLM behind the engine interface: same greedy tokens as the local engine. Needs a GPU."""

import pytest
import torch


@pytest.mark.gpu
async def test_vllm_engine_matches_hf_engine_greedy(tiny_dir):
    from transformers import AutoModelForCausalLM

    from rstar.rollout.hf_engine import HFEngine
    from rstar.rollout.vllm_engine import VLLMEngine

    vllm = VLLMEngine(tiny_dir, gpu_memory_utilization=0.2, max_model_len=1024)
    hf = HFEngine(AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).cuda())
    params = {"max_tokens": 24, "temperature": 0}
    a = await vllm.generate("r", [5, 6, 7, 8], params)
    b = await hf.generate("r", [5, 6, 7, 8], params)
    assert a.token_ids == b.token_ids and a.stop_reason == "length"
    assert vllm.kv_capacity_tokens > 0
    await vllm.close()
    await hf.close()
