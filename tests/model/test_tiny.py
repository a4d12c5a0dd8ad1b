"""The tiny tokenizer's number tokens: chunks of three digits from the left, lossless."""
from rstar.model.tiny import build_tokenizer


def test_number_tokens_read_numbers_in_three_digit_chunks():
    tok = build_tokenizer(number_tokens=True)
    pieces = lambda text: [tok.decode([i]) for i in tok.encode(text, add_special_tokens=False)]
    assert pieces("27368747340080916343") == ["273", "687", "473", "400", "809", "163", "43"]
    assert "417" in pieces("Compute 417 \u00d7 862.") and "862" in pieces("Compute 417 \u00d7 862.")
    text = "print(pow(7, 23, 1000))\n007 0 10"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    plain = build_tokenizer()
    assert [plain.decode([i]) for i in plain.encode("417", add_special_tokens=False)] == ["4", "1", "7"]
