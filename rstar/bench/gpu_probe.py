"""The 14B actor's training memory per GPU, measured on one GPU as it is (#45 point 13).

The plan (rstar.train.gpu_sizing) estimates a micro-batch's memory from Qwen3-14B's shape; this
probe measures it. It builds Qwen3-14B's layers from its published config (random bf16 weights,
one layer then two, so the difference is one layer's share), runs forward and backward with
gradient checkpointing on the plan's worst micro-batch of each RL stage, padded as verl pads it
(its rows, each at the stage's full length, PyTorch's attention) and packed as padding removal
would run it, and extrapolates to 40 layers beside the sharded training state and the reserve.
What FSDP adds around the same step is counted too: each weight's gradient, unsharded until
its reduce-scatter (which takes an fp32 copy, verl's reduce dtype) and freed after it, as FSDP
frees it; the log-probs taken as verl's padded path takes them (each row's real tokens cut out
and joined, then log-softmax a token at a time: `logprobs_from_logits_v2`'s bfloat16 branch,
flash-attn's cross-entropy not being in the GPU lock); and the weights FSDP holds gathered
(the root unit's embeddings and head for the whole step, two layers at a time: the current
one and the one prefetched), by arithmetic from the config.

    python -m rstar.bench.gpu_probe            # on a GPU: the table, in a few minutes
    python -m rstar.bench.gpu_probe --small    # anywhere: a small shape, proves the script

It needs only torch and transformers (the lent device has no vLLM, verl or Ray), so the plan's
micro-batch shapes are kept in `CASES` (a test keeps them equal to the plan's). What it cannot
show: NCCL buffers, vLLM beside the actor, or the allocator over hours; docs/cluster.md says so.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

import torch

from rstar.train.gpu_sizing import GB, KNOWN, RESERVE_GB, micro_batch_gb, parameter_counts

# Qwen3-14B-Base's config.json (published; the hub is not reached from here)
QWEN3_14B = {
    "hidden_size": 5120,
    "intermediate_size": 17408,
    "num_hidden_layers": 40,
    "num_attention_heads": 40,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151_936,
    "tie_word_embeddings": False,
    "max_position_embeddings": 40_960,
    "rope_theta": 1_000_000.0,
}
SMALL = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 40,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "vocab_size": 2048,
    "tie_word_embeddings": False,
    "max_position_embeddings": 4096,
}


@dataclass(frozen=True)
class Case:
    stage: str
    rows: int  # the plan's rollouts a micro-batch (ppo_micro_batch_size_per_gpu)
    longest: int  # each padded to the stage's prompt + response at worst
    fsdp_size: int  # GPUs the state is sharded over


# The plan's (rstar pipeline plan --config configs/qwen3-14b.yaml, 64 x 80 GB GPUs)
CASES = [Case("rl1", 1, 10_240, 8), Case("rl2, rl3", 1, 14_336, 8)]
SMALL_CASES = [Case("small", 3, 64, 8)]


def attention_impls(device: str) -> list[str]:
    """PyTorch's attention always; flash-attn where it imports (the GPU lock has none)."""
    impls = ["sdpa"]
    if device == "cuda":
        try:
            import flash_attn  # noqa: F401

            impls.append("flash_attention_2")
        except ImportError:
            pass
    return impls


def build(config: dict, layers: int, impl: str, device: str):
    from transformers import AutoModelForCausalLM, Qwen3Config

    cfg = Qwen3Config(**{**config, "num_hidden_layers": layers})
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(
            cfg, dtype=torch.bfloat16, attn_implementation=impl
        )
    for p in model.parameters():  # FSDP: each gradient reduce-scattered (fp32) and freed
        p.register_post_accumulate_grad_hook(_reduce_scatter)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model.train()


def _reduce_scatter(param) -> None:
    """What FSDP does with a weight's gradient once complete: an fp32 copy for the
    reduce-scatter (verl's reduce dtype), then the unsharded gradient freed; the sharded result
    is the training state's, counted apart."""
    param.grad.float()
    param.grad = None


