"""The agent loop under verl, on CPU: verl's AgentLoopBase subclass driven by a fake server
manager that returns verl's own TokenOutput (the vLLM replicas it stands for need GPUs)."""

import json

import pytest
import verl.experimental.agent_loop.agent_loop as verl_agent
from omegaconf import OmegaConf
from verl.workers.rollout.replica import TokenOutput

from rstar.agent.format import IM_END, TOOL_NAME
from rstar.agent.verl_adapter import ROW_FIELD
from rstar.sandbox.process import SandboxProcess


class FakeServerManager:
    def __init__(self, tokenizer, turns):
        self.tok, self.turns, self.calls, self.request_ids = tokenizer, list(turns), [], []

    async def generate(self, request_id, prompt_ids, sampling_params, **kw):
        self.calls.append(sampling_params)
        self.request_ids.append(request_id)
        ids = self.tok.encode(self.turns.pop(0), add_special_tokens=False) + [
            self.tok.convert_tokens_to_ids(IM_END)
        ]
        ids = ids[: sampling_params["max_tokens"]]  # as vLLM: cut at the budget, no end token
        return TokenOutput(token_ids=ids, log_probs=[-0.25] * len(ids), stop_reason="completed")


async def run_in_verl(tokenizer, server, rstar: dict, response_length=200, **sampling):
    """RStarAgentLoop as verl's agent-loop worker builds it, run on "What is 6*7?" (label 42)."""
    from rstar.agent.verl_adapter import RStarAgentLoop

    rollout = {"response_length": response_length, "prompt_length": 600}
    rstar = {"prompt_style": "paper", **rstar}
    config = OmegaConf.create({"actor_rollout_ref": {"rollout": rollout}, "rstar": rstar})
    loop = RStarAgentLoop(
        trainer_config=verl_agent.DictConfigWrap(config),
        server_manager=server,
        tokenizer=tokenizer,
        processor=None,
        dataset_cls=None,
        data_config=verl_agent.DictConfigWrap(OmegaConf.create({})),
    )
    return await loop.run(
        {"temperature": 1.0, **sampling},
        extra_info={"problem": "What is 6*7?"},
        reward_model={"ground_truth": "42"},
    )


@pytest.fixture(scope="module")
def sandbox_url():
    with SandboxProcess("--executors", "1", "--slots", "2", "--uid-base", "420000") as proc:
        yield proc.url


@pytest.fixture(autouse=True)
async def close_clients():
    yield
    from rstar.agent.verl_adapter import close_sandbox_clients

    await close_sandbox_clients()


async def test_rstar_agent_loop_in_verl(tokenizer, sandbox_url):
    from rstar.agent.verl_adapter import compute_score

    assert verl_agent._agent_loop_registry["rstar_agent"]["_target_"].endswith("RStarAgentLoop")
    call = json.dumps({"name": TOOL_NAME, "arguments": {"code": "print(6*7)", "input": ""}})
    server = FakeServerManager(
        tokenizer,
        [
            f"<reason>compute</reason>\n<tool_call>\n{call}\n</tool_call>",
            "<reason>ok</reason>\n<answer>\\boxed{42}</answer>",
        ],
    )
    out = await run_in_verl(
        tokenizer, server, {"sandbox_url": sandbox_url, "sampling": {"max_turns": 4}}, top_p=1.0
    )
    assert isinstance(out, verl_agent.AgentLoopOutput)
    assert out.reward_score == 1.0  # scored in the loop: verl takes it as rm_scores
    # one request id for every turn of the rollout (verl's router keeps it on one replica),
    # log-probs asked for
    assert len(server.request_ids) == 2 and len(set(server.request_ids)) == 1
    assert all(c["logprobs"] is True for c in server.calls)
    assert len(out.response_ids) == len(out.response_mask) == len(out.response_logprobs)
    row = json.loads(out.extra_fields[ROW_FIELD])
    assert row["finish_reason"] == "answered"
    assert row["num_tool_calls"] == 1 and row["num_tool_errors"] == 0
    tool_text = tokenizer.decode([t for t, m in zip(out.response_ids, out.response_mask) if not m])
    assert "<tool_response>\n42\n</tool_response>" in tool_text  # the real sandbox ran the call
    assert server.calls[0]["max_tokens"] == 200 and server.calls[1]["max_tokens"] < 200
    text = tokenizer.decode(out.response_ids)
    assert compute_score("synthetic", text, "42") == 1.0
    assert compute_score("synthetic", text, "42", {"rstar_truncated": True}) == 0.0
    batch = out.as_dict()  # what verl's worker turns into tensors
    assert batch["responses"].shape == batch["response_mask"].shape


