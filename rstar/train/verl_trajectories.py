"""A verl RL step's sampled rollouts as rows of the trajectories schema (rstar.data.schema), the
files the local trainer writes: `<dir>/step=NNNNN.parquet`, every rollout sampled, `kept` saying
which RoC kept for the update.

The token columns are cut from verl's padded tensors (prompts left-padded, responses
right-padded, both under `attention_mask`) by Arrow, without a Python list per token; the rest
of a row (texts, tool calls, counts, timings) comes from the agent loop as one JSON field per
rollout (`rstar.agent.verl_adapter.ROW_FIELD`). Per-token entropies are not sampled by verl's
rollout: that column holds empty lists.
"""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pyarrow as pa
import torch

from rstar.agent.verl_adapter import ROW_FIELD
from rstar.data.schema import schema

# the columns of a row that hold one entry per token (entropies are empty here)
TOKEN_COLUMNS = ("prompt_ids", "response_ids", "response_mask", "log_probs")


def ragged(values: torch.Tensor, valid: torch.Tensor) -> pa.ListArray:
    """The entries of each row of `values` where `valid` is 1, in order, as one list per row."""
    lengths = valid.sum(-1).numpy()
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values[valid.bool()].numpy()))


def agent_rows(batch) -> list[dict]:
    """The row the agent loop handed on with each rollout of `batch` (ROW_FIELD), parsed: what
    RoC counts and the trajectory table's non-token columns come from."""
    return [json.loads(s) for s in batch.non_tensor_batch[ROW_FIELD]]


def trajectory_table(batch, agent: list[dict], stage: str, step: int, kept: set[int]) -> pa.Table:
    """`batch` (verl's DataProto after the rollouts, before RoC) as a trajectories table;
    `agent`: its `agent_rows`; `kept`: the indices of the rows RoC keeps."""
    t, nt = batch.batch, batch.non_tensor_batch
    width = t["prompts"].shape[1]
    prompt_valid, response_valid = t["attention_mask"][:, :width], t["attention_mask"][:, width:]
    rows = []
    seen: Counter[str] = Counter()
    for row, uid in zip(agent, nt["uid"], strict=True):
        rows.append(
            {**row, "group_id": f"{stage}/{step}/{row['problem_id']}", "sample_index": seen[uid]}
        )
        seen[uid] += 1
    n = len(rows)
    log_probs = (
        t["rollout_log_probs"]
        if "rollout_log_probs" in t
        else torch.zeros_like(t["responses"], dtype=torch.float32)
    )
    columns = {
        **{k: [row[k] for row in rows] for k in rows[0]},
        "stage": [stage] * n,
        "policy_step": [step] * n,
        "prompt_ids": ragged(t["prompts"], prompt_valid),
        "response_ids": ragged(t["responses"], response_valid),
        "response_mask": ragged(t["response_mask"], response_valid),
        "log_probs": ragged(log_probs.float(), response_valid),
        "entropies": pa.array([[]] * n, pa.list_(pa.float32())),
        "reward": t["rm_scores"].sum(-1).float().numpy(),
        "prompt_len": prompt_valid.sum(-1).numpy(),
        "response_len": response_valid.sum(-1).numpy(),
        "kept": [i in kept for i in range(n)],
    }
    target = schema("trajectories")
    return pa.table({f.name: columns[f.name] for f in target}).cast(target)
