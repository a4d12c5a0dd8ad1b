"""The cluster path: the same stage config run by verl on Ray (FSDP actor, vLLM rollouts).

What it plugs into verl:
- the agent loop `rstar_agent` (rstar.agent.verl_adapter.RStarAgentLoop), named by each
  dataset row's `agent_name` and registered through an agent-loop config file;
- the answer-only reward as verl's custom reward function (`compute_score`);
- GRPO advantages with clip-higher, token-mean loss, no KL, no entropy bonus, via config;
- RoC down-sampling inside verl's step: the command runs `rstar.train.verl_trainer` (verl's
  main_ppo with a trainer that keeps G of the 2G rollouts per prompt before advantages).

`build_verl_run` writes the dataset and agent-loop files and returns the `python -m
rstar.train.verl_trainer ...` command with its Hydra overrides.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import asdict

from rstar.agent.format import problem_messages
from rstar.data.io import read_table
from rstar.rollout.vllm_engine import CPU_KV_CACHE_BYTES, cpu_kv_cache_bytes
from rstar.train.config import RLConfig
from rstar.train.gpu_sizing import GPUSettings
from rstar.train.hydra_override import value as hydra_value

# the prompt length verl pads to when it cannot be measured (no model on local disk, a plan)
DEFAULT_PROMPT_TOKENS = 2048
# 14B's 29.5 GB of bf16 weights take seconds over NCCL, a minute or two through host memory
WEIGHT_SYNC_TIMEOUT_S = 600

# FSDP computes in bfloat16 unless told otherwise: on a CPU without bfloat16 matrix units that
# made verl's SFT steps here 5x slower (12.3 s against 2.5 s a step, the same batches)
FP32 = "{param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}"


def to_verl_rows(problems: list[dict], prompt_style: str = "paper") -> list[dict]:
    """Problems in the layout verl's RLHFDataset reads."""
    return [
        {
            "data_source": p["source"],
            "agent_name": "rstar_agent",
            "prompt": problem_messages(p["problem"], prompt_style),
            "reward_model": {"style": "rule", "ground_truth": p["answer"]},
            "extra_info": {"index": i, "problem": p["problem"], "problem_id": p["id"]},
        }
        for i, p in enumerate(problems)
    ]


def _hydra_dict(values: dict) -> str:
    """A flat dict as a Hydra override's value: {key:value,...}."""
    return "{" + ",".join(f"{k}:{v}" for k, v in values.items()) + "}"


