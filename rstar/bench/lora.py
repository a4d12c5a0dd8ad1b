"""`rstar bench-lora`: a training step of a real base model on this machine's CPU, full
fine-tuning against LoRA (peft), at the shape of configs/smollm2.yaml's RL update (a
micro-batch of 4 rows of ~512 tokens). The question of issue #35: does LoRA make a 135M model
cheaper to train here?

A step is what both trainers do per micro-batch: forward, backward, AdamW. The two variants
alternate, `rounds` times each after one warm-up step of each, on the same tokens, so the
machine's drift falls on both; the figures pool the rounds.
"""

from __future__ import annotations

import os
import statistics
import time

from rstar.bench.report import publish
from rstar.machine import cpu_model

# LoRA as commonly applied to Llama-style blocks: every attention and MLP projection
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _variant(path: str, lora_rank: int | None):
    """The model to train and its trainable parameters: all of them, or LoRA adapters."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    if lora_rank:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(
            model, LoraConfig(r=lora_rank, lora_alpha=2 * lora_rank, target_modules=TARGETS)
        )
    model.train()
    return model, [p for p in model.parameters() if p.requires_grad]


def _step(model, optimizer, tokens) -> float:
    start = time.perf_counter()
    model(input_ids=tokens, labels=tokens).loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def run(
    model_path: str, rows: int, tokens: int, rounds: int, lora_rank: int, out: str
) -> dict[str, dict]:
    import torch

    torch.manual_seed(0)
    variants = {"full": None, f"LoRA r={lora_rank}": lora_rank}
    built = {name: _variant(model_path, rank) for name, rank in variants.items()}
    vocab = built["full"][0].config.vocab_size
    batch = torch.randint(0, vocab, (rows, tokens))
    optimizers = {name: torch.optim.AdamW(params, lr=1e-6) for name, (_, params) in built.items()}
    times: dict[str, list[float]] = {name: [] for name in variants}
    for name, (model, _) in built.items():  # warm-up: allocations, first kernels
        _step(model, optimizers[name], batch)
    for _ in range(rounds):
        for name, (model, _) in built.items():
            times[name].append(_step(model, optimizers[name], batch))
    figures = {}
    for name, (_, params) in built.items():
        trainable = sum(p.numel() for p in params)
        figures[name] = {
            "seconds": statistics.median(times[name]),
            "min_s": min(times[name]),
            "trainable": trainable,
            # what AdamW and the gradients hold beyond the weights (float32)
            "state_mb": trainable * 4 * 3 / 2**20,
        }
    full = figures["full"]["seconds"]
    lines = [
        "## LoRA against full fine-tuning on the CPU (`rstar bench-lora`)",
        "",
        f"`{model_path}` on {cpu_model()} ({os.cpu_count()} CPUs), {time.strftime('%Y-%m-%d')}: "
        f"one training step (forward, backward, AdamW) of {rows} rows x {tokens} tokens, float32; "
        f"{rounds} steps of each variant, alternating, after one warm-up step each. LoRA on "
        f"{', '.join(TARGETS)} (peft).",
        "",
        "| variant | trainable parameters | gradients + AdamW state | seconds a step (median) | "
        "fastest | vs full |",
        "|---|---|---|---|---|---|",
        *(
            f"| {name} | {f['trainable'] / 1e6:.2f}M | {f['state_mb']:.0f} MB | "
            f"{f['seconds']:.2f} | {f['min_s']:.2f} | {f['seconds'] / full:.2f}x |"
            for name, f in figures.items()
        ),
    ]
    publish(out, "bench-lora", lines)
    return figures
