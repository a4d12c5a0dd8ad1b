"""GPU settings of a verl stage, chosen by arithmetic instead of inherited from verl's defaults.

Every figure is derived from the model's shape, the GPU's memory and the stage's lengths, and
`lines()` prints the derivation (`rstar pipeline plan`; docs/cluster.md has it worked for the
14B recipe). Only a GPU can show how close the estimates run to the real peak: they are sized
to leave a margin (`RESERVE_GB`, `ACTIVATION_RESERVE_GB`) rather than to the last byte.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

GB = 1e9
RESERVE_GB = 6.0  # per GPU: CUDA context, NCCL buffers, allocator fragmentation
ACTIVATION_RESERVE_GB = 2.0  # vLLM's own activations and sampler at its token budget
MIN_ROLLOUTS_PER_REPLICA = 32  # full-length rollouts a replica's KV cache must hold at once
BATCHED_TOKENS = 16_384  # vLLM's per-step token budget (chunked prefill)


@dataclass(frozen=True)
class ModelShape:
    params: float
    layers: int
    kv_heads: int
    head_dim: int
    hidden: int
    vocab: int

    @classmethod
    def of(cls, model: str) -> ModelShape | None:
        """The shape of a model directory's config.json, or of a known hub name; None if
        neither."""
        path = os.path.join(model, "config.json")
        if not os.path.exists(path):
            return KNOWN.get(model)
        with open(path) as f:
            c = json.load(f)
        heads = c["num_attention_heads"]
        head_dim = c.get("head_dim") or c["hidden_size"] // heads
        layers, hidden, vocab = c["num_hidden_layers"], c["hidden_size"], c["vocab_size"]
        kv = c.get("num_key_value_heads", heads)
        # attention, MLP (gated: three matrices), embeddings and head (unless tied)
        per_layer = hidden * head_dim * (2 * heads + 2 * kv) + 3 * hidden * c["intermediate_size"]
        embed = vocab * hidden * (1 if c.get("tie_word_embeddings") else 2)
        return cls(layers * per_layer + embed, layers, kv, head_dim, hidden, vocab)

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * 2  # K and V, bf16


# Hub models the cluster recipe names, from their published config.json (the hub is not
# reached from here).
KNOWN = {
    "Qwen/Qwen3-14B-Base": ModelShape(14.77e9, 40, 8, 128, 5120, 151_936),
}


@dataclass(frozen=True)
class GPUSettings:
    gpu_gb: float
    gpus: int
    sequence: int  # prompt + response tokens
    train_state_gb: float  # per GPU, sharded over every GPU
    memory_utilization: float  # vLLM's share of the GPU during rollouts
    tensor_parallel: int
    kv_tokens_per_replica: int
    micro_batch_tokens: int  # ppo_max_token_len_per_gpu
    micro_batch_gb: float
    agent_workers: int
    checkpoint_gb: float
    shape: ModelShape

    @property
    def replicas(self) -> int:
        return self.gpus // self.tensor_parallel

    def overrides(self) -> list[str]:
        """verl overrides beyond the micro-batch size (which verl_overrides sets)."""
        rollout, actor = "actor_rollout_ref.rollout", "actor_rollout_ref.actor"
        return [
            f"{rollout}.tensor_model_parallel_size={self.tensor_parallel}",
            f"{rollout}.gpu_memory_utilization={self.memory_utilization}",
            f"{rollout}.max_num_batched_tokens={BATCHED_TOKENS}",
            f"{rollout}.agent.num_workers={self.agent_workers}",
            # entropy over the vocabulary in chunks: no second full fp32 logits tensor
            f"{actor}.entropy_from_logits_with_chunking=true",
            "actor_rollout_ref.model.enable_gradient_checkpointing=true",
        ]

    def lines(self) -> list[str]:
        s, gb = self.shape, self.gpu_gb
        weights = 2 * s.params / GB
        kv_gb = self.kv_tokens_per_replica * s.kv_bytes_per_token / GB
        return [
            f"model: {s.params / 1e9:.1f}B parameters, {s.layers} layers, {s.kv_heads} KV heads x "
            f"{s.head_dim}: {s.kv_bytes_per_token / 1024:.0f} KiB of KV cache per token (bf16)",
            f"training state per GPU (fp32 weights, gradients, AdamW moments: 16 bytes a "
            f"parameter, sharded over {self.gpus} GPUs): {self.train_state_gb:.1f} GB",
            f"vLLM's share during rollouts: 1 - ({self.train_state_gb:.1f} + {RESERVE_GB:g} "
            f"reserve) / {gb:g} GB = {self.memory_utilization}",
            f"tensor parallel {self.tensor_parallel}: bf16 weights "
            f"{weights / self.tensor_parallel:.1f} GB per GPU, KV cache {kv_gb:.0f} GB = "
            f"{self.kv_tokens_per_replica:,} tokens per replica = "
            f"{self.kv_tokens_per_replica // self.sequence} rollouts of {self.sequence:,} tokens "
            f"(the smallest degree holding {MIN_ROLLOUTS_PER_REPLICA}); {self.replicas} replicas",
            f"training micro-batch: {self.micro_batch_tokens:,} tokens per GPU, about "
            f"{self.micro_batch_gb:.0f} GB (checkpointed activations, bf16 logits and their fp32 "
            f"log-softmax) beside the {self.train_state_gb:.1f} GB state",
            f"agent-loop workers: {self.agent_workers} (one per GPU)",
            f"checkpoint: {self.checkpoint_gb:.0f} GB (fp32 weights and AdamW's two moments)",
        ]

    def checkpoint_volume(self, steps: int, every: int, kept: int) -> str:
        written = steps // every
        return (
            f"checkpoints: {written} over {steps} steps (every {every}) x "
            f"{self.checkpoint_gb:.0f} GB = {written * self.checkpoint_gb / 1000:.1f} TB written, "
            f"{min(kept, written) * self.checkpoint_gb / 1000:.1f} TB kept ({kept} at most)"
        )


def micro_batch_gb(shape: ModelShape, tokens: int) -> float:
    """Peak training memory of a micro-batch beyond the sharded state: each layer's checkpointed
    input (bf16), one layer recomputed in full (about 34 x hidden bytes a token), the logits
    in bf16 and the fp32 log-softmax with its gradient."""
    per_token = shape.layers * shape.hidden * 2 + 34 * shape.hidden + shape.vocab * (2 + 4 + 4)
    return tokens * per_token / GB


def size(shape: ModelShape, gpu_gb: float, gpus: int, sequence: int) -> GPUSettings:
    """Settings for a stage of `sequence`-token rollouts on `gpus` GPUs of `gpu_gb` each."""
    state = 16 * shape.params / gpus / GB
    utilization = math.floor(100 * min(0.9, 1 - (state + RESERVE_GB) / gpu_gb)) / 100
    tp, kv_tokens = 1, 0
    while True:
        per_gpu = utilization * gpu_gb - 2 * shape.params / GB / tp - ACTIVATION_RESERVE_GB
        kv_tokens = int(max(0.0, per_gpu) * tp * GB / shape.kv_bytes_per_token)
        if kv_tokens >= MIN_ROLLOUTS_PER_REPLICA * sequence or tp >= min(8, gpus):
            break
        tp *= 2
    # verl's sleep mode (on by default on GPUs) takes vLLM's weights and KV cache off the GPU
    # while the actor trains; 20% of the rest is left for what the estimate does not count
    room = 0.8 * (gpu_gb - state - RESERVE_GB)
    tokens = sequence
    while micro_batch_gb(shape, tokens + sequence) <= room:  # whole sequences, as many as fit
        tokens += sequence
    return GPUSettings(
        gpu_gb=gpu_gb,
        gpus=gpus,
        sequence=sequence,
        train_state_gb=state,
        memory_utilization=utilization,
        tensor_parallel=tp,
        kv_tokens_per_replica=kv_tokens,
        micro_batch_tokens=tokens,
        micro_batch_gb=micro_batch_gb(shape, tokens),
        agent_workers=gpus,
        checkpoint_gb=12 * shape.params / GB,
        shape=shape,
    )
