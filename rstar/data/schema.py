"""The project's Parquet schemas, versioned in one place (documented in docs/schemas.md).

Every file carries its schema name and version in the Parquet key-value metadata
(`rstar.schema`, `rstar.schema_version`), so a reader can refuse a file that is not what
it claims to be with a message naming the file and the problem.
"""

from __future__ import annotations

import pyarrow as pa

VERSION = "1"

_PROBLEM_FIELDS = [
    pa.field("id", pa.string(), nullable=False),  # unique within a dataset
    pa.field("problem", pa.string(), nullable=False),  # the question as the model sees it
    pa.field("answer", pa.string(), nullable=False),  # the label, verified by rstar.reward.verify
    pa.field(
        "source", pa.string(), nullable=False
    ),  # where it came from (file, hub name, generator)
    pa.field(
        "metadata", pa.string(), nullable=False
    ),  # JSON object: everything else the source had
]

SCHEMAS: dict[str, pa.Schema] = {
    "problems": pa.schema(_PROBLEM_FIELDS),
    "hard_problems": pa.schema(
        _PROBLEM_FIELDS
        + [
            pa.field("n_samples", pa.int32(), nullable=False),  # rollouts seen for the problem
            pa.field("n_correct", pa.int32(), nullable=False),
            pa.field("pass_rate", pa.float64(), nullable=False),
        ]
    ),
    "rejects": pa.schema(
        [
            pa.field(
                "row_id", pa.int64(), nullable=False
            ),  # 0-based row (JSONL: line) in its source
            pa.field("source", pa.string(), nullable=False),
            pa.field("reason", pa.string(), nullable=False),  # one of rstar.data.curate.REASONS
            pa.field("detail", pa.string(), nullable=False),
            pa.field("raw", pa.string(), nullable=False),  # the row as JSON, cut to 2,000 chars
        ]
    ),
    "trajectories": pa.schema(
        [
            pa.field("problem_id", pa.string(), nullable=False),
            pa.field(
                "group_id", pa.string(), nullable=False
            ),  # the rollouts of one prompt in one step
            pa.field("sample_index", pa.int32(), nullable=False),  # index within the group
            pa.field("stage", pa.string(), nullable=False),  # sft, rl1, rl2, rl3, eval, ...
            pa.field(
                "policy_step", pa.int32(), nullable=False
            ),  # the policy version that sampled it
            pa.field("prompt_text", pa.string(), nullable=False),
            pa.field(
                "response_text", pa.string(), nullable=False
            ),  # model turns and tool turns, as rendered
            pa.field("prompt_ids", pa.list_(pa.int32()), nullable=False),
            pa.field("response_ids", pa.list_(pa.int32()), nullable=False),
            pa.field(
                "response_mask", pa.list_(pa.int8()), nullable=False
            ),  # 1 model token, 0 tool token
            pa.field("log_probs", pa.list_(pa.float32()), nullable=False),  # sampling log-probs
            pa.field("entropies", pa.list_(pa.float32()), nullable=False),  # per-token entropy
            pa.field("reward", pa.float32(), nullable=False),
            pa.field("answer", pa.string(), nullable=True),  # the extracted final answer
            pa.field(
                "finish_reason", pa.string(), nullable=False
            ),  # answered, no_tool_call, turn_limit, length_limit
            pa.field(
                "turns", pa.int32(), nullable=False
            ),  # assistant turns (p_format's denominator)
            pa.field(
                "num_answers", pa.int32(), nullable=False
            ),  # <answer> blocks (p_format's numerator + 1)
            pa.field("num_tool_calls", pa.int32(), nullable=False),
            pa.field(
                "num_tool_errors", pa.int32(), nullable=False
            ),  # parse errors, errors, timeouts, kills
            pa.field(
                "tool_calls", pa.string(), nullable=False
            ),  # JSON list: turn, code, status, latency_s, detail
            pa.field("prompt_len", pa.int32(), nullable=False),
            pa.field("response_len", pa.int32(), nullable=False),
            pa.field("generate_s", pa.float32(), nullable=False),
            pa.field("tool_s", pa.float32(), nullable=False),
            # RL steps: whether RoC kept the rollout for the update (null outside RL)
            pa.field("kept", pa.bool_(), nullable=True),
        ]
    ),
    "sft": pa.schema(
        [
            pa.field("id", pa.string(), nullable=False),
            pa.field("task", pa.string(), nullable=False),  # what the example teaches
            pa.field("source", pa.string(), nullable=False),
            pa.field(
                "messages", pa.string(), nullable=False
            ),  # JSON list of chat messages (see docs)
        ]
    ),
}


def schema(name: str) -> pa.Schema:
    try:
        base = SCHEMAS[name]
    except KeyError:
        raise KeyError(f"unknown schema {name!r}; known: {sorted(SCHEMAS)}") from None
    return base.with_metadata({"rstar.schema": name, "rstar.schema_version": VERSION})
