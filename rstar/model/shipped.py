"""The embedded default's base model, built once and shipped with its digest.

Pretraining the tiny base is the one step of the embedded recipe whose outcome hangs on the
floating-point path: the same seed under another CPU's kernels (AVX-512 vs AVX2) or another
thread count ends 2,400 steps with other weights, and how exactly the base copies numbers
decides whether RL later has anything to learn from (docs/benchmarks.md, "robustness"). A real
recipe starts from a published base too, so the embedded default ships one: built by
`rstar model build-base`, stored under `models/` with a manifest naming the recipe section it
was built from, its content digest, the versions, CPU and time that built it. The base stage
uses it when the manifest matches the recipe's `base` section and the digest matches the files,
and refuses it with a message naming the difference otherwise; `--set base.shipped=null`
pretrains from scratch instead.
"""

from __future__ import annotations

import json
import os
import time

from rstar.errors import NotRetryable
from rstar.machine import cpu_model
from rstar.tracking.digest import digest

MANIFEST = "MANIFEST.json"
# The fields of the recipe's `base` section that decide the weights (not where they ship).
BUILD_FIELDS = (
    "hidden",
    "layers",
    "number_chunk",
    "pretrain_steps",
    "pretrain_lr",
    "pretrain_batch",
    "pretrain_seq_len",
    "seed",
)


class ShippedBaseError(NotRetryable, ValueError):
    """A shipped base that is missing, altered, or built from another recipe."""


def build_spec(spec) -> dict:
    return {k: getattr(spec, k) for k in BUILD_FIELDS}


def pretrain_base(spec, on_step=None):
    """Tokenizer + model of `spec` (the recipe's `base` section), pretrained; returns
    (model, tokenizer, history)."""
    from rstar.model.pretrain import PretrainConfig, pretrain
    from rstar.model.tiny import build_model, build_tokenizer

    tok = build_tokenizer(seed=spec.seed, number_chunk=spec.number_chunk)
    model = build_model(
        tok, hidden=spec.hidden, layers=spec.layers, intermediate=3 * spec.hidden, seed=spec.seed
    )
    history = pretrain(
        model,
        tok,
        PretrainConfig(
            steps=spec.pretrain_steps,
            batch_size=spec.pretrain_batch,
            seq_len=spec.pretrain_seq_len,
            lr=spec.pretrain_lr,
            seed=spec.seed,
        ),
        on_step=on_step,
    )
    return model, tok, history


def write_shipped(
    model, tokenizer, spec, out_dir: str, *, seconds: float, metrics: dict, rebuild: str
) -> str:
    """Save a built base to `out_dir` (replaced whole) with its manifest (`rebuild`: the command
    that built it)."""
    import tokenizers
    import torch
    import transformers

    from rstar.storage.dirs import replace_dir

    def fill(tmp: str) -> None:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        manifest = {
            "spec": build_spec(spec),
            "digest": digest(tmp),
            "built": time.strftime("%Y-%m-%d"),
            "seconds": round(seconds),
            "cpu": cpu_model(),
            "torch_threads": torch.get_num_threads(),
            "versions": {
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "tokenizers": tokenizers.__version__,
            },
            "metrics": metrics,
            "rebuild": rebuild,
        }
        with open(os.path.join(tmp, MANIFEST), "w") as f:
            json.dump(manifest, f, indent=2)
            f.write("\n")

    return replace_dir(out_dir, fill)


def check_shipped(path: str, spec) -> dict:
    """The manifest of the base shipped at `path`, after checking that it was built from
    `spec` and that its files are the ones built (raises ShippedBaseError naming what differs)."""
    manifest_path = os.path.join(path, MANIFEST)
    if not os.path.isfile(manifest_path):
        raise ShippedBaseError(
            f"base.shipped: {path} holds no {MANIFEST} (build one with `rstar model build-base`)"
        )
    with open(manifest_path) as f:
        manifest = json.load(f)
    want = build_spec(spec)
    differs = {
        k: (manifest["spec"].get(k), v) for k, v in want.items() if manifest["spec"].get(k) != v
    }
    if differs:
        said = ", ".join(
            f"{k}: built with {a!r}, recipe says {b!r}" for k, (a, b) in differs.items()
        )
        raise ShippedBaseError(
            f"base.shipped: {path} was built from another recipe ({said}); rebuild it with `rstar "
            "model build-base` or set base.shipped=null to pretrain in the pipeline"
        )
    found = digest(path, skip=(MANIFEST,))
    if found != manifest["digest"]:
        raise ShippedBaseError(
            f"base.shipped: {path}: files digest {found}, manifest says {manifest['digest']} "
            "(altered or partly written; restore it with git or rebuild it)"
        )
    return manifest
