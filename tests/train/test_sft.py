"""SFT: only assistant tokens are trained on; a short run lowers the loss and writes a
checkpoint that loads with its chat template."""

import json

import torch

from rstar.agent.format import IM_END
from rstar.data import sft
from rstar.train.config import SFTConfig
from rstar.train.sft import encode_example, train_sft


def test_mask_covers_exactly_the_assistant_turns(tokenizer):
    # error recovery: two calls, two tool turns
    messages = json.loads(sft.generate(8, seed=4)[5]["messages"])
    ids, mask = encode_example(tokenizer, messages, 4096)
    trained = tokenizer.decode([t for t, m in zip(ids, mask) if m])
    assistant = [m for m in messages if m["role"] == "assistant"]
    for m in assistant:
        assert m["content"] in trained
        for call in m.get("tool_calls", []):
            assert call["arguments"]["code"] in trained
    assert trained.count(IM_END) == len(assistant)  # each turn learns to end itself
    said = " ".join(m["content"] for m in assistant)
    for m in messages:
        if m["role"] in ("user", "tool") and m["content"] not in said:
            assert m["content"] not in trained  # prompts and tool responses are never targets
    assert "You are a helpful assistant" not in trained and "<tool_response>" not in trained


def test_short_sft_run_learns_and_saves(tiny_dir, tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    # tasks whose targets are learnable text (calc's answers are long numbers only copying from
    # the tool response predicts, which 12 steps do not teach: its loss is noise here)
    rows = sft.generate(
        48, seed=0, tasks=["reverse", "count_letter", "error_recovery", "instruction"]
    )
    out = str(tmp_path / "sft")
    history = train_sft(
        model,
        tokenizer,
        rows,
        SFTConfig(epochs=4, lr=3e-3, batch_size=16, micro_batch_size=8, warmup_ratio=0.25),
        out_dir=out,
    )
    # warm-up, then cosine
    assert len(history) == 12 and history[0]["lr"] < history[2]["lr"] > history[-1]["lr"]
    # 12 small steps: a clear drop, not noise
    assert history[-1]["loss"] < 0.75 * history[0]["loss"]
    assert all(h["grad_norm"] > 0 for h in history)
    reloaded = AutoTokenizer.from_pretrained(out)
    assert reloaded.chat_template == tokenizer.chat_template
    assert AutoModelForCausalLM.from_pretrained(out).config.vocab_size == len(tokenizer)


def test_replayed_pretraining_rows_keep_the_base_text_learnt(tiny_dir, tokenizer):
    """The same SFT run with and without replay: with it, the model also learns the base's
    pretraining text (here from scratch), so its loss there ends clearly lower (by 13-15% on
    the tokenizers it has had; without replay the two runs are one)."""

    from transformers import AutoModelForCausalLM

    from rstar.model.pretrain import TextSource, packed_batch

    held_out, labels = packed_batch(TextSource(123, tokenizer), tokenizer, 8, 64)
    losses = {}
    for replay in (0, 8):
        model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
        train_sft(
            model,
            tokenizer,
            sft.generate(32, seed=0),
            SFTConfig(epochs=6, lr=3e-3, batch_size=16, micro_batch_size=16, replay_rows=replay),
        )
        with torch.no_grad():
            losses[replay] = model(input_ids=held_out, labels=labels).loss.item()
    assert losses[8] < 0.9 * losses[0], losses
