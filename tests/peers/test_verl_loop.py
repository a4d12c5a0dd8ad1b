"""verl's ToolAgentLoop and this project's agent loop over one engine and one sandbox: with
greedy decoding they record the same response token ids and loss masks."""

import asyncio

from rstar.agent.sampling import Sampling
from rstar.bench.peers.verl_loop import compare_loops, report
from rstar.train.config import RLConfig
from tests.conftest import product_problems


def test_both_loops_record_the_same_tokens_and_masks(tiny_sft):
    """On the SFT model, which calls the tool: the comparison covers tool turns and their
    masked tokens, not only single-turn answers."""
    problems = product_problems(6)
    loop = RLConfig(
        sampling=Sampling(max_turns=3, max_response_tokens=96, temperature=0.0),
        prompt_style="compact",
    )
    ours, theirs, untyped = asyncio.run(compare_loops(tiny_sft, problems, loop))
    assert (ours.loop, theirs.loop) == ("rstar AgentLoop", "verl ToolAgentLoop")
    assert ours.rollouts == theirs.rollouts == 6 and ours.turns >= 6 and theirs.turns >= 6
    assert ours.response_ids == theirs.response_ids and ours.response_masks == theirs.response_masks
    assert all(len(ids) > 0 for ids in ours.response_ids)
    tool_tokens = [mask.count(0) for mask in ours.response_masks]
    assert sum(n > 0 for n in tool_tokens) >= 2, tool_tokens  # rollouts with tool responses
    assert untyped.rollouts == 6
    lines = report([ours, theirs, untyped], loop)
    assert any("Same response token ids: 6 of 6; same loss masks: 6 of 6" in line for line in lines)
