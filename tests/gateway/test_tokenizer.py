"""FastTokenizer's one-id decode cache gives the tokenizer's own text and stays bounded."""

from __future__ import annotations

from pathlib import Path

from rollyard.gateway.tokenizer import FastTokenizer


def test_every_ids_cached_text_is_the_tokenizers_own_and_only_vocabulary_ids_are_kept(
    tiny_model_dir: Path,
) -> None:
    """All ids: byte-level pieces that are not UTF-8 alone (decoded to U+FFFD), special and
    added tokens; the second decode of each comes from the cache and is the same text."""
    tok = FastTokenizer(tiny_model_dir)
    raw = tok._tok
    ids = range(tok.vocab_size)
    first = [tok.decode([i]) for i in ids]
    assert len(tok._one) == tok.vocab_size
    again = [tok.decode([i]) for i in ids]
    assert first == again == [raw.decode([i], skip_special_tokens=False) for i in ids]
    assert any(t.endswith("\ufffd") for t in first)  # a byte piece that is no character alone
    assert tok.decode([tok.eos_id]) == raw.id_to_token(tok.eos_id)  # specials are not skipped
    tok.decode([tok.vocab_size + 7])
    assert len(tok._one) == tok.vocab_size  # an id past the vocabulary is not kept
