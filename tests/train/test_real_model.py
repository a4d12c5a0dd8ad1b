"""The recipe's code paths on a real pretrained model: SmolLM2-135M-Instruct loaded from the GGUF
file its package ships, a real 49,152-type BPE tokenizer and chat template. SFT's loss mask covers
exactly the model's tokens; a few SFT steps teach the tool-call format; rollouts run real tool
calls through the sandbox; one GRPO-RoC update moves the weights."""

import json

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rstar.agent.format import IM_END, STYLES, render
from rstar.agent.sampling import Sampling
from rstar.algo.roc import RoCConfig
from rstar.data import sft as sft_data
from rstar.train.config import RLConfig, SFTConfig
from rstar.train.rl import RLTrainer
from rstar.train.sft import encode_example, train_sft


def test_the_sft_mask_covers_exactly_the_assistant_turns(real_tokenizer):
    """On a real BPE tokenizer, the masked tokens are each assistant turn as the agent loop
    records it: the turn's own encoding, then <|im_end|>; nothing of the prompt or the tools."""
    tok = real_tokenizer
    style = STYLES["paper"]
    for task in ("calc", "error_recovery", "instruction"):
        (row,) = sft_data.generate(1, seed=5, tasks=[task])
        messages = [{"role": "system", "content": style.system}] + json.loads(row["messages"])
        ids, mask = encode_example(tok, messages, 4096, "paper")
        assert tok.decode(ids) == render(messages, tools=style.tools)
        expected = []
        for i, m in enumerate(messages):
            if m["role"] == "assistant":
                before = render(messages[:i], tools=style.tools, add_generation_prompt=True)
                turn = render(messages[: i + 1], tools=style.tools)[len(before) :]
                assert turn.endswith(IM_END + "\n")
                expected += tok.encode(turn[: -len(IM_END + "\n")], add_special_tokens=False)
                expected.append(tok.convert_tokens_to_ids(IM_END))
        assert [t for t, m in zip(ids, mask) if m] == expected, task


async def test_sft_then_rollouts_with_tool_calls_then_one_rl_update(
    smollm2_base, agent_sandbox, tmp_path
):
    base = smollm2_base[0].model.uri
    tok = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)

    # a few SFT steps on one tool-use task: the real model picks up the format fast
    rows = sft_data.generate(12, seed=1, tasks=["calc"])
    history = train_sft(
        model,
        tok,
        rows,
        SFTConfig(epochs=2, lr=2e-4, batch_size=4, micro_batch_size=4, prompt_style="compact"),
    )
    assert len(history) == 6 and history[-1]["loss"] < history[0]["loss"] / 2

    problems = [
        {"id": f"p{i}", "problem": f"Please compute {a}*{b} exactly, using code.", "answer": a * b}
        for i, (a, b) in enumerate([(17, 23), (48, 91)])
    ]
    problems = [{**p, "answer": str(p["answer"])} for p in problems]
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    cfg = RLConfig(
        steps=1,
        prompts_per_step=2,
        roc=RoCConfig(group_size=2),
        sampling=Sampling(max_response_tokens=160, max_turns=2, temperature=1.0),
        lr=1e-5,
        warmup_steps=0,
        micro_batch_size=8,
        seed=3,
        prompt_style="compact",
    )
    trainer = RLTrainer(model, tok, problems, agent_sandbox, cfg, str(tmp_path / "rl"))
    await trainer.run()
    (step,) = trainer.history
    # the rollouts called the tool through the sandbox, and some ran
    assert step["rollouts"] == 8 and step["kept"] == 4
    assert step["tool_calls_per_rollout"] > 0.5, step
    assert step["tool_error_rate"] < 1.0, step
    assert torch.isfinite(torch.tensor(step["loss"]))
    moved = sum(not torch.equal(p, before[n]) for n, p in model.named_parameters())
    assert moved == len(before)  # one update reached every weight
