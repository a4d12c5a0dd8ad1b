"""The tiny tokenizer's number tokens: chunks of digits from the left, lossless."""

import pytest

from rstar.model.tiny import build_tokenizer


@pytest.mark.parametrize(
    "chunk, expected",
    [
        (3, ["273", "687", "473", "400", "809", "163", "43"]),
        (2, ["27", "36", "87", "47", "34", "00", "80", "91", "63", "43"]),
    ],
)
def test_number_tokens_read_numbers_in_chunks_from_the_left(chunk, expected):
    tok = build_tokenizer(number_chunk=chunk)

    def pieces(text):
        return [tok.decode([i]) for i in tok.encode(text, add_special_tokens=False)]

    assert pieces("27368747340080916343") == expected
    assert pieces("print(417*862)")[2:5] == (
        ["41", "7", "*"] if chunk == 2 else ["417", "*", "862"]
    )
    text = "print(pow(7, 23, 1000))\n007 0 10"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


def test_without_number_chunks_digits_are_single_tokens():
    plain = build_tokenizer()
    assert [plain.decode([i]) for i in plain.encode("417", add_special_tokens=False)] == [
        "4",
        "1",
        "7",
    ]
