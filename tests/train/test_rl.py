"""The single-machine GRPO-RoC trainer: a few real steps (tiny model, local engine, sandbox),
metrics, checkpoints, and resume giving the same result as an uninterrupted run."""

import json
import os

import torch

from rstar.algo.roc import RoCConfig
from rstar.data import synth
from rstar.train.config import StageConfig
from rstar.train.rl import RLTrainer


def cfg(steps):
    return StageConfig(
        steps=steps,
        prompts_per_step=2,
        roc=RoCConfig(group_size=2),
        max_response_tokens=24,
        max_turns=2,
        lr=1e-3,
        warmup_steps=1,
        seed=7,
    )


async def run_trainer(tiny_dir, tokenizer, sandbox, out, steps):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    trainer = RLTrainer(
        model, tokenizer, synth.generate(10, seed=2, levels=(1,)), sandbox, cfg(steps), out
    )
    history = await trainer.run()
    return model, history


async def test_rl_steps_checkpoint_and_resume(tiny_dir, tokenizer, agent_sandbox, tmp_path):
    straight, hist = await run_trainer(tiny_dir, tokenizer, agent_sandbox, str(tmp_path / "a"), 3)
    assert [h["step"] for h in hist] == [1, 2, 3]
    for key in (
        "reward_mean",
        "accuracy",
        "tool_calls_per_rollout",
        "tool_error_rate",
        "tool_error_rate_positive",
        "tool_error_rate_positive_kept",
        "format_violation_rate",
        "response_len_mean",
        "response_len_p95",
        "truncation_rate",
        "clip_fraction",
        "entropy",
        "tokens_per_s",
        "time_rollout_s",
        "time_reward_s",
        "time_tool_s",
        "time_update_s",
        "lr",
        "grad_norm",
    ):
        assert key in hist[-1]
    assert hist[-1]["kept"] == 2 * 2  # prompts x G, from 2G sampled each
    assert os.path.exists(tmp_path / "a" / "checkpoint" / "model.safetensors")

    # the same stage, interrupted after step 2, then resumed by a new process-like trainer
    await run_trainer(tiny_dir, tokenizer, agent_sandbox, str(tmp_path / "b"), 2)
    resumed, hist_b = await run_trainer(tiny_dir, tokenizer, agent_sandbox, str(tmp_path / "b"), 3)
    assert [h["step"] for h in hist_b] == [1, 2, 3]
    assert [h["reward_mean"] for h in hist_b] == [h["reward_mean"] for h in hist]
    for (name, a), (_, b) in zip(straight.state_dict().items(), resumed.state_dict().items()):
        assert torch.allclose(a, b, atol=1e-5), name


async def test_a_save_killed_midway_leaves_a_checkpoint_to_resume_from(
    tiny_dir, tokenizer, agent_sandbox, tmp_path
):
    """The two places a kill can land inside `save`: while deleting the replaced checkpoint
    (a `.old` is left next to the new one: the next save must not trip over it), and between
    the two renames (only `.old` is left: resume must find it)."""
    import shutil

    from transformers import AutoModelForCausalLM

    out = tmp_path / "c"
    final, old = out / "checkpoint", out / "checkpoint.old"

    async def resume_to(steps):
        model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
        trainer = RLTrainer(
            model,
            tokenizer,
            synth.generate(10, seed=2, levels=(1,)),
            agent_sandbox,
            cfg(steps),
            str(out),
        )
        history = await trainer.run()
        return trainer, history

    await resume_to(1)
    shutil.copytree(final, old)  # killed while deleting the replaced checkpoint
    trainer, history = await resume_to(2)
    assert trainer.started_as == "resumed" and [h["step"] for h in history] == [1, 2]
    assert not old.exists()

    os.rename(final, old)  # killed between the renames: only the previous checkpoint is left
    trainer, history = await resume_to(3)
    assert trainer.started_as == "resumed" and [h["step"] for h in history] == [1, 2, 3]


async def test_next_stage_starts_from_the_previous_one(
    tiny_dir, tokenizer, agent_sandbox, tmp_path
):
    from transformers import AutoModelForCausalLM

    problems = synth.generate(10, seed=2, levels=(1,))
    first, _ = await run_trainer(tiny_dir, tokenizer, agent_sandbox, str(tmp_path / "s1"), 1)
    prev = str(tmp_path / "s1" / "checkpoint")
    for reset in (False, True):
        c = cfg(1)
        c.name, c.init_from, c.reset_optimizer = "rl2", prev, reset
        model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
        trainer = RLTrainer(
            model, tokenizer, problems, agent_sandbox, c, str(tmp_path / f"s2-{reset}")
        )
        assert trainer.try_resume() == "initialised"
        for (name, a), (_, b) in zip(first.state_dict().items(), model.state_dict().items()):
            assert torch.equal(a, b), name  # weights come from stage 1
        moments = [s for s in trainer.opt.state.values() if "exp_avg" in s]
        assert (len(moments) == 0) == reset  # AdamW moments carried over unless reset
        assert trainer.step == 0


