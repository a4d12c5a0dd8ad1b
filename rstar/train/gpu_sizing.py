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
from dataclasses import dataclass, replace

GB = 1e9
RESERVE_GB = 6.0  # per GPU: CUDA context, NCCL buffers, allocator fragmentation
ACTIVATION_RESERVE_GB = 2.0  # vLLM's own activations and sampler at its token budget
MIN_ROLLOUTS_PER_REPLICA = 32  # full-length rollouts a replica's KV cache must hold at once
BATCHED_TOKENS = 16_384  # vLLM's per-step token budget (chunked prefill)
ATTENTION = (
    "attention: PyTorch's (sdpa) without padding removal, on every device: verl's "
    "flash_attention_2 and padding removal need flash-attn, which the GPU lock has no wheel "
    "of; micro-batches are sized padded (below)"
)


def _head_dim(c: dict) -> int:
    return c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]


def parameter_counts(c: dict) -> tuple[int, int]:
    """(a decoder layer's parameters, the embeddings' and head's) of a model's config.json:
    attention and the gated MLP's three matrices; the head apart unless tied to the
    embeddings. The norms' vectors are left out."""
    heads, hidden = c["num_attention_heads"], c["hidden_size"]
    kv = c.get("num_key_value_heads", heads)
    per_layer = hidden * _head_dim(c) * (2 * heads + 2 * kv) + 3 * hidden * c["intermediate_size"]
    return per_layer, c["vocab_size"] * hidden * (1 if c.get("tie_word_embeddings") else 2)


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
        per_layer, embed = parameter_counts(c)
        layers = c["num_hidden_layers"]
        return cls(
            layers * per_layer + embed,
            layers,
            c.get("num_key_value_heads", c["num_attention_heads"]),
            _head_dim(c),
            c["hidden_size"],
            c["vocab_size"],
        )

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
    per_node: int
    fsdp_size: int  # GPUs the training state is sharded over: a node's (HSDP), more if it must
    train_state_gb: float  # per GPU, sharded over a node's GPUs, off the GPU during rollouts
    memory_utilization: float  # vLLM's share of the GPU during rollouts
    tensor_parallel: int
    kv_tokens_per_replica: int
    micro_batch_rows: int  # ppo_micro_batch_size_per_gpu: rollouts a micro-batch, fixed
    rows_per_gpu: int
    room_gb: float  # what a micro-batch may take beside the state
    agent_workers: int
    checkpoint_gb: float
    shape: ModelShape

    @property
    def replicas(self) -> int:
        return self.gpus // self.tensor_parallel

    @property
    def padded_tokens(self) -> int:
        """The most tokens a micro-batch can hold, whatever the rollouts' lengths: its rows,
        each padded to the longest, which is at most prompt + response."""
        return self.micro_batch_rows * self.sequence

    @property
    def micro_batch_gb(self) -> float:
        return micro_batch_gb(self.shape, self.padded_tokens)

    def on_ranks(self, per_node: int, nodes: int, agent_workers: int) -> GPUSettings:
        """These settings mapped onto `nodes` x `per_node` CPU ranks (a rehearsal,
        rstar.pipeline.rehearsal): the training state sharded over as many nodes' ranks as it is
        nodes' GPUs here, the same rollouts a micro-batch, offload and checkpointing; vLLM's CPU
        build takes no tensor parallelism, and the agent loop has `agent_workers` workers."""
        return replace(
            self,
            gpus=per_node * nodes,
            per_node=per_node,
            fsdp_size=ranks_for(self.fsdp_size, self.per_node, per_node),
            tensor_parallel=1,
            agent_workers=agent_workers,
        )

    def overrides(self) -> list[str]:
        """verl overrides beyond the micro-batch size (which verl_overrides sets)."""
        rollout, actor = "actor_rollout_ref.rollout", "actor_rollout_ref.actor"
        return [
            f"{rollout}.tensor_model_parallel_size={self.tensor_parallel}",
            f"{rollout}.gpu_memory_utilization={self.memory_utilization}",
            f"{rollout}.max_num_batched_tokens={BATCHED_TOKENS}",
            f"{rollout}.agent.num_workers={self.agent_workers}",
            # shard within a node, replicate across nodes (HSDP); the state on the CPU while
            # vLLM rolls out
            f"{actor}.fsdp_config.fsdp_size={self.fsdp_size}",
            f"{actor}.fsdp_config.param_offload=true",
            f"{actor}.fsdp_config.optimizer_offload=true",
            "actor_rollout_ref.model.enable_gradient_checkpointing=true",
        ]

    def lines(self) -> list[str]:
        s, gb = self.shape, self.gpu_gb
        weights = 2 * s.params / GB
        kv_gb = self.kv_tokens_per_replica * s.kv_bytes_per_token / GB
        nodes = self.fsdp_size // self.per_node
        if nodes <= 1:
            replicas = self.gpus // self.fsdp_size
            shard = 4 * s.params / self.fsdp_size / GB
            sent = 2 * (replicas - 1) / replicas * shard
            network = (
                f"network: per micro-batch the bf16 weights gathered ({weights:.1f} GB, forward "
                "and backward) and the gradients reduce-scattered inside a node (NVLink); across "
                f"nodes each GPU's gradient shard (4 bytes x {s.params / 1e9:.1f}B / "
                f"{self.fsdp_size} = {shard:.1f} GB) is all-reduced once an update "
                f"(rstar.train.verl_hsdp), a ring over {replicas}: 2 x {replicas - 1}/{replicas} x "
                f"{shard:.1f} = {sent:.1f} GB a GPU, {sent * self.per_node:.0f} GB a node"
            )
        else:
            network = (
                f"network per micro-batch: the bf16 weights ({weights:.1f} GB, forward and "
                f"backward) gathered and the gradients reduce-scattered over {nodes} nodes: "
                "sharded over one node's GPUs, the state would leave no room for the padded "
                "micro-batch below"
            )
        return [
            f"model: {s.params / 1e9:.1f}B parameters, {s.layers} layers, {s.kv_heads} KV heads x "
            f"{s.head_dim}: {s.kv_bytes_per_token / 1024:.0f} KiB of KV cache per token (bf16)",
            ATTENTION,
            f"sharding: fsdp_size {self.fsdp_size}, the training state (fp32 weights, "
            f"gradients, AdamW moments: 16 bytes a parameter) over {self.fsdp_size} GPUs, "
            f"replicated {self.gpus // self.fsdp_size} times: {self.train_state_gb:.1f} GB per GPU",
            network,
            f"vLLM's share during rollouts: the training state offloaded to the CPU meanwhile, "
            f"min(0.9, 1 - {RESERVE_GB:g} GB reserve / {gb:g} GB) = {self.memory_utilization}",
            f"tensor parallel {self.tensor_parallel}: bf16 weights "
            f"{weights / self.tensor_parallel:.1f} GB per GPU, KV cache {kv_gb:.0f} GB = "
            f"{self.kv_tokens_per_replica:,} tokens per replica = "
            f"{self.kv_tokens_per_replica // self.sequence} rollouts of {self.sequence:,} tokens "
            f"(the smallest degree holding {MIN_ROLLOUTS_PER_REPLICA}); {self.replicas} replicas",
            f"training micro-batch: {self.micro_batch_rows} rollout(s), fixed "
            f"(ppo_micro_batch_size_per_gpu; verl's token-budget batching would pack any number "
            f"of short rollouts beside a long one, each padded to it), padded to the longest: "
            f"at most {self.micro_batch_rows} x {self.sequence:,} = {self.padded_tokens:,} "
            f"tokens whatever the lengths, {self.micro_batch_gb:.1f} GB (checkpointed "
            f"activations, bf16 logits and their fp32 log-softmax) <= {self.room_gb:.1f} GB = "
            f"0.8 x ({gb:g} - {self.train_state_gb:.1f} state - {RESERVE_GB:g} reserve), the "
            f"state back on the GPU while it trains; {self.rows_per_gpu} rollouts a GPU an "
            f"update: {math.ceil(self.rows_per_gpu / self.micro_batch_rows)} micro-batches",
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


def ranks_for(fsdp_size: int, gpus_per_node: int, ranks_per_node: int) -> int:
    """The shard group on CPU ranks that has the shape of `fsdp_size` GPUs: the same share of a
    node (half a node, one, two), at least one rank."""
    return max(1, fsdp_size * ranks_per_node // gpus_per_node)


def micro_batch_gb(shape: ModelShape, tokens: int) -> float:
    """Peak training memory of a micro-batch beyond the sharded state: each layer's checkpointed
    input (bf16), one layer recomputed in full (about 34 x hidden bytes a token), the logits
    in bf16 and the fp32 log-softmax with its gradient."""
    per_token = shape.layers * shape.hidden * 2 + 34 * shape.hidden + shape.vocab * (2 + 4 + 4)
    return tokens * per_token / GB


def sharding(
    shape: ModelShape, gpu_gb: float, gpus: int, per_node: int, padded: int
) -> tuple[int, float, float]:
    """(fsdp_size, the training state per GPU in GB, the room a micro-batch has beside it) for
    micro-batches of `padded` tokens: the state sharded over a node's GPUs (HSDP), or over more
    nodes where a node's share leaves the micro-batch no room. 20% of the room is left for what
    the estimate does not count. Refused if sharding over every GPU is not enough."""
    fsdp_size = min(gpus, per_node)
    while True:
        state = 16 * shape.params / fsdp_size / GB
        room = 0.8 * (gpu_gb - state - RESERVE_GB)
        if micro_batch_gb(shape, padded) <= room:
            return fsdp_size, state, room
        if fsdp_size >= gpus:
            raise ValueError(
                f"a padded micro-batch of {padded:,} tokens needs "
                f"{micro_batch_gb(shape, padded):.0f} GB, more than the {room:.0f} GB a "
                f"{gpu_gb:g} GB GPU leaves beside the state sharded over all {gpus} GPUs: more "
                "GPUs, larger ones, or shorter sequences"
            )
        fsdp_size = min(gpus, 2 * fsdp_size)


def size(
    shape: ModelShape,
    gpu_gb: float,
    gpus: int,
    prompt: int,
    response: int,
    rows: int,
    per_node: int = 8,
) -> GPUSettings:
    """Settings for a stage of rollouts of `prompt` + `response` tokens on `gpus` GPUs of
    `gpu_gb` each, `per_node` to a node, `rows` rollouts an update trains on. Micro-batches hold
    a fixed number of rollouts, each padded to the longest of them (PyTorch's attention): at
    most rows x (prompt + response) tokens, whatever the lengths, so memory is bounded by
    construction; as many rows as fit, in powers of two that divide a GPU's rollouts. The
    training state is sharded over a node's GPUs and replicated across nodes (HSDP): full
    sharding would move the weights between nodes for every micro-batch (`lines` has the
    arithmetic). It is sharded over more nodes only where a node's share leaves no room for one
    full-length rollout. A node's share is larger than a 64th, so it goes to the CPU while vLLM
    rolls out (verl's parameter and optimizer offload), and vLLM's share is what the reserve
    leaves."""
    sequence = prompt + response
    rows_per_gpu = max(1, rows // gpus)
    # verl's sleep mode (on by default on GPUs) takes vLLM's weights and KV cache off the GPU
    # while the actor trains
    fsdp_size, state, room = sharding(shape, gpu_gb, gpus, per_node, sequence)
    utilization = math.floor(100 * min(0.9, 1 - RESERVE_GB / gpu_gb)) / 100
    tp, kv_tokens = 1, 0
    while True:
        per_gpu = utilization * gpu_gb - 2 * shape.params / GB / tp - ACTIVATION_RESERVE_GB
        kv_tokens = int(max(0.0, per_gpu) * tp * GB / shape.kv_bytes_per_token)
        if kv_tokens >= MIN_ROLLOUTS_PER_REPLICA * sequence or tp >= min(8, gpus):
            break
        tp *= 2
    micro_rows = 1
    while (
        rows_per_gpu % (2 * micro_rows) == 0
        and micro_batch_gb(shape, 2 * micro_rows * sequence) <= room
    ):
        micro_rows *= 2
    return GPUSettings(
        gpu_gb=gpu_gb,
        gpus=gpus,
        sequence=sequence,
        per_node=per_node,
        fsdp_size=fsdp_size,
        train_state_gb=state,
        memory_utilization=utilization,
        tensor_parallel=tp,
        kv_tokens_per_replica=kv_tokens,
        micro_batch_rows=micro_rows,
        rows_per_gpu=rows_per_gpu,
        room_gb=room,
        agent_workers=gpus,
        checkpoint_gb=12 * shape.params / GB,
        shape=shape,
    )


@dataclass(frozen=True)
class SFTSettings:
    """verl's SFT on GPUs: no vLLM beside it, the state stays on the GPU."""

    gpus: int
    per_node: int
    fsdp_size: int
    train_state_gb: float
    micro_batch_tokens: int  # data.max_token_len_per_gpu: real tokens
    padded_tokens: int  # at most: every row of a GPU's batch in one micro-batch at max_length
    micro_batch_gb: float

    def on_ranks(self, per_node: int, nodes: int) -> SFTSettings:
        """Mapped onto `nodes` x `per_node` CPU ranks, as GPUSettings.on_ranks."""
        return replace(
            self,
            gpus=per_node * nodes,
            per_node=per_node,
            fsdp_size=ranks_for(self.fsdp_size, self.per_node, per_node),
        )

    def overrides(self) -> list[str]:
        return [f"engine.fsdp_size={self.fsdp_size}"]

    def lines(self) -> list[str]:
        return [
            ATTENTION,
            f"sharding: fsdp_size {self.fsdp_size}, the training state (16 bytes a parameter) "
            f"over {self.fsdp_size} GPUs, replicated {self.gpus // self.fsdp_size} times: "
            f"{self.train_state_gb:.1f} GB per GPU, on it throughout",
            f"training micro-batch: {self.micro_batch_tokens:,} real tokens per GPU, padded at "
            f"most to {self.padded_tokens:,} (a GPU's rows of a batch, each at the longest "
            f"chat's length), about {self.micro_batch_gb:.0f} GB",
        ]


def sft_micro_batch_tokens(max_length: int) -> int:
    """verl's SFT micro-batch budget in real tokens (data.max_token_len_per_gpu): two
    full-length chats, on every device."""
    return 2 * max_length


def size_sft(
    shape: ModelShape, gpu_gb: float, gpus: int, max_length: int, rows: int, per_node: int = 8
) -> SFTSettings:
    """Settings for verl's SFT of chats of at most `max_length` tokens, `rows` chats a step, on
    `gpus` GPUs: micro-batches of two full-length chats in real tokens (verl balances them), and
    padded at most to a GPU's rows of a step at `max_length` each, whatever the lengths."""
    tokens = sft_micro_batch_tokens(max_length)
    padded = max(1, rows // gpus) * max_length
    fsdp_size, state, _ = sharding(shape, gpu_gb, gpus, per_node, padded)
    return SFTSettings(
        gpus=gpus,
        per_node=per_node,
        fsdp_size=fsdp_size,
        train_state_gb=state,
        micro_batch_tokens=tokens,
        padded_tokens=padded,
        micro_batch_gb=micro_batch_gb(shape, padded),
    )
