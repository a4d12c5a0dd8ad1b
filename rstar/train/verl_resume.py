"""verl's checkpoint load, mended: it reads a checkpoint written on another sharding, and after
a load the optimizer runs at its scheduler's rate.

Loaded in every verl process through `VERL_USE_EXTERNAL_MODULES` (`verl_launcher.verl_env`).
verl 0.9.1's `FSDPCheckpointManager.load_checkpoint` restores the optimizer's state dict and
with it each parameter group's learning rate as it was when the checkpoint was written; the
scheduler sets a new rate only after the next update (`LambdaLR.step`). A stage that carries
the previous stage's optimizer over (`rstar.optimizer_from`, with a scheduler of its own, see
`verl_trainer.optimizer_only`) thus made its first update at the previous stage's last rate,
not at its own warm-up's first (#45 point 6). After every load each group takes the
scheduler's current rate; when a stage resumes its own checkpoint the two are already equal.

verl loads each rank's file as that rank wrote it, so a checkpoint written on another mesh or
world size (a stage sharded otherwise than the one before it, a cluster resized) cannot be
loaded; such a checkpoint is resharded as it is read (rstar.train.verl_reshard).
"""

from __future__ import annotations

from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

from rstar.train.verl_reshard import layout_differs, load_resharded


def rates_from_scheduler(optimizer, scheduler) -> None:
    """Each parameter group of `optimizer` at the rate `scheduler` gives it now."""
    for group, lr in zip(optimizer.param_groups, scheduler.get_last_lr(), strict=True):
        group["lr"] = lr


_verl_load = FSDPCheckpointManager.load_checkpoint


def _load_checkpoint(self, local_path, *args, **kwargs):
    if local_path is not None and layout_differs(self, local_path):
        load_resharded(self, local_path)
    else:
        _verl_load(self, local_path, *args, **kwargs)
    if self.optimizer is not None and self.lr_scheduler is not None:
        rates_from_scheduler(self.optimizer, self.lr_scheduler)


FSDPCheckpointManager.load_checkpoint = _load_checkpoint