def verl_overrides(
    cfg: RLConfig,
    *,
    model: str,
    train_files: str,
    agent_loop_config: str,
    sandbox_url: str,
    out_dir: str,
    n_gpus: int,
    nodes: int = 1,
    max_prompt_length: int = DEFAULT_PROMPT_TOKENS,
    val_files: str | None = None,
    experiment: str = "rstar",
    router_config: str | None = None,
    optimizer_from: str | None = None,
    trajectories: str | None = None,
    device: str = "gpu",
    gpu: GPUSettings | None = None,
) -> list[str]:
    """Hydra overrides for verl's main_ppo that reproduce `cfg` (paper defaults otherwise).

    Micro-batches hold a fixed number of rollouts (on GPUs as many as fit padded, sized by
    rstar.train.gpu_sizing; on the CPU one), so their memory is bounded whatever the lengths.
    Validation runs on `val_files` (the held-out set) after the last step only; without it,
    never. Metrics go to the console and to MLflow (the run named by MLFLOW_RUN_ID, the
    stage's own, when the launcher sets it). `router_config`: the KV-balanced load balancer's
    YAML (rstar.rollout.verl_router); `optimizer_from`: the previous stage's actor checkpoint,
    whose optimizer state this stage takes over (`reset_optimizer: false`); `trajectories`: the
    directory or s3:// prefix that gets each step's rollouts (Parquet). `gpu`: the GPU
    settings sized for this stage (rstar.train.gpu_sizing); `device="cpu"`: verl on this
    machine's CPU (`cpu_overrides`; with `gpu` too, CPU ranks standing for GPUs: a rehearsal)."""
    if cfg.roc.mode == "released":
        raise ValueError(
            f"{cfg.name}: roc.mode 'released' drops whole groups, which verl's equal data-parallel "
            "split cannot take; use 'roc' or 'grpo' with engine verl"
        )
    reward_file = os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "agent", "verl_adapter.py"
    )
    # rollouts a micro-batch, fixed: on GPUs as many as fit padded, on the CPU one
    micro_rows = gpu.micro_batch_rows if gpu else 1
    return [
        "trainer.use_v1=false",
        "trainer.balance_batch=true",  # RoC runs inside _balance_batch (rstar.train.verl_trainer)
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=false",
        f"data.train_files={hydra_value(train_files)}",
        f"data.val_files={hydra_value(val_files or train_files)}",
        f"data.train_batch_size={cfg.prompts_per_step}",
        f"data.max_prompt_length={max_prompt_length}",
        f"data.max_response_length={cfg.sampling.max_response_tokens}",
        "data.return_raw_chat=true",
        f"actor_rollout_ref.model.path={hydra_value(model)}",
        f"actor_rollout_ref.actor.optim.lr={cfg.lr}",
        f"actor_rollout_ref.actor.optim.lr_warmup_steps={cfg.warmup_steps}",
        f"actor_rollout_ref.actor.optim.weight_decay={cfg.weight_decay}",
        f"actor_rollout_ref.actor.grad_clip={cfg.max_grad_norm}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={cfg.prompts_per_step // cfg.mini_batches}",
        f"actor_rollout_ref.actor.clip_ratio_low={cfg.clip_low}",
        f"actor_rollout_ref.actor.clip_ratio_high={cfg.clip_high}",
        "actor_rollout_ref.actor.loss_agg_mode=token-mean",
        "actor_rollout_ref.actor.use_kl_loss=false",
        "actor_rollout_ref.actor.entropy_coeff=0",
        # micro-batches of a fixed number of rollouts: their padded size is bounded whatever
        # the lengths (verl's token budget would pack many short rollouts beside a long one)
        "actor_rollout_ref.actor.use_dynamic_bsz=false",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro_rows}",
        "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=false",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={micro_rows}",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.mode=async",
        f"actor_rollout_ref.rollout.n={cfg.roc.group_size * cfg.roc.oversample}",
        f"actor_rollout_ref.rollout.temperature={cfg.sampling.temperature}",
        f"actor_rollout_ref.rollout.top_p={cfg.sampling.top_p}",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
        f"actor_rollout_ref.rollout.response_length={cfg.sampling.max_response_tokens}",
        f"actor_rollout_ref.rollout.prompt_length={max_prompt_length}",
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={hydra_value(agent_loop_config)}",
        "actor_rollout_ref.rollout.agent.default_agent_loop=rstar_agent",
        f"reward.custom_reward_function.path={hydra_value(os.path.abspath(reward_file))}",
        "reward.custom_reward_function.name=compute_score",
        f"+rstar.sandbox_url={hydra_value(sandbox_url) if sandbox_url else 'null'}",
        f"+rstar.sampling={_hydra_dict(asdict(cfg.sampling))}",
        f"+rstar.roc_mode={cfg.roc.mode}",
        f"+rstar.group_size={cfg.roc.group_size}",
        f"+rstar.seed={cfg.seed}",
        f"+rstar.prompt_style={cfg.prompt_style}",
        # verl's weight sync with a deadline (it would wait for ever on a replica that fails)
        "+actor_rollout_ref.rollout.checkpoint_manager_class="
        "rstar.train.verl_trainer.WeightSyncWithDeadline",
        f"+rstar.weight_sync_timeout_s={WEIGHT_SYNC_TIMEOUT_S}",
        f"trainer.total_training_steps={cfg.steps}",
        f"trainer.default_local_dir={hydra_value(out_dir)}",
        f"trainer.n_gpus_per_node={n_gpus}",
        f"trainer.nnodes={nodes}",
        f"trainer.save_freq={cfg.checkpoint_every}",
        f"trainer.max_actor_ckpt_to_keep={cfg.checkpoints_kept}",
        "trainer.resume_mode=auto",
        "trainer.val_before_train=false",
        f"trainer.test_freq={cfg.steps if val_files else -1}",
        f"trainer.project_name={hydra_value(experiment)}",
        f"trainer.experiment_name={hydra_value(cfg.name)}",
        "trainer.logger=[console,mlflow]",
        *(
            [f"actor_rollout_ref.rollout.router_config_path={hydra_value(router_config)}"]
            if router_config
            else []
        ),
        *(
            [f"+rstar.optimizer_from={hydra_value(optimizer_from)}"]
            if optimizer_from and not cfg.reset_optimizer
            else []
        ),
        *([f"+rstar.trajectories={hydra_value(trajectories)}"] if trajectories else []),
        # FSDP2 on every device: the strategy CI trains with (verl's default is FSDP1, which
        # the CPU cannot run), so the GPU path runs the code the tests ran
        "actor_rollout_ref.actor.strategy=fsdp2",
        "actor_rollout_ref.ref.strategy=fsdp2",
        # PyTorch's own attention, padded: flash-attn (verl's default, and what removing the
        # padding needs) has no wheel for this torch; docs/cluster.md, what only a GPU can show
        "actor_rollout_ref.model.use_remove_padding=false",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        *(
            cpu_overrides(model, max_prompt_length + cfg.sampling.max_response_tokens)
            if device == "cpu"
            else []
        ),
        # the GPU settings (on CPU ranks in a rehearsal), or verl alone on this machine's CPU
        *(gpu.overrides() if gpu else own_cpu_overrides(n_gpus * nodes) if device == "cpu" else []),
    ]