def verl_log_probs(logits, ids, mask):
    """Log-probs of `ids` as verl 0.9.1's padded path takes them (FSDPEngineWithLMHead, with
    use_remove_padding=false): each row's real tokens cut out of the logits and joined (a copy),
    then log-softmax one token at a time (torch_functional.logprobs_from_logits_v2 on bfloat16)."""
    keep = mask.bool()
    real = torch.cat([row[k] for row, k in zip(logits, keep, strict=True)])
    labels = torch.cat([row[k] for row, k in zip(ids, keep, strict=True)])
    return torch.stack(
        [torch.log_softmax(t, -1)[label] for t, label in zip(real, labels, strict=True)]
    )


def step_peak(model, rows: int, longest: int, padded: bool, device: str) -> float:
    """Peak memory (GB) above the weights of one forward and backward: activations, the
    log-probs as verl takes them, each weight's gradient until its reduce-scatter. `padded`:
    rows x longest with all but the first row shorter (verl's padded micro-batch); else one
    packed row."""
    vocab = model.config.vocab_size
    shape = (rows, longest) if padded else (1, rows * longest)
    ids = torch.randint(0, vocab, shape, device=device)
    mask = torch.ones(shape, dtype=torch.long, device=device)
    if padded:
        for r in range(1, rows):  # right-padded as verl pads, each row shorter than the first
            mask[r, longest * (rows - r) // rows :] = 0
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated() if device == "cuda" else 0
    logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
    logp = verl_log_probs(logits, ids, mask)
    (-logp.float().mean()).backward()
    del logits, logp
    if device != "cuda":
        return float("nan")  # a dry run: the code path, not the memory
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / GB


def gathered_gb(config: dict) -> float:
    """The bf16 weights FSDP holds unsharded beside a micro-batch: the root unit's embeddings
    and head for the whole step, and two layers (the current one, the next prefetched)."""
    layer, root = parameter_counts(config)
    return 2 * (root + 2 * layer) / GB


def probe(config: dict, cases: list[Case], device: str) -> list[dict]:
    layers = config["num_hidden_layers"]
    params = KNOWN["Qwen/Qwen3-14B-Base"].params
    gathered = gathered_gb(config)
    out = []
    for impl in attention_impls(device):
        for padded in (True, False):
            peaks = {}
            for n in (1, 2):
                model = build(config, n, impl, device)
                peaks[n] = [step_peak(model, c.rows, c.longest, padded, device) for c in cases]
                del model
            for i, c in enumerate(cases):
                per_layer = peaks[2][i] - peaks[1][i]
                measured = peaks[1][i] + (layers - 1) * per_layer
                state = 16 * params / c.fsdp_size / GB
                out.append(
                    {
                        "stage": c.stage,
                        "attention": impl,
                        "micro-batch": f"{c.rows} x {c.longest:,} padded"
                        if padded
                        else f"1 x {c.rows * c.longest:,} packed",
                        "one layer GB": per_layer,
                        "measured GB": measured,
                        "plan GB": micro_batch_gb(KNOWN["Qwen/Qwen3-14B-Base"], c.rows * c.longest),
                        "gathered GB": gathered,
                        "with state, gathered and reserve GB": measured
                        + state
                        + gathered
                        + RESERVE_GB,
                    }
                )
    return out


def table(rows: list[dict]) -> str:
    keys = list(rows[0])
    fmt = lambda v: f"{v:.1f}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(fmt(r[k]) for k in keys) + " |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", action="store_true", help="a small shape: proves the script")
    args = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    start = time.monotonic()
    rows = probe(SMALL if args.small else QWEN3_14B, SMALL_CASES if args.small else CASES, device)
    name = torch.cuda.get_device_name(0) if device == "cuda" else "CPU (dry run: no memory)"
    text = (
        f"Qwen3-14B actor memory per GPU on {name}, torch {torch.__version__}: one and two layers "
        f"measured, 40 extrapolated, in {time.monotonic() - start:.0f} s\n\n{table(rows)}"
    )
    sys.stdout.write(text + "\n")  # the script's output (only torch here: no rich)
    return text


if __name__ == "__main__":
    main()
