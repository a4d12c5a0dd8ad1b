"""vLLM's CPU build takes weight updates (rstar.rollout.vllm_cpu, a vLLM plugin): its linear
layers keep their weights after loading and multiply by them at each call, so a change made in
place (what verl's weight sync after every step does) is what the next token uses; and its
threads run on every core this process may use."""

import os

import torch

BASE = "models/tiny-base"  # the shipped base: trained, so its greedy text depends on its weights


def linear_uses_its_weight(model) -> list[bool]:
    """A linear layer's output before and after its weight changes in place."""
    layer = model.model.layers[0].self_attn.qkv_proj
    x = torch.randn(3, layer.weight.shape[1])
    before = layer.quant_method.apply(layer, x)
    with torch.no_grad():
        layer.weight.mul_(2)
    after = layer.quant_method.apply(layer, x)
    with torch.no_grad():
        layer.weight.div_(2)
    return [
        layer.weight.numel() > 0,
        torch.allclose(after, 2 * before, atol=1e-5),
        torch.allclose(before, x @ layer.weight.T, atol=1e-5),
    ]


def worker_threads(model) -> int:
    return torch.get_num_threads()


def silence_mlps(model) -> None:
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.down_proj.weight.zero_()


def test_vllm_on_the_cpu_keeps_its_weights_and_uses_an_update(monkeypatch):
    from vllm import LLM, SamplingParams

    # apply_model sends these functions to vLLM's worker process
    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    llm = LLM(
        model=BASE, dtype="float32", enforce_eager=True, seed=0, max_model_len=256,
        kv_cache_memory_bytes=64 << 20,
    )  # fmt: skip
    try:
        # vLLM alone empties the weight (handed to oneDNN) and keeps multiplying by its copy
        assert llm.apply_model(linear_uses_its_weight) == [[True, True, True]]
        # vLLM alone gives its worker one compute thread per core but one (kept for its
        # scheduler); the plugin gives it every core (a thread each, pinned one to a core)
        assert llm.apply_model(worker_threads) == [len(os.sched_getaffinity(0))]
        greedy = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
        before = llm.generate(["What is 2+3?"], greedy)[0].outputs[0].token_ids
        llm.apply_model(silence_mlps)
        after = llm.generate(["What is 2+3?"], greedy)[0].outputs[0].token_ids
        assert list(after) != list(before)  # the update reached generation
    finally:
        llm.llm_engine.engine_core.shutdown()


def test_a_binding_set_by_the_user_wins(monkeypatch):
    from rstar.rollout import vllm_cpu

    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    vllm_cpu.register()
    cores = sorted(os.sched_getaffinity(0))
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == ",".join(map(str, cores))
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    vllm_cpu.register()
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
