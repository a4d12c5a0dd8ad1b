"""Non-reasoning SFT on one machine: loss on assistant tokens only (the tool-call JSON, the
<reason>/<answer> format, the closing <|im_end|>), never on the system prompt, the user or
tool responses. Cosine schedule with warm-up, epochs, gradient accumulation and clipping.
Writes a Hugging Face checkpoint: model plus tokenizer with its chat template."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable

import torch

from rstar.agent.format import STYLES
from rstar.model.pretrain import PretrainConfig, TextSource, packed_batch
from rstar.train.config import SFTConfig


def encode_example(
    tokenizer, messages: list[dict], max_length: int, prompt_style: str = "paper"
) -> tuple[list[int], list[int]]:
    """Token ids and a loss mask (1 on assistant tokens) for one conversation, with the same
    system prompt and tools block the policy sees in RL."""
    style = STYLES[prompt_style]
    if messages[0]["role"] != "system":
        messages = [{"role": "system", "content": style.system}] + messages

    def render(msgs, gen=False):
        return tokenizer.apply_chat_template(
            msgs, tools=style.tools, tokenize=False, add_generation_prompt=gen
        )

    text = render(messages)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            start = len(render(messages[:i], gen=True))
            # up to and including <|im_end|>, not the newline
            end = len(render(messages[: i + 1])) - 1
            spans.append((start, end))
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = enc["input_ids"][:max_length]
    mask = [
        int(any(s <= a and b <= e for s, e in spans)) for a, b in enc["offset_mapping"][:max_length]
    ]
    return ids, mask


def _batches(examples, size, rng):
    order = list(range(len(examples)))
    rng.shuffle(order)
    for i in range(0, len(order), size):
        yield [examples[j] for j in order[i : i + size]]


def _collate(batch, pad_id):
    width = max(len(ids) for ids, _ in batch)
    ids = torch.full((len(batch), width), pad_id)
    mask = torch.zeros(len(batch), width, dtype=torch.long)
    attn = torch.zeros(len(batch), width, dtype=torch.long)
    for r, (x, m) in enumerate(batch):
        ids[r, : len(x)] = torch.tensor(x)
        mask[r, : len(m)] = torch.tensor(m)
        attn[r, : len(x)] = 1
    return ids, mask, attn


def train_sft(
    model,
    tokenizer,
    rows: list[dict],
    cfg: SFTConfig,
    out_dir: str | None = None,
    on_step: Callable[[int, dict], None] | None = None,
) -> list[dict]:
    """Train in place on rows of the sft schema; returns per-step metrics."""
    from transformers import get_cosine_schedule_with_warmup

    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    examples = [
        encode_example(tokenizer, json.loads(r["messages"]), cfg.max_length, cfg.prompt_style)
        for r in rows
    ]
    examples = [e for e in examples if sum(e[1])]
    steps_per_epoch = math.ceil(len(examples) / cfg.batch_size)
    total = steps_per_epoch * cfg.epochs
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = get_cosine_schedule_with_warmup(opt, math.ceil(cfg.warmup_ratio * total), total)
    pad = tokenizer.pad_token_id
    history, step = [], 0
    replay_rng = TextSource(cfg.seed + 1, tokenizer)
    model.train()
    for _ in range(cfg.epochs):
        for batch in _batches(examples, cfg.batch_size, rng):
            n_tokens = sum(sum(m) for _, m in batch)
            loss_sum = 0.0
            for i in range(0, len(batch), cfg.micro_batch_size):
                ids, mask, attn = _collate(batch[i : i + cfg.micro_batch_size], pad)
                logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]
                target, tmask = ids[:, 1:], mask[:, 1:].float()
                nll = torch.nn.functional.cross_entropy(
                    logits.reshape(-1, logits.shape[-1]), target.reshape(-1), reduction="none"
                ).view_as(tmask)
                loss = (nll * tmask).sum() / n_tokens  # token mean over the whole batch
                loss.backward()
                loss_sum += loss.item()
            if cfg.replay_rows:
                rows_ids, rows_labels = packed_batch(
                    replay_rng, tokenizer, cfg.replay_rows, PretrainConfig.seq_len
                )
                model(input_ids=rows_ids, labels=rows_labels).loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            metrics = {
                "step": step,
                "loss": loss_sum,
                "lr": sched.get_last_lr()[0],
                "grad_norm": float(grad_norm),
                "tokens": n_tokens,
            }
            history.append(metrics)
            if on_step:
                on_step(step, metrics)
    model.eval()
    if out_dir:
        model.save_pretrained(out_dir)
        tokenizer.save_pretrained(out_dir)
    return history
