"""SFT on the cluster path: verl's Ray SFT trainer (`verl.trainer.sft_trainer_ray`: training
processes as a Ray worker group, FSDP2) on the recipe's chats.

`python -m rstar.train.verl_sft <overrides>` is verl's SFT entry with two things of this
project's: the chats are tokenized exactly as the local SFT tokenizes them
(`rstar.train.sft.encode_example`: the RL system prompt and tools block, loss on assistant
tokens only, never on tool responses), through verl's `data.custom_cls` hook; and Ray is
started with the training slots verl's CPU platform needs (rstar.train.verl_cpu) when it runs
on this machine. verl writes its FSDP checkpoint (every epoch; a retry resumes from the last)
and the stage merges it into a Hugging Face directory with verl's model merger.
"""

from __future__ import annotations

import json
import os
import sys

import torch
from torch.utils.data import Dataset

from rstar.data.io import read_table
from rstar.train.config import SFTConfig
from rstar.train.gpu_sizing import SFTSettings, sft_micro_batch_tokens
from rstar.train.hydra_override import value as hydra_value
from rstar.train.sft import encode_example
from rstar.train.verl_launcher import FP32

ENTRY = "rstar.train.verl_sft"


class SFTChats(Dataset):
    """verl's `data.custom_cls`: rows of the `sft` schema as unpadded examples (`input_ids`,
    `position_ids`, `loss_mask`: 1 on the tokens the loss is taken on)."""

    def __init__(
        self, parquet_files, tokenizer, config, processor=None, max_samples: int = -1
    ) -> None:
        files = [parquet_files] if isinstance(parquet_files, str) else list(parquet_files)
        rows = [r for f in files for r in read_table(f, "sft").to_pylist()]
        rows = rows[:max_samples] if max_samples and max_samples > 0 else rows
        style = config.get("prompt_style", "paper")
        encoded = (
            encode_example(tokenizer, json.loads(r["messages"]), config.max_length, style)
            for r in rows
        )
        # a chat cut before any assistant token teaches nothing
        self.examples = [e for e in encoded if sum(e[1])]
        if not self.examples:
            raise ValueError(
                f"{files}: no chat has an assistant token within max_length {config.max_length}"
            )

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, i: int) -> dict:
        ids, mask = self.examples[i]
        return {
            "input_ids": torch.tensor(ids),
            "position_ids": torch.arange(len(ids)),
            "loss_mask": torch.tensor(mask),
        }


