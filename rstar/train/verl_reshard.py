"""A verl FSDP checkpoint read into another sharding than the one that wrote it.

verl 0.9.1 saves one file per rank (`model_world_size_W_rank_R.pt`, `optim_...`) holding that
rank's DTensor shards, and loads each rank's file as it is: a stage sharded otherwise than the
one that wrote the checkpoint (as the 14B plan once sharded rl1 over 8 GPUs and rl2, which
carries rl1's optimizer, over 16; or a cluster resized between stages) fails to copy the weights
("inputs with different meshes"), or loads the optimizer and fails at its first AdamW step.
Here each rank builds its own shard of every tensor from the saved ranks' pieces that overlap
it, whatever the saved mesh (its shape, its world size, the dimension it shards), and the state
dicts go to the model and optimizer as verl would hand them. The files are opened
memory-mapped: a rank reads only the rows it needs, from at most a few of the saved ranks'
files.
"""

from __future__ import annotations

import itertools
import math
import os
import re
from collections.abc import Callable

import torch
from torch.distributed.tensor import DTensor, Replicate, Shard

_FILE = re.compile(r"(model|optim)_world_size_(\d+)_rank_(\d+)\.pt$")


class SavedRanks:
    """The per-rank files of one kind ("model" or "optim") of a checkpoint directory, each
    loaded (memory-mapped) the first time a tensor of it is needed."""

    def __init__(self, directory: str, kind: str):
        found = [
            (m, name)
            for name in os.listdir(directory)
            if (m := _FILE.match(name)) and m.group(1) == kind
        ]
        self.files = {int(m.group(3)): os.path.join(directory, name) for m, name in found}
        sizes = {int(m.group(2)) for m, _ in found}
        if not self.files or len(sizes) != 1 or set(self.files) != set(range(len(self.files))):
            raise FileNotFoundError(
                f"{directory}: no complete set of {kind}_world_size_W_rank_R.pt files to reshard "
                f"from (ranks {sorted(self.files)}, world sizes {sorted(sizes)})"
            )
        self.world_size = sizes.pop()
        self._loaded: dict[int, object] = {}

    def state(self, rank: int):
        if rank not in self._loaded:
            self._loaded[rank] = torch.load(
                self.files[rank], map_location="cpu", mmap=True, weights_only=False
            )
        return self._loaded[rank]


def _shard_dim(placements) -> tuple[int, int] | None:
    """(mesh dimension, tensor dimension) of the one Shard among `placements`; None when the
    tensor is replicated. FSDP2 (and HSDP: Replicate, Shard) shard one dimension."""
    shards = [(i, p.dim) for i, p in enumerate(placements) if isinstance(p, Shard)]
    if any(not isinstance(p, (Shard, Replicate)) for p in placements) or len(shards) > 1:
        raise NotImplementedError(f"placements {placements}: only Replicate and one Shard")
    return shards[0] if shards else None


def chunk(size: int, parts: int, index: int) -> tuple[int, int]:
    """[start, stop) of piece `index` of `size` rows split as torch.chunk splits them (DTensor's
    Shard: pieces of ceil(size / parts), the last ones short or empty)."""
    step = math.ceil(size / parts)
    return min(size, index * step), min(size, (index + 1) * step)


Box = list[tuple[int, int]]  # [start, stop) along each dimension of a tensor


def _box(shape, mesh_shape, placements, coordinate) -> Box:
    """What the shard at mesh `coordinate` holds of a tensor of `shape`."""
    box = [(0, n) for n in shape]
    sharded = _shard_dim(placements)
    if sharded is not None:
        mesh_dim, dim = sharded
        box[dim] = chunk(shape[dim], mesh_shape[mesh_dim], coordinate[mesh_dim])
    return box


def _holders(saved: DTensor, for_rank: int) -> list[tuple[int, Box]]:
    """One saved rank per distinct shard of `saved`, with what it holds: of the replicas holding
    a shard, the one at `for_rank` modulo their count, so that ranks spread their reads over
    the replicas' files."""
    ranks = saved.device_mesh.mesh
    owners: dict[tuple, list[int]] = {}
    for coordinate in itertools.product(*map(range, ranks.shape)):
        box = _box(saved.shape, ranks.shape, saved.placements, coordinate)
        owners.setdefault(tuple(box), []).append(int(ranks[coordinate]))
    return [(held[for_rank % len(held)], list(box)) for box, held in owners.items()]


def _within(box: Box, origin: Box) -> tuple[slice, ...]:
    """`box` as an index into a tensor holding `origin`."""
    return tuple(slice(lo - o, hi - o) for (lo, hi), (o, _) in zip(box, origin, strict=True))


