"""verl's batch after the rollouts as the trajectories the local trainer writes."""

import json

import numpy as np
import torch
from verl import DataProto

from rstar.agent.verl_adapter import ROW_FIELD
from rstar.data.io import read_table, write_table
from rstar.train.verl_trajectories import agent_rows, trajectory_table


def row(problem_id: str, text: str) -> str:
    return json.dumps(
        {
            "problem_id": problem_id,
            "prompt_text": f"<prompt {problem_id}>",
            "answer": "7",
            "response_text": text,
            "finish_reason": "answered",
            "turns": 2,
            "num_answers": 1,
            "num_tool_calls": 1,
            "num_tool_errors": 0,
            "tool_calls": "[]",
            "generate_s": 0.5,
            "tool_s": 0.25,
        }
    )


def test_rows_are_cut_from_verls_padded_tensors_with_roc_kept_marked(tmp_path):
    # prompts left-padded to 3, responses right-padded to 4 (0: padding); a tool token (mask 0)
    # inside the second response
    prompts = torch.tensor([[0, 11, 12], [21, 22, 23], [0, 0, 31]])
    prompt_valid = torch.tensor([[0, 1, 1], [1, 1, 1], [0, 0, 1]])
    responses = torch.tensor([[101, 102, 0, 0], [201, 202, 203, 204], [301, 0, 0, 0]])
    response_valid = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    response_mask = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 1], [1, 0, 0, 0]])
    log_probs = torch.tensor([[-0.5, -0.25, 0, 0], [-1.0, 0, 0, -2.0], [-3.0, 0, 0, 0]])
    rm_scores = torch.zeros(3, 4)
    rm_scores[1, 3] = 1.0  # verl puts the reward on the last token
    batch = DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "response_mask": response_mask,
            "attention_mask": torch.cat([prompt_valid, response_valid], dim=1),
            "rollout_log_probs": log_probs,
            "rm_scores": rm_scores,
        },
        non_tensors={
            "uid": np.array(["u1", "u1", "u2"], dtype=object),
            ROW_FIELD: np.array([row("p1", "a"), row("p1", "b"), row("p2", "c")], dtype=object),
        },
    )
    table = trajectory_table(batch, agent_rows(batch), "rl1", 3, kept={1, 2})
    path = write_table(table, str(tmp_path / "step=00003.parquet"), "trajectories")
    rows = read_table(path, "trajectories").to_pylist()
    assert [r["prompt_ids"] for r in rows] == [[11, 12], [21, 22, 23], [31]]
    assert [r["response_ids"] for r in rows] == [[101, 102], [201, 202, 203, 204], [301]]
    assert [r["response_mask"] for r in rows] == [[1, 1], [1, 0, 0, 1], [1]]
    assert rows[1]["log_probs"] == [-1.0, 0.0, 0.0, -2.0]
    assert [r["reward"] for r in rows] == [0.0, 1.0, 0.0]
    assert [r["kept"] for r in rows] == [False, True, True]
    assert [r["sample_index"] for r in rows] == [0, 1, 0]
    assert [r["group_id"] for r in rows] == ["rl1/3/p1", "rl1/3/p1", "rl1/3/p2"]
    assert [(r["prompt_len"], r["response_len"]) for r in rows] == [(2, 2), (3, 4), (1, 1)]
    assert {(r["stage"], r["policy_step"]) for r in rows} == {("rl1", 3)}
    assert [r["response_text"] for r in rows] == ["a", "b", "c"]
    assert rows[0]["tool_s"] == 0.25 and rows[0]["entropies"] == []
