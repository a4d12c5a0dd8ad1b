"""verl's FSDP2 over several ranks as the 14B plan shards it: 4 gloo ranks train a Qwen3-shaped
model (untied embeddings, q/k norm; rows that do not split evenly) with verl's own FSDP2
wrapping, meshes, checkpoint manager, schedule and gradient accumulation, mended by the modules
verl's processes load (rstar.train.verl_resume, verl_reshard, verl_hsdp, verl_warmup). One set
of processes runs every check (their imports are most of the time); each test reads its
check's outcome."""

from __future__ import annotations

import datetime
import os
import socket
import traceback
from types import SimpleNamespace

import pytest
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

    # the view is made once, by the trainer's driver, before the workers load it
    view = os.path.join(root, f"view-{save_fsdp}-{load_fsdp}")
    if rank == 0:
        optimizer_only(saved, view)
    torch.distributed.barrier()
    model, optimizer = _model(1, _mesh(load_fsdp))
    FSDPCheckpointManager(model, optimizer).load_checkpoint(view)
    _step(model, optimizer, rank, 2)
    for name, value in _full(model).items():
        where = f"{name} after {save_fsdp} -> {load_fsdp}"
        torch.testing.assert_close(value, expected[name], msg=lambda m, w=where: f"{w}: {m}")


def _accumulate(rank: int, root: str) -> None:
    """An update of two micro-batches under HSDP (2 replicas x 2 shards), through verl's engine's
    own accumulation (`FSDPEngine._gradient_sync_context`, as verl_hsdp leaves it): after the
    first micro-batch no gradient has been all-reduced across the replicas (none assigned yet),
    after the last the gradients equal those of verl's synchronise-every-micro-batch."""
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngine

    from rstar.train.verl_hsdp import _verl_sync

    model, _ = _model(0, _mesh(2))
    engine = SimpleNamespace(
        module=model,
        engine_config=SimpleNamespace(use_no_sync_for_gradient_accumulation=False),
    )

    def update(sync):
        model.zero_grad(set_to_none=True)
        for micro_batch, last in ((0, False), (1, True)):
            tokens = torch.randint(
                0, 51, (2, 7), generator=torch.Generator().manual_seed(100 * micro_batch + rank)
            )
            with sync(engine, is_last_micro_batch=last):
                model(tokens).logits.square().mean().backward()
            if not last:
                held = [p.grad is None for p in model.parameters()]
        return held, {n: p.grad.full_tensor() for n, p in model.named_parameters()}

    held, every = update(_verl_sync)
    assert not any(held), "verl's own accumulation synchronises every micro-batch"
    held, once = update(FSDPEngine._gradient_sync_context)
    assert all(held), "the first micro-batch's gradients were all-reduced across the replicas"
    for name, grad in once.items():
        torch.testing.assert_close(grad, every[name], msg=lambda m, n=name: f"{n}: {m}")


def _reshard(rank: int, root: str) -> None:
    _carry(rank, root, save_fsdp=2, load_fsdp=4)  # rl1 within a node -> over two nodes
    _carry(rank, root, save_fsdp=4, load_fsdp=2)


def _first_rate(rank: int, root: str) -> None:
    """A stage that takes a previous stage's optimizer (written at rate 1e-2 by `_reshard`)
    starts at its own warm-up's first rate, 1/4 of 1e-2 with verl's constant schedule of 4
    warm-up steps: not the previous stage's last rate (verl restores it with the moments), not 0
    (verl's warm-up starts there)."""
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager
    from verl.utils.torch_functional import get_constant_schedule_with_warmup

    model, optimizer = _model(1, _mesh(4))
    schedule = get_constant_schedule_with_warmup(optimizer, num_warmup_steps=4)
    FSDPCheckpointManager(model, optimizer, schedule).load_checkpoint(
        os.path.join(root, "view-2-4")
    )
    assert [g["lr"] for g in optimizer.param_groups] == [1e-2 / 4] * len(optimizer.param_groups)


CHECKS = {"reshard": _reshard, "accumulate": _accumulate, "first_rate": _first_rate}


def _rank(rank: int, port: int, root: str) -> None:
    import torch.distributed as dist

    # what verl's processes on the CPU import (verl_launcher.external_modules)
    os.environ["VERL_PLATFORM"] = "cpu"
    import rstar.train.verl_cpu
    import rstar.train.verl_hsdp
    import rstar.train.verl_resume
    import rstar.train.verl_warmup  # noqa: F401

    torch.set_num_threads(1)
    # a check that fails on one rank leaves the others waiting in a collective: not for ever
    dist.init_process_group(
        "gloo",
        f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=RANKS,
        timeout=datetime.timedelta(seconds=120),
    )
    try:
        for name, check in CHECKS.items():
            try:
                check(rank, root)
            except Exception:  # noqa: BLE001 - the check's test reports it
                with open(os.path.join(root, f"{name}.rank{rank}.error"), "w") as f:
                    f.write(traceback.format_exc())
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> str:
    import torch.multiprocessing as mp

    root = str(tmp_path_factory.mktemp("ranks"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank, args=(port, root), nprocs=RANKS)
    return root


def _errors(root: str, check: str) -> str:
    return "".join(
        open(os.path.join(root, name)).read()
        for name in sorted(os.listdir(root))
        if name.startswith(f"{check}.rank")
    )


def test_a_checkpoint_written_on_one_mesh_loads_and_trains_on_another(ranks):
    """verl alone fails here: the weights with 'inputs with different meshes', the moments at the
    first AdamW step."""
    assert not _errors(ranks, "reshard")


def test_hsdp_gradients_cross_replicas_once_an_update_and_equal_verls(ranks):
    assert not _errors(ranks, "accumulate")


def test_a_carried_optimizer_starts_at_the_stages_own_first_warm_up_rate(ranks):
    assert not _errors(ranks, "first_rate")
