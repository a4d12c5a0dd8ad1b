"""The agent loop on a scripted engine (the GPU boundary; the real engine is tested apart):
format round trip, malformed tool calls, limits and finish reasons, the loss mask."""

import json
import time

import pytest

from rstar.agent.format import (
    IM_END,
    TOOL_NAME,
    TOOL_SCHEMA,
    parse_tool_calls,
    problem_messages,
    tool_turn,
)
from rstar.agent.loop import AgentLoop, Generation
from rstar.agent.sampling import Sampling


class ScriptedEngine:
    """Returns the next scripted assistant turn; records the prompts it was given."""

    def __init__(self, tokenizer, turns: list[str], max_tokens_hit: bool = False):
        self.tok, self.turns, self.prompts = tokenizer, list(turns), []

    async def generate(self, request_id, prompt_ids, sampling_params):
        self.prompts.append(list(prompt_ids))
        text = self.turns.pop(0)
        ids = self.tok.encode(text, add_special_tokens=False)
        stop = "stop"
        if len(ids) + 1 > sampling_params["max_tokens"]:
            ids, stop = ids[: sampling_params["max_tokens"]], "length"
        else:
            ids = ids + [self.tok.convert_tokens_to_ids(IM_END)]
        return Generation(ids, [-0.5] * len(ids), [1.0] * len(ids), stop)


def call(code, inp="", name=TOOL_NAME):
    return (
        "<tool_call>\n"
        + json.dumps({"name": name, "arguments": {"code": code, "input": inp}})
        + "\n</tool_call>"
    )


TOKENIZERS = {"tiny": "tokenizer", "smollm2": "real_tokenizer", "qwen3": "qwen3_tokenizer"}


@pytest.fixture(params=list(TOKENIZERS))
def any_tokenizer(request):
    """The tiny model's tokenizer (1,584 types, trained here), SmolLM2's (49,152 BPE types, from
    its GGUF file) and the 14B recipe's (Qwen3's 151,669, whose own template would open a final
    assistant turn with an empty think block): after the base stage, the format holds for
    each."""
    return request.getfixturevalue(TOKENIZERS[request.param])


