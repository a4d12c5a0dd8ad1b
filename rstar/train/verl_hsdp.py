"""verl's gradient accumulation under HSDP: gradients cross nodes once an update, not once a
micro-batch.

Loaded in every verl process through `VERL_USE_EXTERNAL_MODULES` (`verl_launcher.verl_env`).
The plan shards the training state over a node's GPUs and replicates it across nodes (HSDP,
`fsdp_size` 8 of 64). verl 0.9.1 offers two ways to accumulate gradients over an update's
micro-batches: synchronise after each (its default, `use_no_sync_for_gradient_accumulation=
false`: a reduce-scatter inside the node and an all-reduce of each GPU's gradient shard, 7.4 GB
for Qwen3-14B, between the nodes, for each of 128 micro-batches) or skip every synchronisation
until the last (`true`: every GPU keeps the whole model's unsharded fp32 gradients, 59 GB,
which does not fit). FSDP2 has the step between, made for HSDP: reduce-scatter inside the node
after every micro-batch (NVLink) and accumulate the shard; all-reduce across the nodes only
after the last (`set_requires_all_reduce`). Here verl's accumulation does that on a mesh of two
dimensions, and is verl's own on any other (docs/cluster.md has the arithmetic).
"""

from __future__ import annotations

from contextlib import contextmanager

from torch.distributed.tensor import DTensor
from verl.workers.engine.fsdp.transformer_impl import FSDPEngine


def replicated_shards(module) -> bool:
    """Whether `module` is FSDP2 on a mesh of replicas x shards (HSDP)."""
    first = next(module.parameters(), None)
    return isinstance(first, DTensor) and first.device_mesh.ndim == 2


_verl_sync = FSDPEngine._gradient_sync_context


@contextmanager
def _gradient_sync_context(self, *, is_last_micro_batch: bool):
    if is_last_micro_batch or not replicated_shards(self.module):
        with _verl_sync(self, is_last_micro_batch=is_last_micro_batch):
            yield
        return
    self.module.set_requires_all_reduce(False)
    try:
        yield
    finally:
        self.module.set_requires_all_reduce(True)


FSDPEngine._gradient_sync_context = _gradient_sync_context
