"""GRPO-RoC inside verl's own training step: `python -m rstar.train.verl_trainer <overrides>`.

verl 0.9.1 has two trainers. The v1 trainer (`trainer.use_v1=true`, the default) moves a
step's data through TransferQueue as metadata handles; dropping rows between reward and
advantage would mean rewriting its step. The legacy `RayPPOTrainer` (`use_v1=false`) holds the
whole step in one `DataProto` on the driver and calls `_balance_batch(batch)` right after the
rollouts (with their rewards, `rm_scores`, from the agent loop) are joined to the prompts and
before old log-probs and advantages: the one place where keeping G of 2G rollouts changes
nothing else of verl's step. So this module subclasses the legacy trainer:

- `_balance_batch`: RoC (`rstar.algo.roc.keep_indices`, the local trainer's selection) drops
  the rows in place, then verl balances what is left; before the drop, the step's rollouts
  become trajectory rows (rstar.train.verl_trajectories), written as the local trainer writes
  them (`rstar.trajectories`), whose figures are logged under the local trainer's names
  (rstar.train.metrics: `rollout/*`, `roc/*`), with the p_err/p_format of the kept positives;
- `_update_actor`: PPO mini-batches are `ppo_mini_batch_size` prompts of the *kept* group size;
- `WeightSyncWithDeadline` (verl's `rollout.checkpoint_manager_class`): verl's weight sync to
  the rollout replicas, ended with an error naming the engine and the step when it does not
  finish within `rstar.weight_sync_timeout_s` (verl waits on it for ever);
- `_load_checkpoint`: a stage that starts fresh but names `rstar.optimizer_from` (the previous
  stage's last actor checkpoint) takes its optimizer moments over (`reset_optimizer: false`),
  and only those: not the previous stage's learning-rate schedule or RNG, so its own warm-up
  runs.

Everything else (workers, FSDP, rollout replicas, advantages, loss, checkpoints, loggers) is
verl's. `main` is verl's `main_ppo` entry with this trainer in place of the legacy one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import random
import threading
import time
from contextlib import contextmanager

import numpy as np
import ray
from omegaconf import OmegaConf, open_dict
from verl import DataProto
from verl.checkpoint_engine import CheckpointEngineManager
from verl.trainer.main_ppo_v0 import BaseTaskRunner
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.utils.ray_utils import auto_await

from rstar.algo.roc import RoCConfig, Rollout, keep_indices
from rstar.data.io import write_table
from rstar.logs import configure
from rstar.train.metrics import namespaced, summarize_step
from rstar.train.verl_trajectories import TOKEN_COLUMNS, agent_rows, trajectory_table

log = logging.getLogger(__name__)


def rollouts_of(batch: DataProto, rows: list[dict]) -> list[Rollout]:
    """The batch's rows as RoC reads them: prompt group `uid`, reward (`rm_scores` summed),
    and the penalty counts of the row the agent loop handed on (`rows`: its agent_rows)."""
    nt = batch.non_tensor_batch
    rewards = batch.batch["rm_scores"].sum(-1).tolist()
    return [
        Rollout(
            str(uid),
            reward,
            row["num_tool_calls"],
            row["num_tool_errors"],
            row["num_answers"],
            row["turns"],
        )
        for uid, reward, row in zip(nt["uid"], rewards, rows, strict=True)
    ]


def roc_selection(
    batch: DataProto, rows: list[dict], cfg: RoCConfig, rng: random.Random
) -> tuple[list[int], dict[str, float]]:
    """The indices of the rows of `batch` RoC keeps (`rows`: its agent_rows), and the mean
    penalties of the correct rollouts it kept (what its weighting acts on; the step's other
    figures are rstar.train.metrics', from the trajectory rows)."""
    rollouts = rollouts_of(batch, rows)
    kept_idx = sorted(keep_indices(rollouts, cfg, rng))
    if not kept_idx:
        raise ValueError(
            "RoC kept no rollout of this step (every group was dropped): nothing to train on"
        )
    pos_kept = [rollouts[i].sample() for i in kept_idx if rollouts[i].reward > 0]
    return kept_idx, {
        "roc/p_err_kept_positive": float(np.mean([s.p_err for s in pos_kept])) if pos_kept else 0.0,
        "roc/p_format_kept_positive": float(np.mean([s.p_format for s in pos_kept]))
        if pos_kept
        else 0.0,
    }


def roc_config(config) -> RoCConfig:
    r = config.rstar
    return RoCConfig(mode=r.roc_mode, group_size=int(r.group_size))


class RoCTrainer(RayPPOTrainer):
    """verl's legacy PPO trainer with RoC between rollout and advantage (module docstring)."""

    def _balance_batch(
        self, batch: DataProto, metrics, logging_prefix="global_seqlen", keep_minibatch=False
    ):
        seed = int(self.config.rstar.get("seed", 0))
        stage, step = self.config.trainer.experiment_name, self.global_steps
        agent = agent_rows(batch)
        kept, roc_metrics = roc_selection(
            batch, agent, roc_config(self.config), random.Random(f"{seed}/{step}/roc")
        )
        # every rollout sampled, before RoC drops rows: the step's trajectory file and its
        # figures, computed and named as the local trainer's (rstar.train.metrics)
        start = time.perf_counter()
        table = trajectory_table(batch, agent, stage, step, set(kept))
        where = self.config.rstar.get("trajectories")
        if where:
            write_table(table, f"{where}/step={step:05d}.parquet", "trajectories")
        rows = table.drop_columns(list(TOKEN_COLUMNS)).to_pylist()
        metrics.update(roc_metrics)
        metrics.update(namespaced(summarize_step(rows, [r for r in rows if r["kept"]])))
        metrics["timing_s/rstar_trajectories"] = time.perf_counter() - start
        sub = batch.select_idxs(np.array(kept, dtype=np.int64))
        batch.batch, batch.non_tensor_batch = sub.batch, sub.non_tensor_batch
        return super()._balance_batch(batch, metrics, logging_prefix, keep_minibatch)

    @contextmanager
    def _kept_group_size(self):
        """verl sizes a PPO mini-batch as ppo_mini_batch_size x rollout.n rows; after RoC a
        prompt has group_size rows, not rollout.n."""
        rollout = self.config.actor_rollout_ref.rollout
        sampled = rollout.n
        with open_dict(self.config):
            rollout.n = roc_config(self.config).group_size
        try:
            yield
        finally:
            with open_dict(self.config):
                rollout.n = sampled

    def _update_actor(self, batch: DataProto) -> DataProto:
        with self._kept_group_size():
            return super()._update_actor(batch)

    def init_workers(self):
        super().init_workers()
        self.checkpoint_manager.deadline_s = float(self.config.rstar.weight_sync_timeout_s)
        self.checkpoint_manager.engine = self.config.actor_rollout_ref.rollout.name

    def _load_checkpoint(self):
        step = super()._load_checkpoint()
        source = self.config.rstar.get("optimizer_from")
        if step == 0 and source:
            log.info("[rstar] optimizer state from the previous stage: %s", source)
            view = os.path.join(self.config.trainer.default_local_dir, "optimizer_from")
            self.actor_rollout_wg.load_checkpoint(
                optimizer_only(source, view), del_local_after_load=False
            )
        return step


def optimizer_only(source: str, view: str) -> str:
    """`view`: actor checkpoint `source` as verl's `load_checkpoint` should read it when a stage
    carries the previous one's optimizer over. verl loads weights, optimizer and "extra" state
    together; the extra state holds the previous stage's learning-rate scheduler (past its
    warm-up) and RNG. The view links the weight and optimizer shards (the weights are those
    the stage starts from anyway) and puts extra-state files with neither, which verl skips."""
    import torch

    os.makedirs(view, exist_ok=True)
    for name in os.listdir(source):
        target = os.path.join(view, name)
        if name.startswith("extra_state_"):
            torch.save({"lr_scheduler": None}, target)
        elif name.startswith(("model_world_size_", "optim_world_size_")) and not os.path.lexists(
            target
        ):
            os.symlink(os.path.join(source, name), target)
    return view


class WeightSyncFailed(RuntimeError):
    pass


class WeightSyncWithDeadline(CheckpointEngineManager):
    """verl's weight sync from the actor to the rollout replicas, with a deadline. A replica
    that cannot take the weights (vLLM's CPU build without rstar.rollout.vllm_cpu, a dead
    server) leaves verl waiting for ever inside a blocking call; here the sync runs in a thread
    and the trainer gives up after `deadline_s`. Either way a failed sync ends the run with an
    error naming the engine and the step."""

    deadline_s = 600.0
    engine = "rollout"

    @auto_await
    async def update_weights(self, global_steps: int | None = None):
        # verl's sync blocks inside (ray.get): run it in a thread of its own, where it has a loop
        # of its own. A daemon thread, not the loop's executor, whose shutdown would wait on a
        # sync that never returns.
        done: concurrent.futures.Future = concurrent.futures.Future()

        def sync() -> None:
            try:
                done.set_result(super(WeightSyncWithDeadline, self).update_weights(global_steps))
            except BaseException as e:  # noqa: BLE001 - handed to the waiting loop
                done.set_exception(e)

        threading.Thread(target=sync, name="verl-weight-sync", daemon=True).start()
        where = f"verl's weight sync to the {self.engine} rollout replicas at step {global_steps}"
        try:
            return await asyncio.wait_for(asyncio.wrap_future(done), self.deadline_s)
        except TimeoutError:
            raise WeightSyncFailed(
                f"{where} did not finish within {self.deadline_s:g} s (a replica that cannot "
                "take the weights: see its log above)"
            ) from None
        except Exception as e:
            raise WeightSyncFailed(f"{where} failed: {e!r}") from e


@ray.remote
class RoCTaskRunner(BaseTaskRunner):
    """verl's task runner (workers, datasets, resource pools), building `RoCTrainer`."""

    def run(self, config):
        from verl.trainer.ppo.utils import create_rl_dataset, create_rl_sampler
        from verl.utils.config import omega_conf_to_dataclass
        from verl.utils.dataset.rl_dataset import collate_fn

        # an actor process of verl's: rstar's log lines at the stage's level (rstar.logs)
        configure()
        OmegaConf.resolve(config)
        _, group_cls = self.add_actor_rollout_worker(config)
        self.add_critic_worker(config)
        self.add_reward_model_resource_pool(config)
        model = omega_conf_to_dataclass(config.actor_rollout_ref.model)
        datasets = [
            create_rl_dataset(files, config.data, model.tokenizer, model.processor, is_train=train)
            for files, train in ((config.data.train_files, True), (config.data.val_files, False))
        ]
        trainer = RoCTrainer(
            config=config,
            tokenizer=model.tokenizer,
            processor=model.processor,
            role_worker_mapping=self.role_worker_mapping,
            resource_pool_manager=self.init_resource_pool_mgr(config),
            ray_worker_group_cls=group_cls,
            train_dataset=datasets[0],
            val_dataset=datasets[1],
            collate_fn=collate_fn,
            train_sampler=create_rl_sampler(config.data, datasets[0]),
        )
        trainer.init_workers()
        trainer.fit()


def check_roc_runs(config) -> None:
    """Refuse a verl config under which RoC would silently not run (all 2G rollouts trained,
    mini-batches sized for G)."""
    if config.trainer.use_v1:
        raise ValueError("rstar's RoC runs in verl's legacy trainer: set trainer.use_v1=false")
    if not config.trainer.balance_batch:
        raise ValueError(
            "rstar's RoC runs inside verl's _balance_batch, which trainer.balance_batch=false "
            "skips: set trainer.balance_batch=true"
        )


def main(config) -> None:
    """verl's main_ppo (device detection, validate_config before Ray starts, run_ppo) with
    RoCTaskRunner."""
    from verl.trainer.main_ppo import run_ppo
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    check_roc_runs(config)
    auto_set_device(config)
    validate_config(
        config=config,
        use_reference_policy=need_reference_policy(config),
        use_critic=need_critic(config),
    )
    run_ppo(config, task_runner_class=RoCTaskRunner)


if __name__ == "__main__":
    import hydra

    hydra.main(
        config_path="pkg://verl.trainer.config", config_name="ppo_trainer", version_base=None
    )(main)()
