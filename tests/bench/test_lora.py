"""`rstar bench-lora` on the shipped tiny base: both variants step, LoRA trains only its
adapters, and the section lands in the benchmarks file."""

from pathlib import Path

from rstar.bench.lora import TARGETS, run

TINY_BASE = "models/tiny-base"


def test_lora_trains_only_its_adapters_and_the_section_is_written(tmp_path):
    import json

    out = tmp_path / "benchmarks.md"
    figures = run(TINY_BASE, rows=1, tokens=16, rounds=1, lora_rank=4, out=str(out))
    config = json.loads(Path(TINY_BASE, "config.json").read_text())
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    mlp = config["intermediate_size"]
    kv = hidden // config["num_attention_heads"] * config["num_key_value_heads"]
    # r x (in + out) per adapted projection
    shapes = {
        "q_proj": (hidden, hidden),
        "k_proj": (hidden, kv),
        "v_proj": (hidden, kv),
        "o_proj": (hidden, hidden),
        "gate_proj": (hidden, mlp),
        "up_proj": (hidden, mlp),
        "down_proj": (mlp, hidden),
    }
    assert set(shapes) == set(TARGETS)
    assert figures["LoRA r=4"]["trainable"] == layers * sum(4 * (i + o) for i, o in shapes.values())
    assert figures["full"]["trainable"] > 10 * figures["LoRA r=4"]["trainable"]
    assert all(f["seconds"] > 0 for f in figures.values())
    text = out.read_text()
    assert "<!-- bench-lora:start -->" in text and "| LoRA r=4 |" in text