def reshard(saved: DTensor, target: DTensor, piece: Callable[[int], DTensor], rank: int) -> DTensor:
    """`saved` (a DTensor as one rank's file holds it) as a DTensor on `target`'s mesh and
    placements, this rank's shard filled from the saved ranks' shards that overlap it
    (`piece(saved_rank)`: the same tensor in that rank's file)."""
    if tuple(saved.shape) != tuple(target.shape):
        raise ValueError(f"saved shape {tuple(saved.shape)} against {tuple(target.shape)} here")
    mesh = target.device_mesh
    mine = _box(target.shape, mesh.mesh.shape, target.placements, mesh.get_coordinate())
    local = torch.empty([hi - lo for lo, hi in mine], dtype=saved.dtype)
    for holder, held in _holders(saved, rank):
        both = [(max(a, c), min(b, d)) for (a, b), (c, d) in zip(mine, held, strict=True)]
        if any(lo >= hi for lo, hi in both):
            continue
        local[_within(both, mine)] = piece(holder).to_local()[_within(both, held)]
    return DTensor.from_local(
        local, mesh, target.placements, run_check=False, shape=target.shape, stride=target.stride()
    )


def same_layout(saved: DTensor, target: DTensor) -> bool:
    return saved.placements == target.placements and torch.equal(
        saved.device_mesh.mesh, target.device_mesh.mesh
    )


def _walk(tree, path=()):
    """(path, leaf) of every DTensor in nested dicts and lists."""
    if isinstance(tree, DTensor):
        yield path, tree
    elif isinstance(tree, dict):
        for k, v in tree.items():
            yield from _walk(v, (*path, k))
    elif isinstance(tree, list | tuple):
        for i, v in enumerate(tree):
            yield from _walk(v, (*path, i))


def _at(tree, path):
    for key in path:
        tree = tree[key]
    return tree


def _put(tree, path, value) -> None:
    _at(tree, path[:-1])[path[-1]] = value


def resharded(saved: SavedRanks, rank: int, template: Callable[[tuple], DTensor]):
    """This rank's state dict of `saved`'s kind on today's sharding: the structure and every
    non-DTensor value of a saved rank's file (this rank's, when the saved world has it), each
    DTensor rebuilt on the layout of `template(path)`. Tensors already laid out as here are
    taken as they are."""
    state = saved.state(rank if rank < saved.world_size else 0)
    for path, leaf in list(_walk(state)):
        target = template(path)
        if same_layout(leaf, target):
            continue
        try:
            value = reshard(leaf, target, lambda r, p=path: _at(saved.state(r), p), rank)
        except (ValueError, NotImplementedError) as e:
            raise ValueError(f"{'.'.join(map(str, path))}: cannot reshard: {e}") from None
        _put(state, path, value)
    return state


def _templates(manager, kind: str) -> Callable[[tuple], DTensor]:
    """The live DTensor each saved tensor of `kind` becomes: a model entry the model's own; an
    optimizer entry ({"state": {param index: {"exp_avg": ...}}}) its parameter's."""
    if kind == "model":
        live = manager.model.state_dict()
        return lambda path: live[path[0]]
    params = [p for group in manager.optimizer.param_groups for p in group["params"]]
    return lambda path: params[path[1]]


def layout_differs(manager, directory: str) -> bool:
    """Whether the checkpoint in `directory` was written on another sharding than `manager`'s:
    this rank's file is missing (another world size) or its first DTensor lies on another mesh
    or placements."""
    kind = "model" if manager.should_load_model else "optim"
    own = os.path.join(directory, f"{kind}_world_size_{manager.world_size}_rank_{manager.rank}.pt")
    if not os.path.exists(own):
        return True
    state = torch.load(own, map_location="cpu", mmap=True, weights_only=False)
    first = next(_walk(state), None)
    return first is not None and not same_layout(first[1], _templates(manager, kind)(first[0]))


def load_resharded(manager, directory: str) -> None:
    """What verl's FSDPCheckpointManager.load_checkpoint loads, the model and optimizer built on
    this rank's sharding from `directory`'s files of any other. The extra state (scheduler, RNG)
    is this rank's file's; when the saved world had no such rank, rank 0's scheduler (the same
    on every rank) and no RNG state (a rank's stream has no heir in another world size)."""
    rank = manager.rank
    if manager.should_load_model:
        saved = SavedRanks(directory, "model")
        manager.model.load_state_dict(resharded(saved, rank, _templates(manager, "model")))
    if manager.should_load_optimizer:
        saved = SavedRanks(directory, "optim")
        state = resharded(saved, rank, _templates(manager, "optim"))
        manager.optimizer.load_state_dict(manager._backfill_optimizer_state(state))
    if manager.should_load_extra:
        name = "extra_state_world_size_{}_rank_{}.pt"
        path = os.path.join(directory, name.format(manager.world_size, rank))
        own = os.path.exists(path)
        if not own:
            world = SavedRanks(directory, "model" if manager.should_load_model else "optim")
            path = os.path.join(directory, name.format(world.world_size, 0))
        extra = torch.load(path, map_location="cpu", weights_only=False)
        if own and "rng" in extra:
            manager.load_rng_state(extra["rng"])
        if extra.get("lr_scheduler") is not None and manager.lr_scheduler is not None:
            manager.lr_scheduler.load_state_dict(extra["lr_scheduler"])
    torch.distributed.barrier()
