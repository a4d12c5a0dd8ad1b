"""Engine replicas as Ray actors (one per GPU on a cluster, CPU processes in the embedded
default), behind the same `generate` interface. A dead actor raises, which the balanced
scheduler answers by re-queueing that replica's requests elsewhere."""

from __future__ import annotations

from dataclasses import asdict

import ray

from rstar.agent.loop import Generation


@ray.remote
class EngineActor:
    def __init__(self, model_dir: str, kind: str = "hf", seed: int = 0, **engine_kwargs) -> None:
        if kind == "vllm":
            from rstar.rollout.vllm_engine import VLLMEngine

            self.engine = VLLMEngine(model_dir, seed=seed, **engine_kwargs)
        else:
            from rstar.rollout.hf_engine import HFEngine

            self.engine = HFEngine.from_pretrained(model_dir, seed=seed, **engine_kwargs)

    async def generate(self, request_id: str, prompt_ids: list[int], sampling_params: dict) -> dict:
        return asdict(await self.engine.generate(request_id, prompt_ids, sampling_params))

    def kv_capacity_tokens(self) -> int:
        return self.engine.kv_capacity_tokens


class RayReplica:
    def __init__(self, actor) -> None:
        self.actor = actor

    @classmethod
    def start(
        cls, model_dir: str, *, kind: str = "hf", num_cpus: float = 1, num_gpus: float = 0, **kw
    ) -> RayReplica:
        return cls(
            EngineActor.options(num_cpus=num_cpus, num_gpus=num_gpus).remote(model_dir, kind, **kw)
        )

    async def generate(
        self, request_id: str, prompt_ids: list[int], sampling_params: dict
    ) -> Generation:
        return Generation(
            **await self.actor.generate.remote(request_id, prompt_ids, sampling_params)
        )

    async def kv_capacity_tokens(self) -> int:
        return await self.actor.kv_capacity_tokens.remote()
