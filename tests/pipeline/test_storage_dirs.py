"""Model directories on S3: versions published whole, the pointer moved last."""

import os
from pathlib import Path

import pytest

from rstar.storage import dirs, filesystem


def _fill(path, text):
    os.makedirs(path, exist_ok=True)
    for name in ("config.json", "model.safetensors"):
        with open(os.path.join(path, name), "w") as f:
            f.write(f"{name}:{text}")


def test_push_then_pull_on_a_fresh_machine(s3, tmp_path, monkeypatch):
    uri = f"{s3}/dirs/model"
    monkeypatch.setenv("RSTAR_CACHE", str(tmp_path / "writer"))
    assert dirs.pull(uri) is None
    _fill(dirs.local_dir(uri), "one")
    dirs.push(uri)
    _fill(dirs.local_dir(uri), "two")
    dirs.push(uri)
    fs, root = filesystem(uri)
    # v1 removed
    assert sorted(p.rsplit("/", 1)[-1] for p in fs.ls(root)) == ["latest.json", "v000002"]
    monkeypatch.setenv("RSTAR_CACHE", str(tmp_path / "reader"))  # another machine
    local = dirs.pull(uri)
    assert local.startswith(str(tmp_path / "reader"))
    assert Path(os.path.join(local, "config.json")).read_text() == "config.json:two"


def test_an_interrupted_push_leaves_the_previous_version_readable(s3, tmp_path, monkeypatch):
    uri = f"{s3}/dirs/interrupted"
    monkeypatch.setenv("RSTAR_CACHE", str(tmp_path / "w"))
    _fill(dirs.local_dir(uri), "good")
    dirs.push(uri)
    _fill(dirs.local_dir(uri), "new")
    fs, _ = filesystem(uri)
    real_put, calls = fs.put_file, []

    def failing_put(src, dst, **kw):
        calls.append(dst)
        if len(calls) == 2:
            raise ConnectionError("network dropped")
        return real_put(src, dst, **kw)

    monkeypatch.setattr(fs, "put_file", failing_put)  # fsspec hands out one cached instance
    with pytest.raises(ConnectionError):
        dirs.push(uri)
    monkeypatch.undo()
    monkeypatch.setenv("RSTAR_CACHE", str(tmp_path / "r"))
    assert (
        Path(os.path.join(dirs.pull(uri), "model.safetensors")).read_text()
        == "model.safetensors:good"
    )


def test_local_roots_are_used_in_place(tmp_path):
    path = str(tmp_path / "m")
    assert dirs.local_dir(path) == path and dirs.pull(path) is None
    _fill(path, "x")
    dirs.push(path)  # nothing to do
    assert dirs.pull(path) == path


def test_an_atomic_write_gets_the_mode_of_a_plain_write(tmp_path):
    from rstar.storage import atomic_write_text

    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    atomic_write_text(str(tmp_path / "atomic.txt"), "x")
    assert (tmp_path / "atomic.txt").stat().st_mode == plain.stat().st_mode  # not mkstemp's 0600


def test_a_snapshot_keeps_a_registered_version_while_the_stage_directory_is_replaced(
    s3, tmp_path, monkeypatch
):
    # a local root: hard links, so no bytes are copied, and a replaced directory leaves them intact
    stage = str(tmp_path / "models" / "rl1")
    _fill(stage, "run one")
    snap = dirs.snapshot(stage, str(tmp_path / "registry" / "rl1-aaaa"))
    assert (
        os.stat(os.path.join(snap, "config.json")).st_ino
        == os.stat(os.path.join(stage, "config.json")).st_ino
    )
    dirs.replace_dir(stage, lambda tmp: _fill(tmp, "run two"))  # how a later run publishes
    assert Path(os.path.join(snap, "config.json")).read_text() == "config.json:run one"
    assert (
        dirs.snapshot(stage, snap) == snap
        and Path(os.path.join(snap, "config.json")).read_text() == "config.json:run one"
    )
    # an S3 root: a copy of the version the pointer names, itself a pulled directory
    monkeypatch.setenv("RSTAR_CACHE", str(tmp_path / "cache"))
    uri = f"{s3}/snap/models/rl1"
    _fill(dirs.local_dir(uri), "one")
    dirs.push(uri)
    remote = dirs.snapshot(uri, f"{s3}/snap/registry/rl1-bbbb")
    _fill(dirs.local_dir(uri), "two")
    dirs.push(uri)  # removes the version the snapshot was taken from
    monkeypatch.setenv("RSTAR_CACHE", str(tmp_path / "reader"))
    assert Path(os.path.join(dirs.pull(remote), "config.json")).read_text() == "config.json:one"
    assert Path(os.path.join(dirs.pull(uri), "config.json")).read_text() == "config.json:two"
