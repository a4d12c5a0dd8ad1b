"""`rstar rollout` end to end: the tiny model, the local engine, the sandbox, Parquet out."""

import json

import pyarrow.parquet as pq
from typer.testing import CliRunner

from rstar.agent.loop import FINISH_REASONS
from rstar.cli import app
from rstar.data import synth
from rstar.data.io import read_table, write_table
from rstar.data.schema import schema


def invoke(command: str):
    """`rstar <command>` through typer's test runner (no word of it has a space)."""
    return CliRunner().invoke(app, command.split())


def test_rollout_command_writes_readable_trajectories(tiny_dir, tmp_path):
    problems = str(tmp_path / "p.parquet")
    write_table(synth.generate(3, seed=5, levels=(1,)), problems, "problems")
    out = str(tmp_path / "traj.parquet")
    r = invoke(
        f"rollout --model {tiny_dir} --problems {problems} --out {out} --k 2 "
        "--max-response-tokens 40 --max-turns 2"
    )
    assert r.exit_code == 0, r.output
    table = read_table(out, "trajectories")
    assert table.schema.names == schema("trajectories").names and len(table) == 6
    assert pq.read_metadata(out).metadata[b"rstar.schema_version"] == b"1"
    rows = table.to_pylist()
    assert sorted((x["problem_id"], x["sample_index"]) for x in rows) == sorted(
        (p["id"], i) for p in synth.generate(3, seed=5, levels=(1,)) for i in range(2)
    )
    for x in rows:
        n = x["response_len"]
        assert len(x["response_ids"]) == len(x["response_mask"]) == len(x["log_probs"]) == n <= 40
        assert x["finish_reason"] in FINISH_REASONS
        assert x["reward"] in (0.0, 1.0) and isinstance(json.loads(x["tool_calls"]), list)
    summary = json.loads(r.output[r.output.index("{") : r.output.rindex("}") + 1])
    assert (
        summary["rollouts"] == 6
        and 0 <= summary["accuracy"] <= 1
        and summary["model_tokens_per_s"] > 0
    )


def test_rollout_over_two_ray_replicas_behind_the_balanced_scheduler(tiny_dir, tmp_path):
    problems = str(tmp_path / "p.parquet")
    write_table(synth.generate(3, seed=5, levels=(1,)), problems, "problems")
    out = str(tmp_path / "traj.parquet")
    r = invoke(
        f"rollout --model {tiny_dir} --problems {problems} --out {out} --k 4 "
        "--max-response-tokens 24 --max-turns 2 --replicas 2"
    )
    assert r.exit_code == 0, r.output
    assert len(read_table(out, "trajectories")) == 12
    served = json.loads(r.output.split("requests served per replica: ")[1].split("\n")[0])
    # both replicas worked
    assert len(served) == 2 and all(n > 0 for n in served) and sum(served) >= 12


def test_rollout_refuses_unknown_engine_and_scheduler(tiny_dir, tmp_path):
    for flag, value in (("--engine", "tgi"), ("--scheduler", "random"), ("--replicas", "0")):
        r = invoke(
            f"rollout --model {tiny_dir} --problems p.parquet --out o.parquet {flag} {value}"
        )
        assert r.exit_code != 0 and flag in r.output


def test_consistency_filter_through_the_rollout_engine(tiny_dir, tmp_path):
    """`rstar data curate --consistency-model`: k rollouts per problem by a real model; an
    untrained model agrees with no label, so every problem is rejected as inconsistent."""
    problems = str(tmp_path / "p.parquet")
    write_table(synth.generate(3, seed=6, levels=(1,)), problems, "problems")
    r = invoke(
        f"data curate --source {problems} --out {tmp_path / 'c.parquet'} --consistency-model "
        f"{tiny_dir} --consistency-k 2 --consistency-max-tokens 24"
    )
    assert r.exit_code == 0, r.output
    rejects = read_table(str(tmp_path / "c.rejects.parquet"), "rejects").to_pylist()
    assert [x["reason"] for x in rejects] == ["inconsistent"] * 3
    assert all(
        x["detail"].endswith("of 2 sampled answers match the label (need 2)") for x in rejects
    )
    assert len(read_table(str(tmp_path / "c.parquet"), "problems")) == 0