def cpu_overrides(model: str, max_model_len: int) -> list[str]:
    """verl's trainer on CPU ranks (rstar.train.verl_cpu): FSDP2 in float32, vLLM's CPU build as
    the rollout, no torch.compile. vLLM's context is the stage's (`max_model_len`: prompt and
    response budgets), not the model's own longest, and its KV cache is sized for it from the
    model's shape: SmolLM2's 8,192 tokens with a fixed 256 MiB cache made vLLM refuse to start.
    A model not built yet (`rstar pipeline plan` before its stage ran) gets the smallest cache,
    `CPU_KV_CACHE_BYTES`; the stage itself sizes it from the model it has. These keys are a
    rehearsal's device block (rstar.pipeline.rehearsal.ALLOWED)."""
    has_config = os.path.exists(os.path.join(model, "config.json"))
    kv_bytes = cpu_kv_cache_bytes(model, max_model_len) if has_config else CPU_KV_CACHE_BYTES
    actor, rollout = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
    return [
        "trainer.device=cpu",
        # vLLM on the CPU: no sleep mode (it refuses it), so nothing to free between phases; no
        # compiled graphs; float32 as the actor computes; a KV cache of its own size (its
        # memory share would be a share of the machine's memory)
        f"+{rollout}.enable_sleep_mode=false",
        f"{rollout}.free_cache_engine=false",
        f"{rollout}.enforce_eager=true",
        f"{rollout}.dtype=float32",
        f"{rollout}.max_model_len={max_model_len}",
        f"+{rollout}.engine_kwargs.vllm.kv_cache_memory_bytes={kv_bytes}",
        f"{actor}.fsdp_config.dtype=float32",
        f"+{actor}.fsdp_config.mixed_precision={FP32}",
        f"{actor}.use_torch_compile=false",
        f"{actor}.fsdp_config.use_torch_compile=false",
        # one reward-loop worker: each is a process importing verl and vLLM (about 9
        # CPU-seconds); verl's default of 8 cost a 2-core machine half a minute per run, and the
        # answer check they run is cheap
        "reward.num_workers=1",
        "data.dataloader_num_workers=0",
    ]


def own_cpu_overrides(processes: int) -> list[str]:
    """verl alone on this machine's CPU, in a Ray of its own (`resources.gpus: 0`): `processes`
    training processes (Ray slots, see verl_cpu), one agent-loop worker (a process importing
    verl and vLLM), no tensor parallelism."""
    return [
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        # Ray's CPU count is logical here: verl's task runner, each training process's bundle
        # (3 CPUs by verl's default colocation count) and the replica servers must all fit
        f"+ray_kwargs.ray_init.num_gpus={processes}",
        f"ray_kwargs.ray_init.num_cpus={4 * processes + 4}",
        "+ray_kwargs.ray_init.object_store_memory=500000000",
        "+ray_kwargs.ray_init.include_dashboard=false",
    ]


def external_modules(device: str) -> str:
    """What verl imports in every one of its processes (`VERL_USE_EXTERNAL_MODULES`): the
    checkpoint load that reshards and restores the scheduler's rate (rstar.train.verl_resume),
    gradient accumulation that crosses nodes once an update under HSDP (rstar.train.verl_hsdp),
    a warm-up whose first update is not at rate 0 (rstar.train.verl_warmup) and, on the CPU,
    the platform plug-in (rstar.train.verl_cpu)."""
    mended = ["rstar.train.verl_resume", "rstar.train.verl_hsdp", "rstar.train.verl_warmup"]
    return ",".join((["rstar.train.verl_cpu"] if device == "cpu" else []) + mended)


def verl_env(device: str = "gpu", threads: int | None = None) -> dict[str, str]:
    """Environment for the verl command: the project's modules in every verl process
    (`external_modules`), without verl's warning, in each, for each optional training engine
    not installed (torchtitan, veomni, megatron...); on the CPU, `threads` torch threads
    (default: every core) in its training processes, which Ray would otherwise start with one."""
    quiet = ",".join(
        filter(None, [os.environ.get("PYTHONWARNINGS"), "ignore::UserWarning:verl.workers.engine"])
    )
    modules = external_modules(device)
    if device != "cpu":
        return {"PYTHONWARNINGS": quiet, "VERL_USE_EXTERNAL_MODULES": modules}
    return {
        "PYTHONWARNINGS": quiet,
        "VERL_USE_EXTERNAL_MODULES": modules,
        "VERL_PLATFORM": "cpu",
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "OMP_NUM_THREADS": str(threads or os.cpu_count() or 1),
    }


