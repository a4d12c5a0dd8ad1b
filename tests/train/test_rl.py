"""The single-machine GRPO-RoC trainer: a few real steps (tiny model, local engine, sandbox),
metrics, checkpoints, and resume giving the same result as an uninterrupted run."""

import json
import os
from dataclasses import replace

import pytest
import torch

from rstar.agent.sampling import Sampling
from rstar.algo.roc import RoCConfig
from rstar.data import synth
from rstar.train.config import RLConfig
from rstar.train.rl import RLTrainer
from tests.conftest import product_problems


def cfg(steps):
    return RLConfig(
        steps=steps,
        prompts_per_step=2,
        roc=RoCConfig(group_size=2),
        sampling=Sampling(max_response_tokens=24, max_turns=2),
        lr=1e-3,
        warmup_steps=1,
        seed=7,
    )


def scoring_cfg(steps):
    """For `tiny_sft` on `product_problems`: groups with a reward signal at every step, and a
    warm-up longer than the run, so each step's learning rate differs (a resume that loses the
    schedule shows in the weights)."""
    return RLConfig(
        steps=steps,
        prompts_per_step=4,
        roc=RoCConfig(group_size=2),
        sampling=Sampling(max_response_tokens=96, max_turns=3, temperature=0.8),
        lr=1e-4,
        warmup_steps=5,
        seed=7,
        prompt_style="compact",
    )


async def run_trainer(model_dir, tokenizer, sandbox, out, steps, make_cfg=cfg, problems=None):
    """A trainer over `model_dir`, run to `steps` (resuming from `out` if it holds a
    checkpoint)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    problems = problems or synth.generate(10, seed=2, levels=(1,))
    trainer = RLTrainer(model, tokenizer, problems, sandbox, make_cfg(steps), out)
    await trainer.run()
    return trainer


async def test_rl_learns_checkpoints_and_resumes_to_the_uninterrupted_run(
    tiny_sft, agent_sandbox, tmp_path
):
    """Three steps straight, and the same stage killed after step 2 then resumed by a new
    trainer: the same rollouts, weights, AdamW moments, schedule and RNG state. The model earns
    reward, so every one of those is something a resume could lose."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_sft)
    problems = product_problems(12)

    async def run(out, steps, rng_seed):
        torch.manual_seed(rng_seed)  # what the process happened to hold
        return await run_trainer(
            tiny_sft, tok, agent_sandbox, str(tmp_path / out), steps, scoring_cfg, problems
        )

    straight = await run("a", 3, 0)
    straight_rng = torch.get_rng_state()
    hist = straight.history
    assert [h["step"] for h in hist] == [1, 2, 3]
    # not vacuous: rewards of both kinds, and an update that moved the weights
    assert all(0 < h["accuracy"] < 1 for h in hist), [h["accuracy"] for h in hist]
    assert all(h["grad_norm"] > 0 for h in hist)
    start = AutoModelForCausalLM.from_pretrained(tiny_sft, dtype=torch.float32).state_dict()
    assert any(not torch.equal(start[n], p) for n, p in straight.model.state_dict().items())
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
    assert hist[-1]["kept"] == 4 * 2  # prompts x G, from 2G sampled each
    assert [h["lr"] for h in hist] == pytest.approx([1e-4 * s / 5 for s in (2, 3, 4)])
    assert os.path.exists(tmp_path / "a" / "checkpoint" / "model.safetensors")

    await run("b", 2, 0)
    resumed = await run("b", 3, 1234)  # a new process: another RNG state, fresh optimizer
    assert resumed.started_as == "resumed"
    assert [h["reward_mean"] for h in resumed.history] == [h["reward_mean"] for h in hist]
    for (name, a), (_, b) in zip(
        straight.model.state_dict().items(), resumed.model.state_dict().items()
    ):
        assert torch.allclose(a, b, atol=1e-6), name
    for a, b in zip(straight.opt.state.values(), resumed.opt.state.values()):
        assert torch.equal(a["step"], b["step"])
        assert torch.allclose(a["exp_avg"], b["exp_avg"], atol=1e-9)
        assert torch.allclose(a["exp_avg_sq"], b["exp_avg_sq"], atol=1e-12)
    assert resumed.sched.state_dict() == straight.sched.state_dict()
    assert torch.equal(torch.get_rng_state(), straight_rng)


async def test_a_save_killed_midway_leaves_a_checkpoint_to_resume_from(
    tiny_dir, tokenizer, agent_sandbox, tmp_path
):
    """The two places a kill can land inside `save`: while deleting the replaced checkpoint
    (a `.old` is left next to the new one: the next save must not trip over it), and between
    the two renames (only `.old` is left: resume must find it)."""
    import shutil

    out = tmp_path / "c"
    final, old = out / "checkpoint", out / "checkpoint.old"

    async def resume_to(steps):
        trainer = await run_trainer(tiny_dir, tokenizer, agent_sandbox, str(out), steps)
        return trainer, trainer.history

    await resume_to(1)
    shutil.copytree(final, old)  # killed while deleting the replaced checkpoint
    trainer, history = await resume_to(2)
    assert trainer.started_as == "resumed" and [h["step"] for h in history] == [1, 2]
    assert not old.exists()

    os.rename(final, old)  # killed between the renames: only the previous checkpoint is left
    trainer, history = await resume_to(3)
    assert trainer.started_as == "resumed" and [h["step"] for h in history] == [1, 2, 3]


async def test_next_stage_starts_from_the_previous_one(tiny_sft, agent_sandbox, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_sft)
    problems = product_problems(8)
    first = await run_trainer(
        tiny_sft, tok, agent_sandbox, str(tmp_path / "s1"), 1, scoring_cfg, problems
    )
    start = AutoModelForCausalLM.from_pretrained(tiny_sft, dtype=torch.float32).state_dict()
    assert any(not torch.equal(start[n], p) for n, p in first.model.state_dict().items())
    prev = str(tmp_path / "s1" / "checkpoint")
    for reset in (False, True):
        c = scoring_cfg(1)
        c.name, c.init_from, c.reset_optimizer = "rl2", prev, reset
        c.warmup_steps = 4
        model = AutoModelForCausalLM.from_pretrained(tiny_sft, dtype=torch.float32)
        trainer = RLTrainer(model, tok, problems, agent_sandbox, c, str(tmp_path / f"s2-{reset}"))
        assert trainer.try_resume() == "initialised"
        for (name, a), (_, b) in zip(first.model.state_dict().items(), model.state_dict().items()):
            assert torch.equal(a, b), name  # weights come from stage 1
        carried = [s for s in trainer.opt.state.values() if "exp_avg" in s]
        if reset:
            assert carried == []
        else:  # stage 1's AdamW moments, exactly; the schedule starts afresh
            assert len(carried) == len(first.opt.state)
            for a, b in zip(first.opt.state.values(), carried):
                assert torch.equal(a["exp_avg"], b["exp_avg"]) and torch.equal(a["step"], b["step"])
        assert trainer.step == 0 and trainer.sched.last_epoch == 0
        # its first update at warm-up step 0's rate, carried moments or not
        assert [g["lr"] for g in trainer.opt.param_groups] == [c.lr / 4]


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
    from rstar.train.metrics import summarize_step

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


def test_an_update_raises_rewarded_tokens_lowers_the_rest_and_never_trains_tool_tokens(
    tiny_dir, tokenizer, monkeypatch
):
    """One group of two rollouts of one prompt, one rewarded: after one update the model's tokens
    of the rewarded rollout are likelier and those of the other less likely; the loss's gradient
    reaches only the model's tokens (mask 1), never the tool response's (mask 0)."""
    from transformers import AutoModelForCausalLM

    from rstar.train import rl

    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    c = cfg(1)
    c.lr, c.sampling = 1e-4, replace(c.sampling, temperature=1.0)
    trainer = RLTrainer(model, tokenizer, [], None, c, "unused")
    prompt = [5, 9, 14, 3]
    rows = [
        {"response_ids": [40, 41, 42, 43, 44, 45], "response_mask": [1, 1, 0, 0, 1, 1]},
        {"response_ids": [60, 61, 62, 63, 64], "response_mask": [1, 1, 1, 0, 1]},
    ]
    kept = [
        {"prompt_ids": prompt, "group_id": "g", "reward": reward, **row}
        for row, reward in zip(rows, (1.0, 0.0))
    ]
    mask = torch.tensor([[1, 1, 0, 0, 1, 1], [1, 1, 1, 0, 1, 0]], dtype=torch.float32)

    def model_token_log_probs() -> torch.Tensor:
        with torch.no_grad():
            lp = rl._log_probs(model, [prompt + r["response_ids"] for r in rows], [4, 4], 6, 1.0)
        return (lp * mask).sum(-1)

    seen = []

    def keep_grad(*args):
        out = original(*args)
        if out.requires_grad:
            out.retain_grad()
            seen.append(out)
        return out

    original = rl._log_probs
    monkeypatch.setattr(rl, "_log_probs", keep_grad)
    before = model_token_log_probs()
    trainer.update(kept)
    after = model_token_log_probs()
    assert after[0] > before[0] and after[1] < before[1], (before, after)
    (scored,) = seen
    (order,) = rl._micro_batches([0, 1], [prompt + r["response_ids"] for r in rows], 8)
    scored_mask = mask[order]  # the micro-batch's rows, shortest first
    assert torch.all(scored.grad[scored_mask == 0] == 0)  # tool tokens and padding: no gradient
    assert torch.all(scored.grad[scored_mask == 1] != 0)


def test_the_optimizer_steps_on_the_clipped_gradient(tiny_dir, tokenizer):
    """clip_grad_norm_ returns the norm before clipping, so the logged figure is the same with
    clipping off: what AdamW is handed is checked here, at its step."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    c = cfg(1)
    c.max_grad_norm = 1e-3
    trainer = RLTrainer(model, tokenizer, [], None, c, "unused")
    stepped = []
    trainer.opt.register_step_pre_hook(
        lambda opt, *_: stepped.append(
            torch.linalg.vector_norm(
                torch.stack(
                    [
                        p.grad.norm()
                        for g in opt.param_groups
                        for p in g["params"]
                        if p.grad is not None
                    ]
                )
            ).item()
        )
    )
    kept = [
        {
            "prompt_ids": [5, 9, 14, 3],
            "group_id": "g",
            "reward": reward,
            "response_ids": ids,
            "response_mask": [1] * len(ids),
        }
        for ids, reward in (([40, 41, 42], 1.0), ([60, 61, 62, 63], 0.0))
    ]
    logged = trainer.update(kept)["grad_norm"]
    assert logged > 100 * c.max_grad_norm  # a gradient that needed clipping
    (norm,) = stepped
    assert norm == pytest.approx(c.max_grad_norm, rel=1e-3)


def test_batched_log_probs_are_each_sequences_alone(tiny_dir):
    """Left padding and scoring only the last columns: each row's response log-probs are those
    of a plain forward pass over that sequence alone."""
    from transformers import AutoModelForCausalLM

    from rstar.train.rl import _log_probs

    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    seqs = [[5, 9, 14, 3, 7, 8, 20, 21], [5, 9, 2, 11], [6] * 12 + [30, 31], [8, 40, 41, 42, 43]]
    starts = [3, 2, 12, 1]  # a long prompt with a short response, and the other way round
    with torch.no_grad():
        batched = _log_probs(model, seqs, starts, 7, 0.7)
        for row, (s, start) in enumerate(zip(seqs, starts)):
            logits = model(torch.tensor([s])).logits[0].float() / 0.7
            alone = torch.log_softmax(logits, -1)[torch.arange(start - 1, len(s) - 1), s[start:]]
            n = len(s) - start
            assert torch.allclose(batched[row, :n], alone, atol=1e-5), row
            assert torch.all(batched[row, n:] == 0)


def test_micro_batches_of_like_length_give_the_whole_batchs_update(tiny_dir, tokenizer):
    """Rows regrouped by length into micro-batches: the same loss and gradient as one batch."""
    from transformers import AutoModelForCausalLM

    from rstar.train.rl import _micro_batches

    seqs = [[1] * n for n in (9, 3, 7, 3, 12, 5)]
    batches = _micro_batches([0, 1, 2, 3, 4, 5], seqs, 4)
    assert batches == [[1, 3, 5, 2], [0, 4]]

    prompt = [5, 9, 14, 3]
    responses = [[40 + i] * n for i, n in enumerate((6, 2, 9, 3, 1, 5))]
    kept = [
        {
            "prompt_ids": prompt[: 1 + i % 4],
            "response_ids": r,
            "response_mask": [1] * len(r),
            "group_id": f"g{i // 2}",
            "reward": float(i % 2),
        }
        for i, r in enumerate(responses)
    ]
    updates = []  # loss and gradient norm (Adam's first step is about lr * sign: all noise)
    for micro in (2, 6):
        model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
        c = cfg(1)
        c.micro_batch_size = micro
        m = RLTrainer(model, tokenizer, [], None, c, "unused").update(kept)
        updates.append((m["loss"], m["grad_norm"]))
    assert updates[0] == pytest.approx(updates[1], rel=1e-5) and updates[0][1] > 0
