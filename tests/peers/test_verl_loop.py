"""verl's ToolAgentLoop and this project's agent loop over one engine and one sandbox: with
greedy decoding they record the same response token ids and loss masks."""

import asyncio

from rstar.agent.loop import LoopConfig
from rstar.data import synth
from rstar.peers.verl_loop import compare_loops, report


def test_both_loops_record_the_same_tokens_and_masks(tiny_dir):
    problems = synth.generate(6, seed=1, levels=(1,), families=["big_product"])
    loop = LoopConfig(max_turns=2, max_response_tokens=24, temperature=0.0, prompt_style="compact")
    ours, theirs, untyped = asyncio.run(compare_loops(tiny_dir, problems, loop))
    assert (ours.loop, theirs.loop) == ("rstar AgentLoop", "verl ToolAgentLoop")
    assert ours.rollouts == theirs.rollouts == 6 and ours.turns >= 6 and theirs.turns >= 6
    assert ours.response_ids == theirs.response_ids and ours.response_masks == theirs.response_masks
    assert all(len(ids) > 0 for ids in ours.response_ids)
    assert untyped.rollouts == 6
    lines = report([ours, theirs, untyped], loop)
    assert any("Same response token ids: 6 of 6; same loss masks: 6 of 6" in line for line in lines)
