"""What a stage may reuse of an earlier run on the same storage root.

- Its result, from Prefect's cache, only while storage still holds the outputs this recipe
  made: a stage that finishes leaves a marker naming its cache key (the recipe section, the
  inputs, the code version); a run of another recipe at the root overwrites both.
- Its checkpoints, only from its own working directory, named by the same key: a retry (or
  the next run after a kill) resumes there; a run of another recipe or from another input
  model never does.
"""

from __future__ import annotations

import os

import rstar
from rstar.pipeline.config import Recipe, json_digest
from rstar.pipeline.layout import Layout
from rstar.pipeline.records import StageInputs
from rstar.pipeline.stage_table import find, section
from rstar.storage import atomic_write_text, dirs, filesystem, is_remote


def key(recipe: Recipe, stage: str, inputs: StageInputs) -> str:
    """Names a stage's outputs: its recipe section, inputs, storage root and the code's version
    (bumped when a change alters what a stage produces, so no stale result is served)."""
    return f"{recipe.name}-{stage}-" + json_digest(
        {
            "section": section(recipe, stage),
            "root": recipe.storage_root,
            "inputs": inputs.key(),
            "version": rstar.__version__,
        }
    )


def resumes(recipe: Recipe, stage: str) -> bool:
    """Whether `stage` continues from what its working directory records after a retry or a
    kill (rstar.pipeline.stage_table.KINDS says which do); the others start over."""
    return find(recipe, stage).needs.resumes(recipe)


def work_uri(recipe: Recipe, stage: str, inputs: StageInputs) -> str:
    """The URI of a stage's working directory for this recipe and these inputs."""
    return f"{Layout(recipe.storage_root).work_uri(stage)}/{key(recipe, stage, inputs)}"


def work_dir(recipe: Recipe, stage: str, inputs: StageInputs) -> tuple[str, str]:
    """A stage's working directory for this recipe and these inputs: (its local path, its URI
    under the root). Other runs' directories are removed from storage (local or remote), so
    stale checkpoints do not pile up."""
    uri = work_uri(recipe, stage, inputs)
    run = uri.rsplit("/", 1)[-1]
    fs, parent = filesystem(Layout(recipe.storage_root).work_uri(stage))
    if fs.exists(parent):
        for path in fs.ls(parent, detail=False):
            if path.rstrip("/").rsplit("/", 1)[-1] != run:
                fs.rm(path, recursive=True)
    return dirs.local_dir(uri), uri


def _marker(recipe: Recipe, stage: str, inputs: StageInputs) -> str:
    name = stage if inputs.report_name == "eval" else f"{stage}-{inputs.report_name}"
    return Layout(recipe.storage_root).marker(name)


def mark_done(recipe: Recipe, stage: str, inputs: StageInputs) -> None:
    """Record that storage now holds what `stage` made from this recipe and these inputs."""
    atomic_write_text(_marker(recipe, stage, inputs), key(recipe, stage, inputs))


def outputs_exist(recipe: Recipe, stage: str, inputs: StageInputs) -> bool:
    """Whether a stage's outputs are still in storage, as this recipe and these inputs made
    them (a cached result is only reused if so)."""
    layout = Layout(recipe.storage_root)
    stored = find(recipe, stage).needs.stored
    if stored:
        paths = stored(layout, inputs)
    else:  # a model stage
        paths = [
            f"{layout.model(stage)}/{dirs.POINTER}"
            if is_remote(layout.root)
            else os.path.join(layout.model(stage), "config.json")
        ]
    fs, _ = filesystem(paths[0])
    if not all(fs.exists(filesystem(p)[1]) for p in paths):
        return False
    fs, marker = filesystem(_marker(recipe, stage, inputs))
    return fs.exists(marker) and fs.cat_file(marker).decode() == key(recipe, stage, inputs)