def merge_command(checkpoint: str, target: str) -> list[str]:
    """verl's model merger: an FSDP checkpoint folder (every rank's shard) into a Hugging Face
    directory at `target`."""
    return [
        sys.executable,
        "-m",
        "verl.model_merger",
        "merge",
        "--backend",
        "fsdp",
        "--local_dir",
        checkpoint,
        "--target_dir",
        target,
    ]


def verl_command(cfg: RLConfig, **kwargs) -> list[str]:
    """`python -m rstar.train.verl_trainer` (verl's main_ppo with RoC) with the overrides for
    `cfg` (kwargs: verl_overrides')."""
    return [sys.executable, "-m", "rstar.train.verl_trainer", *verl_overrides(cfg, **kwargs)]


def build_verl_run(
    cfg: RLConfig,
    *,
    model: str,
    problems: str,
    sandbox_url: str,
    out_dir: str,
    n_gpus: int,
    nodes: int = 1,
    val_problems: str | None = None,
    experiment: str = "rstar",
    kv_cache_tokens: int | None = None,
    optimizer_from: str | None = None,
    trajectories: str | None = None,
    device: str = "gpu",
    gpu: Callable[[int], GPUSettings] | None = None,
) -> list[str]:
    """Write verl's dataset files (training, and validation from `val_problems`), agent-loop file
    and load-balancer file (`kv_cache_tokens` per replica, if known) under `out_dir`; return the
    command to run. With the model on local disk, prompts are padded to the longest the agent
    loop will build for these problems (else to 2,048 tokens). `gpu`: the GPU settings for a
    prompt length (rstar.train.gpu_sizing); the balancer then caps each replica at the KV cache
    they leave it."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import yaml

    os.makedirs(out_dir, exist_ok=True)

    problem_texts: list[str] = []

    def dataset(source: str, name: str) -> str:
        path = os.path.join(out_dir, name)
        rows = read_table(source, ("problems", "hard_problems")).to_pylist()
        problem_texts.extend(p["problem"] for p in rows)
        pq.write_table(pa.Table.from_pylist(to_verl_rows(rows, cfg.prompt_style)), path)
        return path

    train_files = dataset(problems, "verl_train.parquet")
    val_files = dataset(val_problems, "verl_val.parquet") if val_problems else None
    longest = (
        longest_prompt(model, problem_texts, cfg.prompt_style) if os.path.isdir(model) else None
    )
    prompt_tokens = -(-longest // 64) * 64 if longest else DEFAULT_PROMPT_TOKENS
    settings = gpu(prompt_tokens) if gpu else None
    if settings and device != "cpu":  # on CPU ranks the replicas' caches are vLLM's CPU ones
        kv_cache_tokens = kv_cache_tokens or settings.kv_tokens_per_replica
    agent_cfg = os.path.join(out_dir, "agent_loops.yaml")
    with open(agent_cfg, "w") as f:
        yaml.safe_dump(
            [{"name": "rstar_agent", "_target_": "rstar.agent.verl_adapter.RStarAgentLoop"}], f
        )
    router = os.path.join(out_dir, "router.yaml")
    with open(router, "w") as f:
        yaml.safe_dump(
            {
                "router_class": "rstar.rollout.verl_router.KVBalancedRouter",
                "kv_cache_tokens": kv_cache_tokens,
            },
            f,
        )
    return verl_command(
        cfg,
        model=model,
        train_files=train_files,
        agent_loop_config=agent_cfg,
        sandbox_url=sandbox_url,
        out_dir=out_dir,
        n_gpus=n_gpus,
        nodes=nodes,
        val_files=val_files,
        experiment=experiment,
        router_config=router,
        optimizer_from=optimizer_from,
        trajectories=trajectories,
        device=device,
        max_prompt_length=prompt_tokens,
        gpu=settings,
    )


def longest_prompt(model_dir: str, problems: list[str], prompt_style: str) -> int:
    """Tokens in the longest prompt the agent loop builds for `problems` (system, tools, user)."""
    from transformers import AutoTokenizer

    from rstar.agent.format import prompt_ids

    tok = AutoTokenizer.from_pretrained(model_dir)
    return max(len(prompt_ids(tok, p, prompt_style)) for p in problems)
