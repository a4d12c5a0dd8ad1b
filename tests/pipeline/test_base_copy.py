"""A real base model (not the tiny one) enters the pipeline as files: copied, never loaded, with
the rStar2-Agent chat template on its tokenizer."""

import filecmp
import os
import shutil


def test_a_base_from_a_path_is_copied_not_loaded(tiny_dir, tmp_path, monkeypatch):
    import transformers
    from transformers import AutoTokenizer

    from rstar.agent.format import CHAT_TEMPLATE
    from rstar.pipeline import stages
    from rstar.pipeline.config import load_recipe
    from rstar.pipeline.layout import Layout
    from rstar.pipeline.records import StageInputs

    def refuse(*args, **kwargs):
        raise AssertionError("the base stage loaded the model's weights")

    source = str(tmp_path / "hub-model")
    shutil.copytree(tiny_dir, source)
    tok = AutoTokenizer.from_pretrained(source)
    tok.chat_template = (
        "{% for m in messages %}{{ m['content'] }}{% endfor %}"  # the model's own template
    )
    tok.save_pretrained(source)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)
    recipe = load_recipe(
        "configs/tiny.yaml",
        {
            "base.build_tiny": False,
            "base.shipped": None,
            "base.path": source,
            "storage_root": str(tmp_path / "root"),
        },
    )
    out = stages.base(recipe, Layout(recipe.storage_root), StageInputs(), None)
    model = out.model.uri
    weights = [f for f in os.listdir(source) if f.endswith(".safetensors")]
    assert weights and all(
        filecmp.cmp(os.path.join(source, f), os.path.join(model, f), shallow=False) for f in weights
    )
    assert AutoTokenizer.from_pretrained(model).chat_template == CHAT_TEMPLATE
    assert out.model.digest
