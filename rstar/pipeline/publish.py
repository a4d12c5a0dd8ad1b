"""A stage's model in storage: published whole and atomically, with the prompt style it was
trained with beside it (`rstar eval` reads it back), and loaded back by the stages that train
or probe it."""

from __future__ import annotations

from rstar.agent.format import save_style
from rstar.pipeline.records import ModelRef, StageOutput
from rstar.storage import dirs
from rstar.tracking.digest import digest


def load(uri: str):
    """(model, tokenizer) of the Hugging Face directory stored at `uri`, in float32."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = dirs.pull(uri)
    if path is None:
        raise FileNotFoundError(f"no model stored at {uri}")
    return AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32
    ), AutoTokenizer.from_pretrained(path)


def publish(uri: str, fill, style: str | None = None) -> str:
    """Store a finished model directory at `uri` atomically: `fill(tmp_dir)` writes it, then
    it replaces the old one whole (and is pushed, for a remote root)."""

    def fill_with_style(tmp: str) -> None:
        fill(tmp)
        if style:
            save_style(tmp, style)

    dirs.replace_dir(dirs.local_dir(uri), fill_with_style)
    dirs.push(uri)
    return uri


def save(model, tokenizer, uri: str, style: str | None = None) -> str:
    """`publish` a model and tokenizer held in memory."""

    def fill(tmp: str) -> None:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)

    return publish(uri, fill, style)


def model_output(uri: str, stage: str, metrics: dict, **fields) -> StageOutput:
    """A model stage's output: the model stored at `uri` with the digest of its files."""
    return StageOutput(stage, metrics, model=ModelRef(uri, digest(dirs.pull(uri))), **fields)