async def test_the_update_scores_tokens_under_the_sampling_temperature(tiny_dir):
    """The trainer's log-probs of a rollout are those the engine sampled it with (verl's actor
    divides by the temperature too); at temperature 1 they would be another policy's."""
    from transformers import AutoModelForCausalLM

    from rstar.rollout.hf_engine import HFEngine
    from rstar.train.rl import _log_probs

    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    engine = HFEngine(model, seed=1)
    prompt = [7, 8, 9, 10]
    g = await engine.generate("r", prompt, {"max_tokens": 12, "temperature": 0.6})
    await engine.close()
    n = len(g.token_ids)
    with torch.no_grad():
        scored = _log_probs(model, [prompt + g.token_ids], [len(prompt)], n, 0.6)[0]
        untempered = _log_probs(model, [prompt + g.token_ids], [len(prompt)], n, 1.0)[0]
    assert torch.allclose(scored, torch.tensor(g.log_probs), atol=1e-4)
    assert not torch.allclose(untempered, torch.tensor(g.log_probs), atol=1e-2)


def test_mini_batches_take_whole_groups_in_order():
    from rstar.train.rl import _mini_batches

    ids = ["a", "a", "b", "b", "b", "c", "d", "d"]
    assert _mini_batches(ids, 1) == [list(range(8))]
    assert _mini_batches(ids, 2) == [[0, 1, 2, 3, 4], [5, 6, 7]]
    # never more batches than groups
    assert _mini_batches(ids, 8) == [[0, 1], [2, 3, 4], [5], [6, 7]]


async def test_mini_batches_take_several_optimizer_steps_per_rollout_batch(
    tiny_dir, tokenizer, agent_sandbox, tmp_path
):
    from transformers import AutoModelForCausalLM

    c = cfg(1)
    c.mini_batches = 2
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    trainer = RLTrainer(
        model, tokenizer, synth.generate(10, seed=2, levels=(1,)), agent_sandbox, c, str(tmp_path)
    )
    hist = await trainer.run()
    assert hist[-1]["optimizer_steps"] == 2
    assert all(int(s["step"]) == 2 for s in trainer.opt.state.values())  # AdamW counted two updates
    assert trainer.sched.last_epoch == 1  # the lr schedule counts RL steps


def test_tool_errors_in_correct_trajectories_sampled_and_kept():
    """The ablation's measure is over every correct trajectory sampled (the policy's behaviour);
    the kept ones are reported beside it, and only correct ones count in either."""
    from rstar.train.rl import summarize_step

    def rec(reward, calls, errors, rejected=0):
        statuses = (
            ["rejected"] * rejected + ["error"] * (errors - rejected) + ["ok"] * (calls - errors)
        )
        return {
            "reward": reward,
            "num_tool_calls": calls,
            "num_tool_errors": errors,
            "response_len": 10,
            "entropies": [0.5],
            "response_mask": [1],
            "num_answers": 1,
            "finish_reason": "answered",
            "tool_calls": json.dumps([{"status": s} for s in statuses]),
        }

    records = [rec(1.0, 2, 1), rec(1.0, 2, 0), rec(0.0, 4, 4, rejected=3)]
    m = summarize_step(records, kept=[records[1], records[2]])
    assert m["tool_error_rate_positive"] == 0.25  # 1 error in 4 calls of the two correct ones
    assert m["tool_error_rate_positive_kept"] == 0.0  # the kept correct one had none
    assert (m["tool_errors_positive"], m["tool_calls_positive"]) == (1, 4)
    assert m["tool_error_rate"] == 5 / 8 and m["kept"] == 2
    # calls the sandbox never ran, apart from the model's errors
    assert m["sandbox_failure_rate"] == 3 / 8


def test_with_one_mini_batch_the_sampling_policys_log_probs_are_the_updated_ones(tiny_dir):
    """The trainer skips the separate no-grad pass for the old log-probs when one optimizer step
    takes the whole batch: that pass gives exactly the log-probs of the update's own forward."""
    from transformers import AutoModelForCausalLM

    from rstar.train.rl import _log_probs

    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    seqs, starts = [[5, 9, 14, 3, 7, 8], [5, 9, 2, 11]], [3, 2]
    model.eval()
    with torch.no_grad():
        old = _log_probs(model, seqs, starts, 3, 0.8)
    model.train()
    new = _log_probs(model, seqs, starts, 3, 0.8)
    assert new.requires_grad and torch.equal(old, new.detach())
