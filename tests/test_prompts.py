"""rlgen.client._prompts: the accepted prompt forms, tokenized on the client and checked before sending."""

from __future__ import annotations

import pandas as pd
import pytest

from rlgen.client._prompts import normalize_prompts, prompt_data


def norm(prompts, tok, *, context=8192, max_new=16):
    return normalize_prompts(prompts, tokenizer=tok, vocab_size=len(tok), context_length=context, max_new_tokens=max_new)


def test_a_string_is_one_text_prompt_tokenized_like_the_server_does(tok) -> None:
    p = norm("Hello world", tok)
    assert p.kind == "text" and p.texts == ["Hello world"]
    assert p.ids == [tok("Hello world")["input_ids"]]


def test_a_list_of_ints_is_one_prompt_and_a_list_of_lists_is_a_batch(tok) -> None:
    assert norm([1, 2, 3], tok).ids == [[1, 2, 3]]
    assert norm([[1, 2], [3]], tok).ids == [[1, 2], [3]]
    assert norm([[1, 2], [3]], tok).texts == [None, None]


def test_chats_are_rendered_with_the_chat_template(tok) -> None:
    chat = [{"role": "user", "content": "What is 2+2?"}]
    one = norm(chat, tok)
    two = norm([chat, chat], tok)
    expected = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    assert one.kind == "chat" and one.ids == [list(expected)]
    assert two.ids == [list(expected)] * 2
    assert one.texts[0].rstrip().endswith("<|im_start|>assistant")


@pytest.mark.parametrize("prompts, error, match", [
    ([], ValueError, "prompts is empty"),
    ("", ValueError, "empty string"),
    (["a", [1, 2]], TypeError, "mix forms"),
    (42, TypeError, "string or a list"),
    ([3.5], TypeError, "cannot read a prompt"),
    ([[1, True, 3]], TypeError, "cannot read a prompt"),     # a bool is not a token id
    ([[1, 2.0, 3]], TypeError, "cannot read a prompt"),
    ([[]], ValueError, "empty"),
    ([{"content": "no role"}], TypeError, "'role' and 'content'"),
])
def test_bad_prompts_raise_before_anything_is_sent(tok, prompts, error, match) -> None:
    with pytest.raises(error, match=match):
        norm(prompts, tok)


def test_token_ids_may_be_int_subclasses(tok) -> None:
    import enum

    class Tok(enum.IntEnum):
        A = 5

    assert norm([[Tok.A, 7]], tok).ids == [[5, 7]]


def test_token_ids_outside_the_vocabulary_name_the_prompt(tok) -> None:
    with pytest.raises(ValueError, match=r"prompt 1 has token id 10000000 outside the vocabulary"):
        norm([[1, 2], [10_000_000]], tok)


def test_a_prompt_that_does_not_fit_the_context_names_the_prompt_and_the_fix(tok) -> None:
    with pytest.raises(ValueError, match=r"prompt 0 has 100 tokens; with max_new_tokens=30 .* context of 120"):
        norm([[5] * 100], tok, context=120, max_new=30)


@pytest.mark.parametrize("role, hint", [("usr", "did you mean 'user'"), ("User", "did you mean 'user'"),
                                        ("asistant", "did you mean 'assistant'"), ("wizard", "roles are")])
def test_an_unknown_chat_role_is_refused_before_sending_with_a_suggestion(tok, role: str, hint: str) -> None:
    with pytest.raises(ValueError, match=f"unknown chat role '{role}'; {hint}"):
        norm([[{"role": role, "content": "hi"}]], tok)


def test_every_usual_chat_role_is_accepted(tok) -> None:
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"}, {"role": "user", "content": "bye"}]
    assert "Be brief." in norm([chat], tok).texts[0]


@pytest.mark.parametrize("data", [
    pd.DataFrame({"answer": ["4", "9"], "task": ["add", "mul"]}, index=[10, 20]),
    [{"answer": "4", "task": "add"}, {"answer": "9", "task": "mul"}],
    {"answer": ["4", "9"], "task": ["add", "mul"]},
])
def test_per_prompt_data_comes_as_a_frame_a_list_of_dicts_or_a_dict_of_lists(data) -> None:
    assert prompt_data(data, 2, reserved=["completion"]) == {"answer": ["4", "9"], "task": ["add", "mul"]}


def test_a_missing_key_in_a_list_of_dicts_gives_none() -> None:
    assert prompt_data([{"a": 1}, {"b": 2}], 2, reserved=[]) == {"a": [1, None], "b": [None, 2]}


@pytest.mark.parametrize("data, error, match", [
    ({"answer": ["4"]}, ValueError, "data has 1 rows for 2 prompts"),
    ([{"completion": "x"}, {"completion": "y"}], ValueError, r"\['completion'\] would replace rlgen's own"),
    ({"a": ["1", "2"], "b": ["1"]}, ValueError, "different lengths"),
    ("answers.csv", TypeError, "data must be a DataFrame"),
    ([1, 2], TypeError, "one dict per prompt"),
])
def test_bad_per_prompt_data_is_refused_before_sending(data, error, match) -> None:
    with pytest.raises(error, match=match):
        prompt_data(data, 2, reserved=["completion"])


@pytest.fixture(scope="module")
def light_tok(model_path, tmp_path_factory):
    """The default model's tokenizer as the Engine of a reattaching kernel holds it: a LightTokenizer
    served from its record (no transformers object behind it), in a private record store."""
    from rlgen.client._light_tokenizer import LightTokenizer
    from rlgen.client._tokenizer import load_tokenizer

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RLGEN_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        load_tokenizer(model_path)  # through AutoTokenizer: probes, then the record
        light = load_tokenizer(model_path)
    assert isinstance(light, LightTokenizer)
    return light


def test_the_light_tokenizer_gives_every_prompt_form_the_same_ids_and_texts_as_transformers(tok, light_tok) -> None:
    chats = [[{"role": "user", "content": "What is 2+2?"}],
             [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Le café 日本 🙂\n\nok"},
              {"role": "assistant", "content": "hello"}, {"role": "user", "content": "<|im_end|> bye"}]]
    texts = ["Hello world", "a\n\nb", "Le café 日本 🙂", "<|im_start|>user\nhi<|im_end|>"]
    for prompts in (texts, chats, chats[1], "one string", [[1, 2, 3], [4]]):
        light, hf = norm(prompts, light_tok), norm(prompts, tok)
        assert (light.kind, light.ids, light.texts) == (hf.kind, hf.ids, hf.texts), prompts
    assert len(light_tok) == len(tok)
    assert light_tok._hf is None, "a prompt form went to transformers"
