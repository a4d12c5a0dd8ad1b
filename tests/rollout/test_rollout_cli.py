"""`rstar rollout` end to end: the tiny model, the local engine, the sandbox, Parquet out."""
import json

import pyarrow.parquet as pq
from typer.testing import CliRunner

from rstar.cli import app
from rstar.data import synth
from rstar.data.io import read_table, write_table
from rstar.data.schema import schema


def test_rollout_command_writes_readable_trajectories(tiny_dir, tmp_path):
    problems = str(tmp_path / "p.parquet")
    write_table(synth.generate(3, seed=5, levels=(1,)), problems, "problems")
    out = str(tmp_path / "traj.parquet")
    r = CliRunner().invoke(app, ["rollout", "--model", tiny_dir, "--problems", problems, "--out", out, "--k", "2",
                                 "--max-response-tokens", "40", "--max-turns", "2"])
    assert r.exit_code == 0, r.output
    table = read_table(out, "trajectories")
    assert table.schema.names == schema("trajectories").names and len(table) == 6
    assert pq.read_metadata(out).metadata[b"rstar.schema_version"] == b"1"
    rows = table.to_pylist()
    assert sorted((x["problem_id"], x["sample_index"]) for x in rows) == sorted(
        (p["id"], i) for p in synth.generate(3, seed=5, levels=(1,)) for i in range(2))
    for x in rows:
        n = x["response_len"]
        assert len(x["response_ids"]) == len(x["response_mask"]) == len(x["log_probs"]) == n <= 40
        assert x["finish_reason"] in ("answered", "no_tool_call", "turn_limit", "length_limit")
        assert x["reward"] in (0.0, 1.0) and isinstance(json.loads(x["tool_calls"]), list)
    summary = json.loads(r.output[r.output.index("{"):r.output.rindex("}") + 1])
    assert summary["rollouts"] == 6 and 0 <= summary["accuracy"] <= 1 and summary["model_tokens_per_s"] > 0