def sft_overrides(
    cfg: SFTConfig,
    *,
    model: str,
    train_files: str,
    out_dir: str,
    n_gpus: int,
    nodes: int = 1,
    experiment: str = "rstar",
    device: str = "gpu",
    gpu: SFTSettings | None = None,
) -> list[str]:
    """Hydra overrides of verl's `sft_trainer_engine` config that reproduce `cfg`: the same
    batch (examples per optimizer step), epochs, cosine schedule with warm-up, clipping and
    weight decay as the local SFT; micro-batches sized by tokens (two full-length chats per GPU).
    `gpu`: the sharding sized for the GPUs (rstar.train.gpu_sizing.size_sft)."""
    if cfg.replay_rows:
        raise ValueError(
            "sft.train.replay_rows (pretraining text replayed during SFT) is the embedded "
            "trainer's; with engine verl set it to 0"
        )
    overrides = [
        f"model.path={hydra_value(model)}",
        f"data.train_files={hydra_value(train_files)}",
        f"data.train_batch_size={cfg.batch_size}",
        "data.pad_mode=no_padding",
        "data.use_dynamic_bsz=true",
        f"data.max_token_len_per_gpu={sft_micro_batch_tokens(cfg.max_length)}",
        f"data.micro_batch_size_per_gpu={cfg.micro_batch_size}",
        f"data.max_length={cfg.max_length}",
        f"data.custom_cls.path=pkg://{ENTRY}",
        "data.custom_cls.name=SFTChats",
        f"+data.prompt_style={cfg.prompt_style}",
        "engine.strategy=fsdp2",
        f"optim.lr={cfg.lr}",
        "optim.lr_scheduler_type=cosine",
        f"optim.lr_warmup_steps_ratio={cfg.warmup_ratio}",
        f"optim.weight_decay={cfg.weight_decay}",
        f"optim.clip_grad={cfg.max_grad_norm}",
        f"trainer.total_epochs={cfg.epochs}",
        f"trainer.seed={cfg.seed}",
        f"trainer.default_local_dir={hydra_value(out_dir)}",
        "trainer.save_freq=after_each_epoch",
        "trainer.max_ckpt_to_keep=1",
        "trainer.resume_mode=auto",
        f"trainer.n_gpus_per_node={n_gpus}",
        f"trainer.nnodes={nodes}",
        "trainer.logger=[console,mlflow]",
        f"trainer.project_name={hydra_value(experiment)}",
        "trainer.experiment_name=sft",
        # PyTorch's own attention, padded, on every device as in the RL stages: verl's default
        # is flash-attn (and removing the padding needs it), which the GPU lock does not have,
        # so the model would fail to build on the first GPU stage
        "model.use_remove_padding=false",
        "+model.override_config.attn_implementation=sdpa",
    ]
    # verl on CPU ranks (rstar.train.verl_cpu): float32, no fused kernels
    if device == "cpu":
        overrides += [
            "trainer.device=cpu",
            "engine.dtype=float32",
            f"+engine.mixed_precision={FP32}",
            "engine.use_torch_compile=false",
        ]
    if gpu:  # the GPU settings, on CPU ranks in a rehearsal
        return overrides + gpu.overrides()
    # alone on this machine's CPU: a small model, nothing to save by recomputing
    return overrides + (["model.enable_gradient_checkpointing=false"] if device == "cpu" else [])


def sft_command(cfg: SFTConfig, **kwargs) -> list[str]:
    """`python -m rstar.train.verl_sft` with the overrides for `cfg` (kwargs: sft_overrides')."""
    return [sys.executable, "-m", ENTRY, *sft_overrides(cfg, **kwargs)]


def last_checkpoint(out_dir: str) -> str:
    """verl's newest `global_step_N` folder under `out_dir`."""
    steps = [int(d.rsplit("_", 1)[1]) for d in os.listdir(out_dir) if d.startswith("global_step_")]
    if not steps:
        raise FileNotFoundError(f"verl's SFT trainer wrote no checkpoint under {out_dir}")
    return os.path.join(out_dir, f"global_step_{max(steps)}")


def main(config) -> None:
    """verl's `run_sft`, with Ray started here: joining the cluster (RAY_ADDRESS; GPUs, or CPU
    ranks in a rehearsal), or on this machine's CPU a Ray of its own declaring one slot per
    training process."""
    import ray
    from omegaconf import OmegaConf
    from verl.trainer.sft_trainer_ray import SFTTrainer
    from verl.utils.device import auto_set_device

    auto_set_device(config)
    # what the stage puts in the job (rstar.pipeline.verl_stages.ray_job_env): the workers'
    # environment, which on a cluster they do not inherit from this process
    job = OmegaConf.to_container(config.ray_kwargs.ray_init) if "ray_kwargs" in config else {}
    if config.trainer.device == "cpu" and not os.environ.get("RAY_ADDRESS"):
        processes = config.trainer.n_gpus_per_node * config.trainer.nnodes
        # CPUs are logical here: verl's SFT resource pool asks 10 per training process's bundle
        ray.init(
            num_gpus=processes,
            num_cpus=10 * processes + 2,
            object_store_memory=500_000_000,
            include_dashboard=False,
            **job,
        )
    else:
        ray.init(**job)
    SFTTrainer(config=config).fit()


if __name__ == "__main__":
    import hydra

    hydra.main(
        config_path="pkg://verl.trainer.config", config_name="sft_trainer_engine", version_base=None
    )(main)()