async def test_sandbox_tool_for_verls_tool_loop(sandbox_url):
    from rstar.agent.verl_adapter import SandboxTool

    tool = SandboxTool({"sandbox_url": sandbox_url, "timeout_s": 3})
    assert tool.name == TOOL_NAME
    iid, _ = await tool.create()
    resp, reward, metrics = await tool.execute(
        iid, {"code": "n = int(input())\nn * 2", "input": "21"}
    )
    assert resp.text == "42" and metrics["status"] == "ok"
    resp, _, metrics = await tool.execute(iid, {"code": 5})
    assert metrics["status"] == "parse_error" and "Invalid arguments" in resp.text


async def test_a_call_the_sandbox_never_ran_is_counted_apart_from_code_errors(
    tokenizer, monkeypatch
):
    from rstar.agent import verl_adapter
    from rstar.sandbox.client import SandboxClient

    # the loop's client for this URL, retrying for 2 s instead of the 60 s a restart may take
    url = "http://127.0.0.1:9"
    client = await SandboxClient(url, retry_for_s=2.0).__aenter__()
    monkeypatch.setitem(verl_adapter._clients, url, client)
    call = json.dumps({"name": TOOL_NAME, "arguments": {"code": "print(6*7)", "input": ""}})
    server = FakeServerManager(
        tokenizer,
        [
            f"<reason>compute</reason>\n<tool_call>\n{call}\n</tool_call>",
            "<reason>ok</reason>\n<answer>\\boxed{42}</answer>",
        ],
    )
    out = await run_in_verl(
        tokenizer,
        server,
        {"sandbox_url": url, "sampling": {"max_turns": 4, "tool_timeout_s": 1.0}},
    )
    await client.close()
    # the row verl's trainer gets counts it as a tool error (what RoC reads) and says the
    # sandbox never ran it (rollout/sandbox_failure_rate)
    row = json.loads(out.extra_fields[ROW_FIELD])
    assert row["num_tool_errors"] == 1
    assert [c["status"] for c in json.loads(row["tool_calls"])] == ["rejected"]
    assert "Rejected: sandbox unreachable" in tokenizer.decode(
        [t for t, m in zip(out.response_ids, out.response_mask) if not m]
    )


async def test_a_truncated_rollout_scores_zero_even_with_the_right_answer_in_it(
    tokenizer, sandbox_url
):
    """The paper keeps over-long rollouts with reward 0: a turn cut at the response budget
    after a correct `<answer>` still scores 0 inside verl's agent loop."""
    from rstar.agent.verl_adapter import compute_score

    answer = "<reason>ok</reason>\n<answer>\\boxed{42}</answer>"
    budget = len(tokenizer.encode(answer, add_special_tokens=False)) + 5
    server = FakeServerManager(tokenizer, [answer + " and then some more words" * 20])
    out = await run_in_verl(
        tokenizer,
        server,
        {"sandbox_url": sandbox_url, "sampling": {"max_turns": 4}},
        response_length=budget,
    )
    text = tokenizer.decode(out.response_ids)
    assert answer in text and len(out.response_ids) == budget  # right, and cut
    assert out.extra_fields["rstar_truncated"] and out.reward_score == 0.0
    assert compute_score("synthetic", text, "42") == 1.0  # the same text, not cut: correct
