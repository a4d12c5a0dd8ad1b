"""The shipped tiny base: built by `rstar model build-base`, used only when its manifest matches
the recipe and its files their digest, and the one in models/ intact."""

import json
import os
import shutil

import pytest

from rstar.model.shipped import (
    MANIFEST,
    ShippedBaseError,
    check_shipped,
    pretrain_base,
    write_shipped,
)
from rstar.pipeline.config import load_recipe
from rstar.pipeline.layout import Layout
from rstar.pipeline.records import StageInputs
from rstar.pipeline.stages import base
from rstar.tracking.digest import digest
from rstar.tracking.mlflow_log import NullLog

SMALL_BASE = {
    "base.hidden": 32,
    "base.layers": 1,
    "base.pretrain_steps": 2,
    "base.pretrain_batch": 2,
    "base.pretrain_seq_len": 32,
}


@pytest.fixture(scope="module")
def small_shipped(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("shipped") / "base")
    recipe = load_recipe(
        "configs/tiny.yaml", {**SMALL_BASE, "base.shipped": out}, check_inputs=False
    )
    model, tok, history = pretrain_base(recipe.base)
    write_shipped(
        model,
        tok,
        recipe.base,
        out,
        seconds=1.0,
        metrics={"pretrain_loss": history[-1]["loss"]},
        rebuild="rstar model build-base --config configs/tiny.yaml",
    )
    return recipe, out


def test_a_built_base_carries_a_manifest_that_checks(small_shipped):
    recipe, out = small_shipped
    manifest = check_shipped(out, recipe.base)
    assert manifest["digest"] == digest(out, skip=(MANIFEST,))
    assert manifest["spec"]["hidden"] == 32 and manifest["versions"]["torch"]
    assert manifest["rebuild"].startswith("rstar model build-base")


def test_an_altered_base_is_refused(small_shipped, tmp_path):
    recipe, out = small_shipped
    copy = str(tmp_path / "base")
    shutil.copytree(out, copy)
    with open(os.path.join(copy, "model.safetensors"), "r+b") as f:
        f.seek(-8, os.SEEK_END)
        f.write(b"\0" * 8)
    with pytest.raises(ShippedBaseError, match="files digest .* manifest says"):
        check_shipped(copy, recipe.base)


def test_a_base_built_from_another_recipe_is_refused(small_shipped):
    recipe, out = small_shipped
    other = load_recipe(
        "configs/tiny.yaml", {**SMALL_BASE, "base.pretrain_steps": 5}, check_inputs=False
    )
    with pytest.raises(ShippedBaseError, match="pretrain_steps: built with 2, recipe says 5"):
        check_shipped(out, other.base)
    with pytest.raises(ShippedBaseError, match="holds no MANIFEST.json"):
        check_shipped(os.path.dirname(out), recipe.base)


def test_the_base_stage_publishes_the_shipped_base_unchanged(small_shipped, tmp_path):
    recipe, out = small_shipped
    recipe = recipe.model_copy(update={"storage_root": str(tmp_path / "root")})
    result = base(recipe, Layout(recipe.storage_root), StageInputs(), NullLog())
    with open(os.path.join(out, MANIFEST)) as f:
        assert result.model.digest == json.load(f)["digest"]
    assert not os.path.exists(os.path.join(result.model.uri, MANIFEST))
    assert 0 <= result.metrics["copy_repeat"] <= 1


def test_the_shipped_base_in_the_repository_matches_the_embedded_recipe():
    recipe = load_recipe("configs/tiny.yaml")
    manifest = check_shipped(recipe.base.shipped, recipe.base)
    assert manifest["spec"]["pretrain_steps"] == recipe.base.pretrain_steps
