"""vLLM's AsyncLLM behind the same token-in/token-out interface as HFEngine.

On a GPU (the `gpu` extra) it takes `gpu_memory_utilization` of the device. On the CPU (vLLM's
CPU build, installed by scripts/setup.sh) that flag would be a share of the machine's memory,
so the KV cache gets a size in bytes instead (`cpu_kv_bytes`, by default `cpu_kv_cache_bytes`:
room for a few sequences of the model's longest length, at least 256 MiB); in float32 (what the
trainer computes in) and eager mode (no compiled graphs). `kv_capacity_tokens` tells the
balanced scheduler how many tokens this replica's KV cache holds.
"""

from __future__ import annotations

import math

from rstar.agent.loop import Generation

CPU_KV_CACHE_BYTES = (
    256 << 20
)  # a replica's KV cache on the CPU, at least: 87K tokens of the tiny model
CPU_KV_SEQUENCES = 4  # full-length sequences a CPU replica's cache holds at least


def cpu_kv_cache_bytes(model: str, max_model_len: int | None = None) -> int:
    """A CPU replica's KV cache: `CPU_KV_SEQUENCES` sequences of `max_model_len` tokens (the
    model's own longest if not given) in float32, at least `CPU_KV_CACHE_BYTES`. vLLM refuses to
    start with less than one (SmolLM2's 8,192 tokens take 0.35 GiB)."""
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(model)
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    kv_heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    per_token = c.num_hidden_layers * 2 * kv_heads * head_dim * 4
    tokens = max_model_len or c.max_position_embeddings
    return max(CPU_KV_CACHE_BYTES, CPU_KV_SEQUENCES * tokens * per_token)


class VLLMEngine:
    def __init__(
        self,
        model: str,
        *,
        gpu_memory_utilization: float = 0.85,
        cpu_kv_bytes: int | None = None,
        max_model_len: int | None = None,
        seed: int = 0,
        **engine_kwargs,
    ) -> None:
        import torch
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        memory = (
            {"gpu_memory_utilization": gpu_memory_utilization}
            if torch.cuda.is_available()
            else {
                "kv_cache_memory_bytes": cpu_kv_bytes or cpu_kv_cache_bytes(model, max_model_len),
                "dtype": "float32",
                "enforce_eager": True,
            }
        )
        args = AsyncEngineArgs(
            model=model,
            max_model_len=max_model_len,
            seed=seed,
            enable_prefix_caching=True,
            **{**memory, **engine_kwargs},
        )
        self.engine = AsyncLLM.from_engine_args(args)
        cache = self.engine.vllm_config.cache_config
        self.kv_capacity_tokens = (cache.num_gpu_blocks or 0) * cache.block_size

    async def generate(
        self, request_id: str, prompt_ids: list[int], sampling_params: dict
    ) -> Generation:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(
            max_tokens=int(sampling_params["max_tokens"]),
            temperature=float(sampling_params.get("temperature", 1.0)),
            top_p=float(sampling_params.get("top_p", 1.0)),
            stop_token_ids=list(sampling_params.get("stop_token_ids", [])),
            logprobs=0,
            seed=sampling_params.get("seed"),
        )
        final = None
        async for out in self.engine.generate(
            TokensPrompt(prompt_token_ids=list(prompt_ids)), params, request_id
        ):
            final = out
        completion = final.outputs[0]
        ids = list(completion.token_ids)
        log_probs = [
            lp[t].logprob if lp and t in lp else -math.inf
            for t, lp in zip(ids, completion.logprobs or [None] * len(ids))
        ]
        return Generation(
            ids, log_probs, None, "length" if completion.finish_reason == "length" else "stop"
        )

    async def close(self) -> None:
        self.engine.shutdown()