def test_template_renders_what_the_loop_appends(any_tokenizer):
    """prompt + assistant turn + tool_turn(...) + assistant turn == the template's rendering."""
    tokenizer = any_tokenizer
    t1 = "<reason>compute</reason>\n" + call("print(6*7)")
    t2 = "<reason>read it</reason>\n<answer>\\boxed{42}</answer>"
    messages = problem_messages("What is 6*7?") + [
        {
            "role": "assistant",
            "content": "<reason>compute</reason>",
            "tool_calls": [{"name": TOOL_NAME, "arguments": {"code": "print(6*7)", "input": ""}}],
        },
        {"role": "tool", "content": "42"},
        {"role": "assistant", "content": t2},
    ]
    rendered = tokenizer.apply_chat_template(messages, tools=[TOOL_SCHEMA], tokenize=False)
    prompt = tokenizer.apply_chat_template(
        problem_messages("What is 6*7?"),
        tools=[TOOL_SCHEMA],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert (
        rendered
        == prompt
        + t1
        + IM_END
        + tool_turn(["42"])[: -len("<|im_start|>assistant\n")]
        + "<|im_start|>assistant\n"
        + t2
        + IM_END
        + "\n"
    )
    assert TOOL_NAME in prompt and "<tools>" in prompt and "\\boxed{}" in prompt
    # several tool messages share one user turn, as tool_turn renders them
    two = [
        {
            "role": "assistant",
            "content": "x",
            "tool_calls": [{"name": TOOL_NAME, "arguments": {"code": "1"}}] * 2,
        },
        {"role": "tool", "content": "a"},
        {"role": "tool", "content": "b"},
    ]
    text = tokenizer.apply_chat_template(two, tokenize=False, add_generation_prompt=True)
    assert text.endswith(IM_END + tool_turn(["a", "b"]))


@pytest.mark.parametrize(
    "text,error",
    [
        ("<tool_call>{not json}</tool_call>", "Failed to decode tool call"),
        ("<tool_call>[1, 2]</tool_call>", "must be a JSON object"),
        (
            '<tool_call>{"name": "web_search", "arguments": {"q": "x"}}</tool_call>',
            "Unknown tool 'web_search'",
        ),
        (
            f'<tool_call>{{"name": "{TOOL_NAME}", "arguments": {{"code": 5}}}}</tool_call>',
            "Invalid arguments",
        ),
        (
            f'<tool_call>{{"name": "{TOOL_NAME}", "arguments": {{"code": "1", "input": '
            "2}}</tool_call>",
            "Invalid arguments",
        ),
        (
            f'<tool_call>{{"name": "{TOOL_NAME}", "arguments": "not an object"}}</tool_call>',
            "Invalid arguments",
        ),
        ('<tool_call>{"name": "x"', "without </tool_call>"),
    ],
)
def test_malformed_tool_calls_become_error_responses(text, error):
    calls = parse_tool_calls(text)
    assert len(calls) == 1 and calls[0].arguments is None and error in calls[0].error


def test_well_formed_and_double_encoded_calls():
    double = json.dumps({"name": TOOL_NAME, "arguments": json.dumps({"code": "1+1"})})
    calls = parse_tool_calls(call("print(1)", "x") + f"<tool_call>{double}</tool_call>")
    assert [c.arguments for c in calls] == [
        {"code": "print(1)", "input": "x"},
        {"code": "1+1", "input": ""},
    ]


async def test_multi_turn_record_and_mask(any_tokenizer, agent_sandbox):
    tokenizer = any_tokenizer
    turns = [
        "<reason>first</reason>" + call("print(6*7)"),
        "<reason>bad call</reason><tool_call>{oops}</tool_call>",
        "<reason>done</reason>\n<answer>\\boxed{42}</answer>",
    ]
    engine = ScriptedEngine(tokenizer, turns)
    traj = await AgentLoop(engine, tokenizer, agent_sandbox, Sampling()).run("What is 6*7?", "r1")
    assert traj.finish_reason == "answered" and traj.turns == 3
    assert [(c.status, c.turn) for c in traj.tool_calls] == [("ok", 1), ("parse_error", 2)]
    assert traj.num_tool_errors == 1 and traj.num_answers == 1
    n = len(traj.response_ids)
    assert len(traj.response_mask) == len(traj.log_probs) == len(traj.entropies) == n
    model = [t for t, m in zip(traj.response_ids, traj.response_mask) if m]
    tool = tokenizer.decode([t for t, m in zip(traj.response_ids, traj.response_mask) if not m])
    scripted = sum(
        (
            tokenizer.encode(t, add_special_tokens=False)
            + [tokenizer.convert_tokens_to_ids(IM_END)]
            for t in turns
        ),
        [],
    )
    assert model == scripted  # every generated token, and nothing else, is trainable
    assert "<tool_response>\n42\n</tool_response>" in tool and "Failed to decode tool call" in tool
    assert all(lp == 0.0 for lp, m in zip(traj.log_probs, traj.response_mask) if not m)
    # each turn was generated from the full context so far
    assert (
        engine.prompts[1]
        == traj.prompt_ids + traj.response_ids[: len(engine.prompts[1]) - len(traj.prompt_ids)]
    )
    assert traj.response_text == tokenizer.decode(traj.response_ids, skip_special_tokens=False)
    # the whole conversation round-trips: the ids the loop built are what its text encodes to
    ids = traj.prompt_ids + traj.response_ids
    assert tokenizer.encode(tokenizer.decode(ids), add_special_tokens=False) == ids
    # generation stops at the end of a turn, and only there
    assert AgentLoop(None, tokenizer, None, Sampling()).stop_ids == [
        tokenizer.convert_tokens_to_ids(IM_END)
    ]


async def test_a_failed_calls_error_and_a_timeout_reach_the_model(tokenizer, agent_sandbox):
    """The paper's point: the model reads what went wrong. An exception comes back with what
    was printed before it and its traceback, a call past its time limit with the limit named;
    both count as tool errors."""
    turns = [
        call("print('before')\n1/0"),
        call("import time\ntime.sleep(30)"),
        "<answer>\\boxed{1}</answer>",
    ]
    loop = AgentLoop(
        ScriptedEngine(tokenizer, turns), tokenizer, agent_sandbox, Sampling(tool_timeout_s=0.5)
    )
    traj = await loop.run("p", "r")
    assert [c.status for c in traj.tool_calls] == ["error", "timeout"]
    assert traj.num_tool_errors == 2
    tool = tokenizer.decode([t for t, m in zip(traj.response_ids, traj.response_mask) if not m])
    first, second = tool.split("</tool_response>")[:2]
    assert "before" in first and "Traceback" in first and "ZeroDivisionError" in first, first
    assert "Timeout" in second and "0.5s" in second, second


async def test_finish_reasons(tokenizer, agent_sandbox):
    async def run(turns, **cfg):
        return await AgentLoop(
            ScriptedEngine(tokenizer, turns), tokenizer, agent_sandbox, Sampling(**cfg)
        ).run("p", "r")

    assert (await run(["I just talk."])).finish_reason == "no_tool_call"
    t = await run([call("print(1)")] * 5, max_turns=3)
    assert (t.finish_reason, t.turns, len(t.tool_calls)) == ("turn_limit", 3, 2)
    t = await run(["word " * 500], max_response_tokens=100)
    assert t.finish_reason == "length_limit" and len(t.response_ids) == 100 and t.truncated
    # a long tool response is cut to the token limit, then the budget runs out on tool tokens
    t = await run(
        [call("print('x' * 5000)"), "<answer>\\boxed{1}</answer>"],
        max_tool_response_tokens=20,
        max_response_tokens=60,
    )
    assert (
        t.finish_reason == "length_limit" and len(t.response_ids) == 60 and t.response_mask[-1] == 0
    )
    t = await run(
        [call("print('y ' * 3000)"), "<answer>\\boxed{1}</answer>"], max_tool_response_tokens=20
    )
    assert t.finish_reason == "answered" and "tool response truncated" in t.response_text


async def test_calls_in_one_turn_run_concurrently(tokenizer, agent_sandbox):
    slow = call("import time\ntime.sleep(0.6)\nprint('done')")
    engine = ScriptedEngine(tokenizer, [slow + slow + slow, "<answer>\\boxed{3}</answer>"])
    start = time.monotonic()
    traj = await AgentLoop(engine, tokenizer, agent_sandbox, Sampling()).run("p", "r")
    assert [c.status for c in traj.tool_calls] == ["ok"] * 3
    assert traj.tool_s < 1.5 and time.monotonic() - start < 3  # not 3 x 0.6 s one after another
    assert traj.response_text.count("<tool_response>\ndone\n</tool_response>") == 3


def test_compact_style_keeps_the_format_and_drops_the_preamble(tokenizer):
    from rstar.agent.format import STYLES

    paper, compact = STYLES["paper"], STYLES["compact"]

    def render(st):
        return tokenizer.apply_chat_template(
            st.messages("What is 6*7?"), tools=st.tools, tokenize=False, add_generation_prompt=True
        )

    short, long = render(compact), render(paper)
    assert "<tools>" in long and "<tools>" not in short
    assert (
        "<answer>" in short
        and "\\boxed{}" in short
        and short.endswith("What is 6*7?<|im_end|>\n<|im_start|>assistant\n")
    )
    assert len(tokenizer.encode(short)) * 4 < len(tokenizer.encode(long))
    loop = AgentLoop(None, tokenizer, None, Sampling(), "compact")
    assert loop.prompt_ids("What is 6*7?") == tokenizer.encode(short, add_special_tokens=False)


async def test_the_runner_scores_a_truncated_rollout_zero_even_with_the_right_answer_in_it(
    tokenizer,
):
    """Through `rstar.rollout.runner.rollout` (what the local trainer, mining and evaluation
    use): a turn cut at the response budget after a correct answer is kept with reward 0; the
    same turn within budget scores 1."""
    from rstar.reward.score import BatchScorer
    from rstar.rollout.runner import rollout

    answer = "<reason>ok</reason>\n<answer>\\boxed{42}</answer>"
    turn = answer + " and then some more words" * 20
    fits = len(tokenizer.encode(turn, add_special_tokens=False)) + 1
    problem = {"id": "p", "problem": "What is 6*7?", "answer": "42"}
    rewards = {}
    with BatchScorer(workers=1) as scorer:
        for budget in (fits - 20, fits):
            loop = AgentLoop(
                ScriptedEngine(tokenizer, [turn]),
                tokenizer,
                sandbox=None,
                sampling=Sampling(max_response_tokens=budget),
            )
            (record,) = await rollout(loop, [problem], 1, scorer=scorer)
            assert answer in loop.tok.decode(record["response_ids"])
            rewards[record["finish_reason"]] = (record["reward"], record["answer"])
    assert rewards == {"length_limit": (0.0, "42"), "answered": (1.0, "42")}
