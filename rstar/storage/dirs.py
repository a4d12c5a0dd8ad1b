"""Directories (model checkpoints) under the storage root, local or s3://.

Trainers read and write plain local directories (Hugging Face `save_pretrained`). For a
local root that directory *is* the stored one. For a remote root, `local_dir(uri)` is a
mirror on this machine; `push` uploads it as a new version (`v000003/`) and only then
moves the `latest.json` pointer (one small object, written whole), so a crash mid-upload
leaves the previous version in place; `pull` fetches the version the pointer names.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path

from rstar.storage import atomic_write_text, filesystem, is_remote

POINTER = "latest.json"


def replace_dir(path: str, fill) -> str:
    """Write a local directory whole: `fill(tmp)` writes it beside `path`, then two renames swap
    it in, so a kill at any point leaves either the old or the new directory (the old one as
    `path.old` if the kill fell between the renames: `recover_dir` puts it back)."""
    tmp, old = path + ".tmp", path + ".old"
    shutil.rmtree(tmp, ignore_errors=True)
    fill(tmp)
    shutil.rmtree(old, ignore_errors=True)  # left by a replacement killed while deleting it
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    if os.path.exists(path):
        os.rename(path, old)
    os.rename(tmp, path)
    shutil.rmtree(old, ignore_errors=True)
    return path


def recover_dir(path: str) -> None:
    """Undo a `replace_dir` killed between its two renames: the previous directory comes back."""
    if not os.path.exists(path) and os.path.exists(path + ".old"):
        os.rename(path + ".old", path)


def local_dir(uri: str) -> str:
    """Where this machine keeps (or finds) the directory stored at `uri`."""
    if not is_remote(uri):
        return uri
    cache = os.environ.get("RSTAR_CACHE", os.path.expanduser("~/.cache/rstar"))
    return os.path.join(cache, "mirror", hashlib.sha256(uri.encode()).hexdigest()[:24])


def push(uri: str, src: str | None = None) -> None:
    """Publish `src` (default `local_dir(uri)`) at `uri` (nothing to do for a local root)."""
    if not is_remote(uri):
        return
    fs, root = filesystem(uri)
    pointer = _pointer(fs, root)
    version = f"v{(pointer['version'] + 1) if pointer else 1:06d}"
    src = src or local_dir(uri)
    for dirpath, _, files in os.walk(src):
        for name in files:
            rel = os.path.relpath(os.path.join(dirpath, name), src)
            fs.put_file(os.path.join(dirpath, name), f"{root}/{version}/{rel}")
    atomic_write_text(
        f"{uri}/{POINTER}",
        json.dumps({"version": int(version[1:]), "dir": version, "id": uuid.uuid4().hex}),
    )
    if pointer:  # the old version is unreachable now
        fs.rm(f"{root}/{pointer['dir']}", recursive=True)


def snapshot(uri: str, dst: str) -> str:
    """An immutable copy, at `dst`, of the directory stored at `uri`, for a registered model
    version to point at while `uri` itself is replaced by later runs: hard links for a local
    root (no bytes copied), a server-side copy of the current version for a remote one. `dst`
    is named by the content's digest, so an existing one is already the same copy."""
    if not is_remote(uri):
        if not os.path.isdir(dst):
            tmp = dst + ".tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(uri, tmp, copy_function=_link_or_copy)
            os.rename(tmp, dst)
        return dst
    fs, root = filesystem(uri)
    _, dst_root = filesystem(dst)
    if _pointer(fs, dst_root) is None:
        pointer = _pointer(fs, root)
        fs.copy(f"{root}/{pointer['dir']}", f"{dst_root}/{pointer['dir']}", recursive=True)
        atomic_write_text(f"{dst}/{POINTER}", json.dumps(pointer))
    return dst


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another filesystem, or links not allowed: a plain copy
        shutil.copy2(src, dst)


def pull(uri: str) -> str | None:
    """The directory stored at `uri` as a local path, or None when nothing is stored there."""
    if not is_remote(uri):
        return uri if os.path.isdir(uri) and os.listdir(uri) else None
    fs, root = filesystem(uri)
    pointer = _pointer(fs, root)
    if pointer is None:
        return None
    dst = local_dir(uri)
    # The mirror is reused only if it holds exactly the published version (a random id per
    # push, so a mirror left by an older run of the same URI never passes for this one).
    marker = os.path.join(dst, ".rstar-version")
    if os.path.exists(marker) and Path(marker).read_text() == pointer["id"]:
        return dst
    shutil.rmtree(dst, ignore_errors=True)
    fs.get(f"{root}/{pointer['dir']}/", dst + "/", recursive=True)
    with open(marker, "w") as f:
        f.write(pointer["id"])
    return dst


def _pointer(fs, root: str) -> dict | None:
    path = f"{root}/{POINTER}"
    fs.invalidate_cache()
    if not fs.exists(path):
        return None
    with fs.open(path) as f:
        return json.load(f)
