"""GRPO-RoC on one machine: rollout (agent loop, local engine, sandbox) -> reward -> RoC ->
advantage -> update. Constant learning rate after a linear warm-up, AdamW, no KL, no
entropy bonus. Checkpoints in Hugging Face format plus optimizer and RNG state; a stage
that is interrupted resumes from its last checkpoint. Anything past one process is verl's
job (see `rstar.train.verl_launcher`)."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from contextlib import contextmanager

import torch

from rstar.agent.loop import AgentLoop
from rstar.algo.loss import grpo_advantages, policy_loss
from rstar.algo.roc import Rollout, keep_indices
from rstar.data.io import write_table
from rstar.reward.score import BatchScorer
from rstar.rollout.hf_engine import HFEngine
from rstar.rollout.runner import sample, score
from rstar.storage import dirs
from rstar.train.config import RLConfig, warmup_share
from rstar.train.metrics import summarize_step

STATE = "trainer_state.pt"


def _log_probs(
    model, seqs: list[list[int]], starts: list[int], width: int, temperature: float
) -> torch.Tensor:
    """Per-token log-probs of each sequence's response part (positions >= start), left-aligned
    to `width`, in one padded forward pass, under the sampling temperature (as verl's actor
    does): the policy being improved is the one the rollouts were drawn from. Left-padded, so
    every response ends in the last column and only the last columns go through the output
    layer (about half the tokens here are prompts)."""
    longest = max(len(s) for s in seqs)
    keep = max(len(s) - start for s, start in zip(seqs, starts))  # the longest response
    ids = torch.zeros(len(seqs), longest, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, longest - len(s) :] = torch.tensor(s)
        attn[i, longest - len(s) :] = 1
    logits = model(
        input_ids=ids,
        attention_mask=attn,
        position_ids=(attn.cumsum(-1) - 1).clamp(min=0),
        logits_to_keep=keep + 1,  # the column before the responses predicts their first token
    ).logits.float()
    logp_all = torch.log_softmax(logits[:, :-1] / temperature, -1)
    token_lp = logp_all.gather(-1, ids[:, -keep:, None]).squeeze(-1)
    out = torch.zeros(len(seqs), width)
    for i, (s, start) in enumerate(zip(seqs, starts)):
        n = len(s) - start
        out[i, :n] = token_lp[i, keep - n :]
    return out


def _micro_batches(rows: list[int], seqs: list[list[int]], size: int) -> list[list[int]]:
    """`rows` in micro-batches of at most `size`, sequences of like length together: each
    micro-batch is padded to its longest, and in rollout order the padded tokens were 2.2x the
    real ones. The gradient is the same sum."""
    rows = sorted(rows, key=lambda j: len(seqs[j]))
    return [rows[i : i + size] for i in range(0, len(rows), size)]


@contextmanager
def _timed(seconds: dict[str, float], phase: str):
    start = time.monotonic()
    try:
        yield
    finally:
        seconds[phase] = time.monotonic() - start


def optimizer_and_schedule(model, cfg: RLConfig):
    """AdamW, and a learning rate that warms up linearly from 1/warmup_steps, then stays
    constant."""
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: warmup_share(s, cfg.warmup_steps))


async def train_from(
    model_dir: str,
    problems: list[dict],
    cfg: RLConfig,
    out_dir: str,
    on_step: Callable[[int, dict], None] | None = None,
    **trainer_kw,
) -> RLTrainer:
    """Train the stage `cfg` from the Hugging Face checkpoint `model_dir` with the embedded
    sandbox; its last checkpoint lands in `out_dir/checkpoint`. Returns the trainer (its
    `history`: the per-step metrics). `trainer_kw`: RLTrainer's `trajectories`, `on_checkpoint`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rstar.sandbox.service import embedded_sandbox

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    async with embedded_sandbox() as sb:
        trainer = RLTrainer(
            model,
            AutoTokenizer.from_pretrained(model_dir),
            problems,
            sb,
            cfg,
            out_dir,
            on_step=on_step,
            **trainer_kw,
        )
        await trainer.run()
        return trainer


def step_prompts(problems: list[dict], cfg: RLConfig, step: int) -> list[dict]:
    """The problems a stage trains on at `step`: a draw of its seed, name and step alone, so a
    resumed stage (and a benchmark of the same stage) sees the same prompts."""
    rng = random.Random(f"{cfg.seed}/{cfg.name}/{step}")
    return rng.sample(problems, min(cfg.prompts_per_step, len(problems)))


