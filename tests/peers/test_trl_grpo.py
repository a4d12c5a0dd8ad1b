"""TRL's GRPOTrainer as the peer: it sees the prompts, tool calls and tool turns this project's
agent loop produces, token for token, and trains on the tiny model with the sandbox as its tool."""

import pytest

from rstar.agent.format import IM_END, STYLES, TOOL_NAME, prompt_ids, saved_style, tool_turn
from rstar.bench.peers.trl_grpo import train_trl, trl_chat_template


@pytest.fixture
def trl_tokenizer(tiny_dir):
    from transformers import AutoTokenizer
    from trl.chat_template_utils import qwen3_schema

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    tok.eos_token, tok.response_schema, tok.chat_template = (
        IM_END,
        qwen3_schema,
        trl_chat_template(),
    )
    return tok


def test_trl_renders_the_agent_loops_prompt_tool_call_and_tool_turn(tokenizer, trl_tokenizer):
    from trl.chat_template_utils import is_chat_template_prefix_preserving, supports_tool_calling

    assert supports_tool_calling(trl_tokenizer) and is_chat_template_prefix_preserving(
        trl_tokenizer
    )
    problem = "What is 12345 * 6789?"
    ours = prompt_ids(tokenizer, problem, "compact")

    def tool(code: str, input: str = "") -> str:
        """Run code.

        Args:
            code: the code.
            input: standard input.
        """

    tool.__name__ = TOOL_NAME
    theirs = trl_tokenizer.apply_chat_template(
        STYLES["compact"].messages(problem),
        tools=[tool],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    assert theirs == ours  # TRL passes its tools on every prompt; the compact prompt lists none

    turn = (
        f'<tool_call>\n{{"name": "{TOOL_NAME}", "arguments": {{"code": "print(6 * 7)", "input": '
        f'""}}}}\n</tool_call>{IM_END}'
    )
    parsed = trl_tokenizer.parse_response(turn)
    call = parsed["tool_calls"][0]["function"]
    assert call == {"name": TOOL_NAME, "arguments": {"code": "print(6 * 7)", "input": ""}}

    # what TRL appends after a turn that called the tool: its template's tool turn, cut at the
    # turn's end
    dummy = [
        {"role": "user", "content": "dummy"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": call}],
        },
    ]
    prefix = trl_tokenizer.apply_chat_template(dummy, tokenize=True, return_dict=False)
    full = trl_tokenizer.apply_chat_template(
        dummy + [{"role": "tool", "name": TOOL_NAME, "content": "42"}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    end = max(i for i, t in enumerate(prefix) if t == trl_tokenizer.eos_token_id) + 1
    assert full[:end] == prefix[:end]
    assert full[end:] == tokenizer.encode(tool_turn(["42"]), add_special_tokens=False)


def test_trl_trains_with_the_sandbox_as_its_tool(tiny_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from rstar.agent.sampling import Sampling
    from rstar.algo.roc import RoCConfig
    from rstar.data import synth
    from rstar.train.config import RLConfig

    problems = synth.generate(16, seed=0, levels=(1,), families=["big_product"])
    cfg = RLConfig(
        steps=2,
        prompts_per_step=2,
        roc=RoCConfig(group_size=2),
        sampling=Sampling(max_response_tokens=16, max_turns=2, temperature=1.0),
        lr=1e-4,
        prompt_style="compact",
    )
    seen = []
    history = train_trl(
        tiny_dir,
        problems,
        cfg,
        str(tmp_path / "trl"),
        on_step=lambda step, m: seen.append(step),
    )
    assert seen == [1, 2] and [h["step"] for h in history] == [1, 2]
    for h in history:
        assert h["time_step_s"] > 0 and h["tokens"] > 0 and 0 <= h["accuracy"] <= 1
        assert (
            h["time_rollout_s"] + h["time_reward_s"] + h["time_update_s"]
            == pytest.approx(h["time_step_s"], rel=1e-6)
            or h["time_update_s"] == 0.0
        )
    # a Hugging Face directory the evaluator can load
    AutoModelForCausalLM.from_pretrained(str(tmp_path / "trl"))
    assert saved_style(str(tmp_path / "trl")) == "compact"
