"""A verl checkpoint carried across a change of sharding, as the 14B plan's rl1 -> rl2 does
(rstar.train.verl_reshard): 4 gloo ranks train a Qwen3-shaped model (untied embeddings, q/k
norm; rows that do not split evenly) with verl's own FSDP2 wrapping and checkpoint manager."""

from __future__ import annotations

import os
import socket

import torch

from rstar.train.verl_reshard import chunk

RANKS = 4


def test_chunk_splits_as_torch_chunk_does():
    for size in range(12):
        for parts in range(1, 6):
            pieces = torch.arange(size).chunk(parts) if size else ()
            got = [chunk(size, parts, i) for i in range(parts)]
            want = [(int(p[0]), int(p[-1]) + 1) for p in pieces if len(p)]
            assert [g for g in got if g[0] < g[1]] == want


def _model(seed: int, mesh):
    from transformers import Qwen3Config, Qwen3ForCausalLM
    from verl.utils.fsdp_utils import apply_fsdp2

    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=51,
        hidden_size=16,
        intermediate_size=24,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        tie_word_embeddings=False,
    )
    model = Qwen3ForCausalLM(config)
    apply_fsdp2(model, {"mesh": mesh}, {})
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def _mesh(fsdp_size: int):
    """verl's own mesh for `fsdp_size` (HSDP below the world size)."""
    from verl.workers.engine.fsdp.utils import create_device_mesh

    return create_device_mesh(RANKS, fsdp_size)


def _step(model, optimizer, rank: int, step: int) -> None:
    tokens = torch.randint(0, 51, (2, 7), generator=torch.Generator().manual_seed(10 * step + rank))
    model(tokens).logits.square().mean().backward()
    optimizer.step()
    optimizer.zero_grad()


def _full(model) -> dict[str, torch.Tensor]:
    return {k: v.full_tensor().clone() for k, v in model.state_dict().items()}


def _carry(rank: int, root: str, save_fsdp: int, load_fsdp: int) -> None:
    """Train two steps sharded over `save_fsdp` ranks, checkpoint after the first; then a model
    sharded over `load_fsdp` (other initial weights) takes the checkpoint's weights and AdamW
    moments as a next stage does (verl_trainer.optimizer_only) and takes the second step: the
    weights must be those of the run that never changed its sharding."""
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

    from rstar.train.verl_trainer import optimizer_only

    saved = os.path.join(root, f"{save_fsdp}-{load_fsdp}")
    model, optimizer = _model(0, _mesh(save_fsdp))
    _step(model, optimizer, rank, 1)
    FSDPCheckpointManager(model, optimizer).save_checkpoint(saved, global_step=1)
    _step(model, optimizer, rank, 2)
    expected = _full(model)

    model, optimizer = _model(1, _mesh(load_fsdp))
    FSDPCheckpointManager(model, optimizer).load_checkpoint(
        optimizer_only(saved, os.path.join(root, f"view-{save_fsdp}-{load_fsdp}"))
    )
    _step(model, optimizer, rank, 2)
    for name, value in _full(model).items():
        where = f"{name} after {save_fsdp} -> {load_fsdp}"
        torch.testing.assert_close(value, expected[name], msg=lambda m, w=where: f"{w}: {m}")


def _rank(rank: int, port: int, root: str) -> None:
    import torch.distributed as dist

    # what verl's processes on the CPU import (verl_launcher.external_modules): the CPU platform
    # and the patched checkpoint load
    os.environ["VERL_PLATFORM"] = "cpu"
    import rstar.train.verl_cpu
    import rstar.train.verl_resume  # noqa: F401

    torch.set_num_threads(1)
    dist.init_process_group("gloo", f"tcp://127.0.0.1:{port}", rank=rank, world_size=RANKS)
    try:
        _carry(rank, root, save_fsdp=2, load_fsdp=4)  # rl1 within a node -> rl2 over two
        _carry(rank, root, save_fsdp=4, load_fsdp=2)
    finally:
        dist.destroy_process_group()


def test_a_checkpoint_written_on_one_mesh_loads_and_trains_on_another(tmp_path):
    """verl alone fails here: the weights with 'inputs with different meshes', the moments at the
    first AdamW step."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank, args=(port, str(tmp_path)), nprocs=RANKS)
