"""The entropy report on crafted rollouts: planted high-entropy tokens are found where planted."""

from rstar.eval.entropy import analyze, compare


class WordTokenizer:
    """Token id i is the word VOCAB[i]; enough for the analysis."""

    VOCAB = ["the", "answer", "is", "but", "wait", "<tool>", "error", "so", "check", "fix"]

    def decode(self, ids):
        return " ".join(self.VOCAB[i] for i in ids)


def rollout(words, entropies, mask):
    v = WordTokenizer.VOCAB
    return {
        "response_ids": [v.index(w) for w in words],
        "entropies": entropies,
        "response_mask": mask,
    }


def test_forking_and_reflection_tokens():
    tok = WordTokenizer()
    # "but" is uncertain anywhere; "fix" is uncertain right after a tool response
    r1 = rollout(
        ["the", "answer", "but", "is", "the", "answer", "but", "so", "the", "answer"],
        [0.1, 0.1, 2.0, 0.1, 0.1, 0.1, 2.1, 0.2, 0.1, 0.1],
        [1] * 10,
    )
    r2 = rollout(
        ["so", "<tool>", "error", "fix", "check", "the", "answer", "is", "so", "the"],
        [0.1, 0.0, 0.0, 1.9, 0.3, 0.1, 0.1, 0.1, 0.1, 0.1],
        [1, 0, 0, 1, 1, 1, 1, 1, 1, 1],
    )
    rep = analyze([r1, r2], tok, quantile=0.8, window=3)
    assert rep.model_tokens == 18
    # the top 20% of 18 entropies: >= 0.3
    assert dict(rep.forking) == {"but": 2, "fix": 1, "check": 1}
    assert rep.reflection == [("fix", 1), ("check", 1)]  # within 3 tokens after the tool response
    assert rep.after_tool_tokens == 3
    assert any("answer but is" in c for c in rep.examples["but"])
    md = rep.markdown()
    assert "`but` | 2" in md and "`fix` | 1" in md
    later = analyze([r1], tok, quantile=0.8)
    table = compare({"rl1": rep, "rl3": later})
    assert "| `but` | 2 | 2 |" in table and "| `fix` | 1 | 0 |" in table


def test_empty_input():
    assert analyze([], WordTokenizer()).forking == []
