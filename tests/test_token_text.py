"""Token text: each token's real text from a tokenizer, and a tokenizer loaded later from its source."""

from __future__ import annotations

import pytest

from rlgen.rollouts._token_text import TokenText

COMPLETION = "The capital of France\n\nis Paris. Le café 日本 🙂!"


def test_token_texts_are_real_text_that_concatenates_to_the_completion(tok):
    ids = tok(COMPLETION, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    pieces = TokenText(tok)(ids)
    assert len(pieces) == len(ids) and "".join(pieces) == COMPLETION + "<|im_end|>"
    assert " capital" in pieces and "\n" in pieces and " café" in pieces and pieces[-1] == "<|im_end|>"
    assert not any(ch in "".join(pieces) for ch in "ĠĊÃ\ufffd")


def test_a_character_split_over_tokens_belongs_to_the_token_that_completes_it(tok):
    ids = tok(" 日本", add_special_tokens=False)["input_ids"]
    assert len(ids) > 2  # byte-level BPE splits these characters into several tokens
    pieces = TokenText(tok)(ids)
    assert "".join(pieces) == " 日本" and all(p in ("", " 日", "本") for p in pieces)
    assert TokenText(tok)(ids[:1]) == [""]  # an unfinished character shows as nothing, not mojibake


def test_a_token_text_remembers_its_source_and_a_loaded_one_gives_the_same_pieces(tok, model_path):
    ids = tok(COMPLETION, add_special_tokens=False)["input_ids"]
    held = TokenText(tok)
    assert held.source == tok.name_or_path
    later = TokenText.load(model_path)
    assert later(ids) == held(ids) and later.error is None


def test_a_source_that_is_not_here_raises_and_says_what_to_pass_instead(tmp_path):
    missing = TokenText.load(str(tmp_path / "no-such-model"))
    for _ in range(2):  # the failure is remembered, not retried on every token
        with pytest.raises(OSError, match="from_parquet"):
            missing([1, 2])
    assert missing.error is not None and "no-such-model" in missing.error


def test_a_token_text_needs_a_tokenizer_or_a_source():
    with pytest.raises(ValueError, match="tokenizer or a source"):
        TokenText()


def test_a_light_tokenizer_gives_the_same_token_texts(tok, model_path, tmp_path, monkeypatch):
    from rlgen.client._light_tokenizer import LightTokenizer
    from rlgen.client._tokenizer import load_tokenizer

    monkeypatch.setenv("RLGEN_CACHE_DIR", str(tmp_path))
    load_tokenizer(model_path)  # writes the record: a later load, like TokenText.load's, is light
    ids = [*tok(COMPLETION, add_special_tokens=False)["input_ids"], tok.eos_token_id, *tok(" 日本")["input_ids"][:1]]
    later = TokenText.load(model_path)
    assert later(ids) == TokenText(tok)(ids) and isinstance(later.tokenizer(), LightTokenizer)
    assert later.tokenizer()._hf is None
