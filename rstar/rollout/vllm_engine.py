"""The GPU engine: vLLM's AsyncLLM behind the same token-in/token-out interface as HFEngine.

Needs the `gpu` extra (`pip install -e .[gpu]`) and a CUDA device; the tests for it carry
the `gpu` marker and skip cleanly elsewhere. `kv_capacity_tokens` tells the balanced
scheduler how many tokens this replica's KV cache holds.
"""

from __future__ import annotations

import math

from rstar.agent.loop import Generation


class VLLMEngine:
    def __init__(
        self,
        model: str,
        *,
        gpu_memory_utilization: float = 0.85,
        max_model_len: int | None = None,
        seed: int = 0,
        **engine_kwargs,
    ) -> None:
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        args = AsyncEngineArgs(
            model=model,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            seed=seed,
            enable_prefix_caching=True,
            **engine_kwargs,
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
