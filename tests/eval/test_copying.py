"""The copying probes score exact copies 1 and near misses 0, through the real tokenizer and
chat template; a real (untrained) model runs through them too."""

import re

import pytest
import torch

from rstar.eval.copying import copy_probe


class ScriptedCopier:
    """Continues each probe prompt the way a perfect copier would, or with the last digit of
    every copied number changed (`slip`): the probe must tell the two apart."""

    def __init__(self, tokenizer, slip: bool) -> None:
        self.tok, self.slip = tokenizer, slip

    def eval(self):
        return self

    def _copy(self, number: str) -> str:
        return number[:-1] + str((int(number[-1]) + 1) % 10) if self.slip else number

    def generate(self, ids, **kw):
        text = self.tok.decode(ids[0])
        if text.endswith("Again:"):
            a, b = re.findall(r"\d+", text)
            reply = f" {self._copy(a)} {self._copy(b)}."
        elif "<tool_response>" in text:
            value = re.findall(r"<tool_response>\n(\d+)", text)[-1]
            boxed = f"\\boxed{{{self._copy(value)}}}"
            reply = f"<reason>The tool printed it.</reason>\n<answer>{boxed}</answer>"
        else:
            a, b = re.search(r"evaluate (\d+)\*(\d+)", text).groups()
            reply = (
                f'<tool_call>\n{{"code": "print({self._copy(a)}*{self._copy(b)})"}}\n</tool_call>'
            )
        return torch.cat(
            [ids, torch.tensor([self.tok(reply, add_special_tokens=False)["input_ids"]])], 1
        )


@pytest.mark.parametrize("slip, score", [(False, 1.0), (True, 0.0)])
def test_probes_score_exact_copies_only(tokenizer, slip, score):
    result = copy_probe(ScriptedCopier(tokenizer, slip), tokenizer, pairs=5, prompt_style="compact")
    assert result == {"repeat": score, "into_call": score, "read_back": score}


def test_a_real_model_runs_through_the_probes(tiny_dir, tokenizer):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    assert set(copy_probe(model, tokenizer, pairs=2, chat=False)) == {"repeat"}
    result = copy_probe(model, tokenizer, pairs=2)
    assert set(result) == {"repeat", "into_call", "read_back"}
    assert all(v in (0.0, 0.5, 1.0) for v in result.values())
