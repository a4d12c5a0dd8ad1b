"""The tiny base model's pretraining: generated text with no RL problem or answer in it,
and a loss that actually falls."""

import re

from rstar.data import synth
from rstar.model.pretrain import (
    CONTEXT,
    END_CONTEXT,
    PretrainConfig,
    TextSource,
    document,
    encode,
    packed_batch,
    pretrain,
)
from rstar.model.tiny import build_model


def test_documents_never_contain_an_rl_problem_or_the_tool_call_format(tokenizer):
    rng = TextSource(0, tokenizer)
    docs = [document(rng) for _ in range(3000)]
    problems = synth.generate(300, levels=(1, 2, 3))
    stems = {p["problem"][:25] for p in problems}
    assert not any(stem in d for d in docs for stem in stems)
    # the format is SFT's to teach: its tags occur only as loose filler words, never as a call
    assert not any('{"name": "execute_python' in d or "<tool_call>\n{" in d for d in docs)
    assert any("**" in d for d in docs) and any("<|im_start|>assistant" in d for d in docs)


def test_filler_trains_the_whole_vocabulary(tokenizer):
    """Rows the corpus never uses keep their random initialisation, and those derailed the
    tiny model's copying in every chat that contained them."""
    rows, _ = packed_batch(TextSource(0, tokenizer), tokenizer, rows=200, seq_len=192)
    words = {
        i
        for i in range(len(tokenizer))
        if i not in tokenizer.all_special_ids
        and tokenizer.decode([i]).strip()
        and not tokenizer.decode([i]).strip().isdigit()
    }
    seen = set(rows.flatten().tolist())
    assert len(words & seen) > 0.7 * len(words)  # a piece that only occurs inside words may not
    without = set(
        packed_batch(TextSource(0), tokenizer, rows=200, seq_len=192)[0].flatten().tolist()
    )
    # the fixed filler list alone leaves most untrained
    assert len(words & without) < 0.5 * len(words)


def test_copy_drills_vary_what_surrounds_the_copy():
    """Copying learnt in one template breaks in another (a base that copied 85% of operands in
    its drill copied none once a system turn or a JSON wrapper came first): the drills mix them."""
    rng = TextSource(1)
    chats = [d for d in (document(rng) for _ in range(3000)) if d.count("<|im_start|>user") >= 1]
    assert any(d.startswith("<|im_start|>system") for d in chats)
    assert any(d.startswith("<|im_start|>user") for d in chats)
    assert any('{"' in d.split("<|im_start|>assistant")[-1] for d in chats)
    # earlier exchanges, tool-like output turns
    assert sum(d.count("<|im_start|>user") >= 2 for d in chats) > 100
    # what the assistant writes after "print(" was said by the user first, in some notation
    for d in chats:
        if "print(" in d and "pow(" not in d:
            numbers = (
                d.split("print(")[1]
                .split(")")[0]
                .replace("**", "*")
                .replace("+", "*")
                .replace("%", "*")
            )
            user = d[: d.index("print(")]
            assert all(n in user for n in numbers.split("*")), d


def test_packed_rows_are_full_and_made_of_whole_documents(tokenizer):
    rows, labels = packed_batch(TextSource(0, tokenizer), tokenizer, rows=3, seq_len=48)
    assert rows.shape == labels.shape == (3, 48)
    rng = TextSource(0, tokenizer)
    expected = []
    while len(expected) < 48:
        text = document(rng).replace(CONTEXT, "").replace(END_CONTEXT, "")
        expected += tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
    # whole documents in order, each ended by EOS, cut at the end
    assert rows[0].tolist() == expected[:48]


def test_what_cannot_be_predicted_is_context_never_a_target(tokenizer):
    """Filler carries no loss (predicting words drawn from the whole vocabulary taught the base
    that any word may come next anywhere), nor does a number's first occurrence (a random number
    cannot be predicted, only copied later). Every number that is a target was said before."""
    rng = TextSource(0, tokenizer)
    copied = given = masked = kept = 0
    for _ in range(300):
        text = document(rng)
        ids, labels = encode(tokenizer, text)
        clean = text.replace(CONTEXT, "").replace(END_CONTEXT, "")
        context = "".join(part.split(END_CONTEXT)[0] for part in text.split(CONTEXT)[1:])
        offsets = tokenizer(clean, add_special_tokens=False, return_offsets_mapping=True)[
            "offset_mapping"
        ]
        for i, label in zip(ids, labels):
            assert label in (-100, i)
            assert label == i or tokenizer.decode([i]).strip() in context
            masked, kept = masked + (label == -100), kept + (label == i)
        for number in re.finditer(r"\d+", clean):
            targets = [
                label != -100
                for (start, end), label in zip(offsets, labels)
                if start < number.end() and end > number.start()
            ]
            if any(targets):
                copied += 1
                assert all(targets) and re.search(
                    rf"(?<!\d){number[0]}(?!\d)", clean[: number.start()]
                ), clean
            else:
                given += 1
    assert copied > 0.3 * (copied + given) and given > 0.3 * (copied + given)
    assert masked > 0.1 * (masked + kept) and kept > 0.5 * (masked + kept)


def test_pretraining_lowers_the_loss(tokenizer):
    model = build_model(tokenizer, hidden=32, layers=1, intermediate=64)
    history = pretrain(
        model,
        tokenizer,
        PretrainConfig(steps=40, batch_size=8, seq_len=64, lr=3e-3, warmup_steps=5),
    )
    first, last = sum(h["loss"] for h in history[:5]) / 5, sum(h["loss"] for h in history[-5:]) / 5
    assert last < first - 1.0
