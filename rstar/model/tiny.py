"""A tiny causal LM and its tokenizer, built and trained locally (nothing from a hub).

The tokenizer is a byte-level BPE trained on the project's own synthetic problems and SFT
chats, with single-digit number tokens (or, with `number_chunk`, one token per chunk of up to
that many digits) and the format's tags as whole tokens; it carries
the chat template, so the saved directory loads the same in transformers, vLLM and verl.
The model is a Qwen2-architecture decoder of a few million parameters.
"""

from __future__ import annotations

import json
import os

from rstar.agent.format import CHAT_TEMPLATE, EOS, IM_END, IM_START, STYLES, TOOL_NAME, render

SPECIAL = [EOS, IM_START, IM_END]
# The tool's name is one token too: split into 11 pieces (five "_"), it was where RL updates
# garbled the call first (`execute_python_with_with_standard_standard_io`, docs/benchmarks.md).
FORMAT_TAGS = [
    "<reason>",
    "</reason>",
    "<answer>",
    "</answer>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "\\boxed",
    TOOL_NAME,
]


# The problem families and SFT tasks of the tokenizer's corpus: those there were when the
# shipped base was built (models/tiny-base, 2026-12-01), so that one added since does not
# change the tokenizer of a rebuilt base (or of the tests' tiny model).
CORPUS_FAMILIES = [
    "power_mod",
    "big_product",
    "big_power",
    "divisor_count",
    "divisor_sum",
    "digit_sum_power",
    "digit_sum_factorial",
    "prime_count",
    "prime_sum",
    "committee",
    "arrangements",
    "linear_diophantine",
    "bounded_sum",
]
CORPUS_SFT_TASKS = [
    "reverse",
    "count_letter",
    "sort_words",
    "word_count",
    "longest_word",
    "error_recovery",
    "stdin",
    "calc",
    "calc_long",
    "instruction",
    "arith_tool",
    "arith_direct",
    "arith_recover",
]


def tokenizer_corpus(n_problems: int = 3000, n_sft: int = 1500, seed: int = 0) -> list[str]:
    """Texts in the shape the model will see: rendered problems and SFT chats."""
    from rstar.data import sft, synth

    texts = []
    for style in STYLES.values():
        texts += [
            render(style.messages(p["problem"]), tools=style.tools, add_generation_prompt=True)
            + f"<reason>\n</reason>\n<answer>\\boxed{{{p['answer']}}}</answer>"
            for p in synth.generate(n_problems, seed=seed, families=CORPUS_FAMILIES)
        ]
        texts += [
            render(
                [{"role": "system", "content": style.system}] + json.loads(r["messages"]),
                tools=style.tools,
            )
            for r in sft.generate(n_sft, seed=seed, tasks=CORPUS_SFT_TASKS)
        ]
    return texts


def build_tokenizer(vocab_size: int = 2048, seed: int = 0, number_chunk: int = 0):
    """`number_chunk` > 0: every string of 1..number_chunk digits is one token, so a number is
    read in chunks from the left (2: "1234567" -> 12 34 56 7). A tiny model copies a number
    token far sooner than a run of digits (each digit token is ambiguous), and the fewer the
    chunk types the sooner: with 2-digit chunks (110 types) the tiny base copies numbers in any
    context; with 3-digit ones (1,110 types) it still missed most 3-digit tokens after the same
    pretraining."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(tokenizer_corpus(seed=seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=EOS,
        additional_special_tokens=[IM_START],
        chat_template=CHAT_TEMPLATE,
    )
    fast.add_tokens(FORMAT_TAGS)
    if number_chunk:
        fast.add_tokens([f"{i:0{w}d}" for w in range(number_chunk, 0, -1) for i in range(10**w)])
    return fast


def build_model(
    tokenizer,
    *,
    hidden: int = 128,
    layers: int = 4,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 384,
    max_positions: int = 2048,
    seed: int = 0,
):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=intermediate,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),
        pad_token_id=tokenizer.convert_tokens_to_ids(EOS),
        bos_token_id=None,
    )
    return Qwen2ForCausalLM(config)


def build_tiny(out_dir: str, *, seed: int = 0, number_chunk: int = 0, **model_kwargs) -> str:
    """Tokenizer + randomly initialised model, saved in Hugging Face format to `out_dir`."""
    tokenizer = build_tokenizer(seed=seed, number_chunk=number_chunk)
    model = build_model(tokenizer, seed=seed, **model_kwargs)
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir
