"""The same RL stage trained by Hugging Face TRL's `GRPOTrainer` (the optional `bench` extra, TRL
1.12: the newest verl 0.9.1 can run beside, as verl imports `trl.experimental.ppo` when TRL is
there): the tiny SFT model, the same problems and prompts, G, temperature, token and turn limits,
optimizer and schedule, this project's sandbox as the tool and its answer-only reward.

What TRL cannot express runs as TRL does it, and the bench says so: plain GRPO (no RoC
over-sampling and down-sampling); tool calls parsed by TRL's Qwen-style response schema, so a
malformed call ends the turn instead of being answered with its parse error; tool calls of a
batch run one after another.
"""

from __future__ import annotations

import asyncio
import os
import time

from rstar.agent.format import CHAT_TEMPLATE, EOS, IM_END, STYLES, TOOL_NAME, save_style
from rstar.agent.loop import tool_response
from rstar.reward.score import BatchScorer, ScoreItem
from rstar.sandbox.result import ExecRequest
from rstar.train.config import RLConfig
from rstar.train.rl import optimizer_and_schedule

_FLAT_CALL = "({'name': c.name, 'arguments': c.arguments} | tojson)"
_FN = "(c.function if c.function is defined else c)"


def trl_chat_template() -> str:
    """This project's chat template as TRL's tool loop needs it: tool calls in the Hugging Face
    message shape (`{"function": {...}}`) render like ours, and no tools block (TRL passes the
    tools on every prompt; the compact prompt style, which the tiny model learnt, lists none)."""
    assert _FLAT_CALL in CHAT_TEMPLATE, (
        "rstar.agent.format.CHAT_TEMPLATE changed: update trl_chat_template"
    )
    standard = f"({{'name': {_FN}.name, 'arguments': {_FN}.arguments}} | tojson)"
    return "{%- set tools = none -%}" + CHAT_TEMPLATE.replace(_FLAT_CALL, standard)


def _completion_text(messages: list[dict]) -> str:
    return "".join(m.get("content") or "" for m in messages if m["role"] == "assistant")


def train_trl(
    model_dir: str,
    problems: list[dict],
    cfg: RLConfig,
    out_dir: str,
    *,
    on_step=None,
) -> list[dict]:
    """Train `cfg.steps` steps of TRL's GRPO from `model_dir` into `out_dir` (a Hugging Face
    directory with this project's tokenizer and prompt style); returns per-step metrics with
    the same names as rstar.train.rl's where they mean the same thing."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen3_schema

    from rstar.sandbox.service import embedded_sandbox

    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.eos_token = IM_END  # the end of an assistant turn: where TRL cuts the tool-response suffix
    tok.response_schema = qwen3_schema  # <tool_call>{json}</tool_call>, as this project's format
    tok.chat_template = trl_chat_template()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    style = STYLES[cfg.prompt_style]
    data = Dataset.from_list(
        [{"prompt": style.messages(p["problem"]), "answer": p["answer"]} for p in problems]
    )
    sandbox = embedded_sandbox()
    clock = {"tool_s": 0.0, "reward_s": 0.0, "generate_s": 0.0, "tool_calls": 0}

    async def execute_python_code_with_standard_io(code: str, input: str = "") -> str:
        """Execute Python code. Standard input is given by `input`; the response is the standard
        output, the value of a final bare expression, or the error.

        Args:
            code: Python code to run.
            input: Text given to the code on standard input.
        """
        start = time.monotonic()
        res = (await sandbox.run_many([ExecRequest(code, input, cfg.sampling.tool_timeout_s)]))[0]
        clock["tool_s"] += time.monotonic() - start
        clock["tool_calls"] += 1
        return tool_response(res, tok, cfg.sampling.max_tool_response_tokens)

    assert execute_python_code_with_standard_io.__name__ == TOOL_NAME
    scorer = BatchScorer(workers=1)

    def answer_only(prompts, completions, answer, **_) -> list[float]:
        start = time.monotonic()
        rewards = scorer.score_many(
            [ScoreItem(_completion_text(c), a, False) for c, a in zip(completions, answer)]
        )
        clock["reward_s"] += time.monotonic() - start
        return [float(r) for r in rewards]

    class TimedGRPO(GRPOTrainer):
        """Times generation (tool calls included) apart from the update."""

        def _generate(self, prompts):
            start = time.monotonic()
            try:
                return super()._generate(prompts)
            finally:
                clock["generate_s"] += time.monotonic() - start

    opt, sched = optimizer_and_schedule(model, cfg)  # the local trainer's own
    args = GRPOConfig(
        output_dir=out_dir,
        max_steps=cfg.steps,
        seed=cfg.seed,
        use_cpu=True,
        bf16=False,
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        per_device_train_batch_size=cfg.prompts_per_step * cfg.roc.group_size,
        num_generations=cfg.roc.group_size,
        gradient_accumulation_steps=1,
        num_iterations=1,
        max_grad_norm=cfg.max_grad_norm,
        temperature=cfg.sampling.temperature,
        top_p=cfg.sampling.top_p,
        max_completion_length=cfg.sampling.max_response_tokens,
        max_tool_calling_iterations=cfg.sampling.max_turns - 1,
        beta=0.0,
        epsilon=cfg.clip_low,
        epsilon_high=cfg.clip_high,
        loss_type="dapo",
        scale_rewards="group",
        generation_kwargs={
            "eos_token_id": [tok.convert_tokens_to_ids(IM_END), tok.convert_tokens_to_ids(EOS)]
        },
    )
    trainer = TimedGRPO(
        model=model,
        reward_funcs=answer_only,
        args=args,
        train_dataset=data,
        processing_class=tok,
        tools=[execute_python_code_with_standard_io],
        optimizers=(opt, sched),
    )
    # the sandbox lives in TRL's own event loop, where it runs async tools
    asyncio.run_coroutine_threadsafe(sandbox.start(), trainer.async_loop).result()
    history: list[dict] = []
    previous = dict(clock)

    from transformers import PrinterCallback, TrainerCallback

    class PerStep(TrainerCallback):
        def on_log(self, args_, state, control, logs=None, **kw):
            if not logs or "step_time" not in logs:
                return
            spent = {k: clock[k] - previous[k] for k in clock}
            previous.update(clock)
            step = {
                "step": state.global_step,
                "accuracy": logs["reward"],
                "response_len_mean": logs["completions/mean_length"],
                "tokens": logs["completions/mean_length"] * args.per_device_train_batch_size,
                "tool_calls_per_rollout": logs.get("tools/call_frequency", 0.0),
                "time_step_s": logs["step_time"],
                "time_rollout_s": spent["generate_s"],
                "time_tool_s": spent["tool_s"],
                "time_reward_s": spent["reward_s"],
                "time_update_s": max(
                    0.0, logs["step_time"] - spent["generate_s"] - spent["reward_s"]
                ),
            }
            history.append(step)
            if on_step:
                on_step(state.global_step, step)

    trainer.add_callback(PerStep())
    # its per-step dict of every metric: the bench prints its own line
    trainer.remove_callback(PrinterCallback)
    try:
        trainer.train()
    finally:
        asyncio.run_coroutine_threadsafe(sandbox.close(), trainer.async_loop).result()
        scorer.close()
    model.save_pretrained(out_dir)
    saved = AutoTokenizer.from_pretrained(model_dir)  # this project's tokenizer, template and all
    saved.save_pretrained(out_dir)
    save_style(out_dir, cfg.prompt_style)
    os.makedirs(out_dir, exist_ok=True)
    return history