class RLTrainer:
    """GRPO-RoC on one machine. One step (`train_step`):

    1. Draw `prompts_per_step` problems (a function of seed, stage and step: a resumed stage sees
       the same ones) and sample 2G rollouts of each (G under plain GRPO) through the agent
       loop, the policy serving them in this process, tools run in the sandbox.
    2. Score every rollout with the answer-only reward (1 if the final answer is right, else 0).
    3. Resample-on-Correct (rstar.algo.roc): per group keep G of the 2G, the correct ones down-
       sampled towards few tool errors and format issues, the failed ones uniformly.
    4. Advantages over the kept G: (r - mean) / std within each group.
    5. Update: the clipped surrogate with asymmetric clipping (clip_low, clip_high: 0.2, 0.28),
       averaged over tokens, tool-response tokens masked out; one AdamW step per mini-batch of
       whole groups; old log-probs recomputed once when there are several mini-batches.
    6. Write the step's rollouts (kept or not) to Parquet, report its metrics, checkpoint.

    Departures from textbook GRPO, as the paper makes them: no KL term and no entropy bonus,
    a higher upper clip, RoC's asymmetric down-sampling of the 2G before advantages, and the
    loss over model tokens only. A killed stage resumes at its last checkpoint (`try_resume`)."""

    def __init__(
        self,
        model,
        tokenizer,
        problems: list[dict],
        sandbox,
        cfg: RLConfig,
        out_dir: str,
        on_step: Callable[[int, dict], None] | None = None,
        trajectories: str | None = None,
        on_checkpoint: Callable[[int], None] | None = None,
    ) -> None:
        """`trajectories`: a directory or s3:// prefix that gets every step's rollouts as
        `step=NNNNN.parquet` (written before the step's checkpoint, so a step redone after a
        crash replaces its file: rows are never lost or duplicated). `on_step(step, metrics)`
        is called before the step's checkpoint too, so every checkpointed step has reported its
        metrics (a step redone after a crash reports the same figures again);
        `on_checkpoint(step)` after it (e.g. to upload it)."""
        self.model = model
        self.tok = tokenizer
        self.problems = problems
        self.sandbox = sandbox
        self.cfg = cfg
        self.out_dir = out_dir
        self.on_step = on_step
        self.trajectories = trajectories
        self.on_checkpoint = on_checkpoint
        self.opt, self.sched = optimizer_and_schedule(model, cfg)
        self.step = 0
        self.history: list[dict] = []
        self.started_as = ""  # what try_resume did: "resumed", "initialised" or "fresh"

    # -- checkpoints -------------------------------------------------------------------------
    def checkpoint_dir(self) -> str:
        return os.path.join(self.out_dir, "checkpoint")

    def save(self) -> None:
        """Replace the stage's checkpoint (HF model + tokenizer + trainer state) whole, so a
        kill at any point leaves one to resume from (`rstar.storage.dirs.replace_dir`)."""

        def fill(tmp: str) -> None:
            self.model.save_pretrained(tmp)
            self.tok.save_pretrained(tmp)
            torch.save(
                {
                    "step": self.step,
                    "optimizer": self.opt.state_dict(),
                    "scheduler": self.sched.state_dict(),
                    "torch_rng": torch.get_rng_state(),
                    "history": self.history,
                    "stage": self.cfg.name,
                },
                os.path.join(tmp, STATE),
            )

        dirs.replace_dir(self.checkpoint_dir(), fill)

    def try_resume(self) -> str:
        """Continue this stage from its own checkpoint ("resumed"), or start it from the previous
        stage's ("initialised": weights, and AdamW moments unless reset_optimizer or the source
        is not an RL checkpoint, e.g. the SFT model), or fresh."""
        from transformers import AutoModelForCausalLM

        dirs.recover_dir(self.checkpoint_dir())
        own = os.path.join(self.checkpoint_dir(), STATE)
        source = self.checkpoint_dir() if os.path.exists(own) else self.cfg.init_from
        if source is None:
            return "fresh"
        state = (
            torch.load(os.path.join(source, STATE), weights_only=False)
            if os.path.exists(os.path.join(source, STATE))
            else None
        )
        self.model.load_state_dict(
            AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).state_dict()
        )
        if source == self.checkpoint_dir():
            self.opt.load_state_dict(state["optimizer"])
            self.sched.load_state_dict(state["scheduler"])
            torch.set_rng_state(state["torch_rng"])
            self.step = state["step"]
            self.history = state["history"]
            return "resumed"
        # carry the moments over; the new stage's lr schedule starts afresh: its first update at
        # warm-up step 0's rate (loading restores the previous stage's last rate otherwise)
        if state is not None and not self.cfg.reset_optimizer:
            moments = state["optimizer"]
            for group, lr in zip(moments["param_groups"], self.sched.get_last_lr()):
                group.update(lr=lr, initial_lr=self.cfg.lr, weight_decay=self.cfg.weight_decay)
            self.opt.load_state_dict(moments)
        return "initialised"

    # -- the loop ----------------------------------------------------------------------------
    async def run(self) -> list[dict]:
        """Train until `steps`, resuming from the stage's checkpoint when there is one."""
        self.started_as = self.try_resume()
        engine = HFEngine(self.model, seed=self.cfg.seed)
        loop = AgentLoop(engine, self.tok, self.sandbox, self.cfg.sampling, self.cfg.prompt_style)
        with BatchScorer(workers=1) as scorer:
            while self.step < self.cfg.steps:
                self.step += 1
                metrics, records = await self.train_step(loop, scorer)
                if self.trajectories:
                    write_table(
                        records, f"{self.trajectories}/step={self.step:05d}.parquet", "trajectories"
                    )
                self.history.append(metrics)
                if self.on_step:
                    self.on_step(self.step, metrics)
                if self.step % self.cfg.checkpoint_every == 0 or self.step == self.cfg.steps:
                    self.save()
                    if self.on_checkpoint:
                        self.on_checkpoint(self.step)
        await engine.close()
        return self.history

    async def train_step(self, loop: AgentLoop, scorer: BatchScorer) -> tuple[dict, list[dict]]:
        cfg = self.cfg
        seconds: dict[str, float] = {}  # per phase: time_<phase>_s
        k = cfg.roc.group_size * cfg.roc.oversample
        self.model.eval()
        with _timed(seconds, "rollout"):
            sampled = await sample(
                loop,
                step_prompts(self.problems, cfg, self.step),
                k,
                stage=cfg.name,
                policy_step=self.step,
            )
        with _timed(seconds, "reward"):
            records = await score(loop, sampled, scorer, stage=cfg.name, policy_step=self.step)
        rng = random.Random(f"{cfg.seed}/{cfg.name}/{self.step}/roc")
        chosen = keep_indices([rollout_of(r) for r in records], cfg.roc, rng)
        keep = set(chosen)
        for i, r in enumerate(records):
            r["kept"] = i in keep
        kept = [records[i] for i in chosen]
        with _timed(seconds, "update"):
            update = (
                self.update(kept) if kept else {"clip_fraction": 0.0, "loss": 0.0, "grad_norm": 0.0}
            )
        tokens = sum(sum(r["response_mask"]) for r in records)
        return {
            "step": self.step,
            **summarize_step(records, kept),
            **update,
            "lr": self.sched.get_last_lr()[0],
            **{f"time_{phase}_s": s for phase, s in seconds.items()},
            "time_tool_s": sum(r["tool_s"] for r in records),
            "tokens_per_s": tokens / max(seconds["rollout"], 1e-9),
        }, records

    def update(self, kept: list[dict]) -> dict:
        cfg = self.cfg
        seqs = [r["prompt_ids"] + r["response_ids"] for r in kept]
        starts = [len(r["prompt_ids"]) for r in kept]
        width = max(len(r["response_ids"]) for r in kept)
        mask = torch.zeros(len(kept), width)
        for i, r in enumerate(kept):
            mask[i, : len(r["response_mask"])] = torch.tensor(
                r["response_mask"], dtype=torch.float32
            )
        adv = grpo_advantages(
            torch.tensor([r["reward"] for r in kept]), mask, [r["group_id"] for r in kept]
        )
        old = None  # one optimizer step per batch: the policy that sampled is the one the loss sees
        # later mini-batches see an updated policy: keep the sampling one's
        if cfg.mini_batches > 1:
            old = torch.zeros(len(kept), width)
            with torch.no_grad():
                for idx in _micro_batches(list(range(len(kept))), seqs, cfg.micro_batch_size):
                    old[idx] = _log_probs(
                        self.model,
                        [seqs[j] for j in idx],
                        [starts[j] for j in idx],
                        width,
                        cfg.sampling.temperature,
                    )
        self.model.train()
        all_tokens = max(int(mask.sum().item()), 1)
        losses, grad_norms = [], []
        clip = 0.0
        for rows in _mini_batches([r["group_id"] for r in kept], cfg.mini_batches):
            n_tokens = int(mask[rows].sum().item())
            losses.append(0.0)
            for idx in _micro_batches(rows, seqs, cfg.micro_batch_size):
                new = _log_probs(
                    self.model,
                    [seqs[j] for j in idx],
                    [starts[j] for j in idx],
                    width,
                    cfg.sampling.temperature,
                )
                loss, m = policy_loss(
                    new.detach() if old is None else old[idx],
                    new,
                    adv[idx],
                    mask[idx],
                    clip_low=cfg.clip_low,
                    clip_high=cfg.clip_high,
                    batch_num_tokens=n_tokens,
                )
                loss.backward()
                losses[-1] += loss.item()
                clip += m["clip_fraction"] * mask[idx].sum().item() / all_tokens
            grad_norms.append(
                float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm))
            )
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        self.sched.step()  # the schedule counts RL steps, as verl's does
        self.model.eval()
        return {
            "loss": sum(losses) / len(losses),
            "clip_fraction": clip,
            "grad_norm": sum(grad_norms) / len(grad_norms),
            "optimizer_steps": len(grad_norms),
        }


def rollout_of(record: dict) -> Rollout:
    """A trajectory record (rstar.rollout.runner) as RoC reads it."""
    return Rollout(
        record["group_id"],
        record["reward"],
        record["num_tool_calls"],
        record["num_tool_errors"],
        record["num_answers"],
        record["turns"],
    )


def _mini_batches(group_ids: list[str], n: int) -> list[list[int]]:
    """Row indices split into at most `n` mini-batches of whole groups (a group's advantages
    are relative to each other, so its rows update together), in order."""
    groups = list(dict.fromkeys(group_ids))
    per = -(-len(groups) // n)
    chunks = [set(groups[i : i + per]) for i in range(0, len(groups), per)]
    return [[j for j, g in enumerate(group_ids) if g in chunk] for chunk in chunks]
