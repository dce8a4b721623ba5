"""rlgen.episodes._template on the default model's template (SmolLM2-135M-Instruct, plain ChatML):
first prompt + sampled turns (+ closing EOS) + token-wise deltas == the whole-conversation render,
and the text-difference method loses the '\\n' after EOS at every turn boundary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _episodes_build import EOS, NL, build_episode, default_tokenizer, sampled, tokenizer_with_template

from rlgen.episodes import TemplateError, closing_ids, first_prompt_ids, message_delta_ids
from rlgen.episodes._template import check_template, render_ids

TOOLS = [{"type": "function", "function": {"name": "calc", "description": "Evaluate arithmetic",
                                           "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}}}}]

U = "user"
A = "assistant"


def msg(role: str, content: str) -> dict[str, str]:
    return {"role": role, "content": content}


CHATS = {
    "user-assistant x3": [msg(U, "What is 12 * 12?"), msg(A, "12 * 12 = 144."), msg(U, "Are you sure?"),
                          msg(A, "Yes: 12 * 12 is 144."), msg(U, "And 13 * 13?"), msg(A, "13 * 13 = 169.")],
    "system, tool results": [msg("system", "You can call calc."), msg(U, "What is 17 * 23?"),
                             msg(A, '<tool_call>{"name": "calc", "arguments": {"expr": "17*23"}}</tool_call>'),
                             msg("tool", '{"result": 391}'), msg(A, "17 * 23 = 391."),
                             msg(U, "Thanks! Now 391 - 1?"), msg(A, "390.")],
    "two messages per delta": [msg(U, "Guess a number from 1 to 10."), msg(A, "5"), msg("tool", "higher"),
                               msg(U, "Guess again."), msg(A, "8"), msg("environment", "lower"),
                               msg(U, "Once more."), msg(A, "7")],
    "multi-line turns": [msg(U, "Write two lines."), msg(A, "First line.\nSecond line."),
                         msg(U, "Now a list:\n- a\n- b"), msg(A, "- a\n- b\n- c")],
}


@pytest.fixture(scope="module")
def tok() -> Any:
    return default_tokenizer()


def render(tok: Any, messages: list[dict[str, str]], gen: bool = False, **kw: Any) -> list[int]:
    out = tok.apply_chat_template(messages, add_generation_prompt=gen, tokenize=True, return_dict=False, **kw)
    return list(out)


def test_the_default_template_is_chatml_with_eos_im_end(tok: Any) -> None:
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == EOS == tok.pad_token_id
    assert tok.decode([NL]) == "\n"
    text = tok.apply_chat_template([msg("system", "S"), msg(U, "hi")], tokenize=False)
    assert text == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"


def test_first_prompt_ids_is_the_render_with_the_generation_prompt(tok: Any) -> None:
    chat = [msg(U, "What is 12 * 12?")]
    ids = first_prompt_ids(tok, chat)
    assert ids == render(tok, chat, gen=True)
    assert tok.decode(ids).endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert first_prompt_ids(tok, chat, tools=TOOLS) == render(tok, chat, gen=True, tools=TOOLS)


def test_the_delta_keeps_the_newline_after_eos(tok: Any) -> None:
    delta = message_delta_ids(tok, [msg(U, "Are you sure?")])
    assert delta[0] == NL  # the template's '\n' after the assistant's <|im_end|>: never sampled
    assert tok.decode(delta) == "\n<|im_start|>user\nAre you sure?<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("name", list(CHATS))
def test_first_prompt_plus_sampled_turns_plus_deltas_is_the_whole_render(tok: Any, name: str) -> None:
    chat = CHATS[name]
    ids, _, mask, prompts = build_episode(tok, chat)
    # every request sent is exactly the render of the conversation so far, with the generation prompt
    starts = [i for i, m in enumerate(chat) if m["role"] == A]
    assert len(prompts) == len(starts) >= 2
    for prompt, k in zip(prompts, starts):
        assert prompt == render(tok, chat[:k], gen=True), (name, k)
    # the whole episode is the whole render, token for token, but the '\n' the template puts after
    # the final EOS (the model stops at EOS; it is never sampled)
    assert [*ids, NL] == render(tok, chat)
    assert sum(mask) == sum(len(sampled(tok, m["content"])) for m in chat if m["role"] == A)


def test_an_episode_that_ends_on_a_delta_is_the_render_with_the_generation_prompt(tok: Any) -> None:
    chat = [*CHATS["system, tool results"][:4]]  # ..., assistant (tool call), tool result
    ids, *_ = build_episode(tok, chat)
    assert ids == render(tok, chat, gen=True)


def test_tools_pass_through_to_the_template(tok: Any) -> None:
    chat = CHATS["system, tool results"]
    ids, *_ = build_episode(tok, chat, tools=TOOLS)
    assert [*ids, NL] == render(tok, chat, tools=TOOLS)  # this template ignores tools (byte-identical)


def test_a_turn_that_stopped_on_a_stop_string_gets_a_closing_eos_with_mask_0(tok: Any) -> None:
    chat = CHATS["system, tool results"]
    call = sampled(tok, chat[2]["content"], eos=False)  # stopped at '</tool_call>': no EOS sampled
    assert closing_ids(tok, call) == [EOS]
    assert closing_ids(tok, [*call, EOS]) == []
    assert closing_ids(tok, []) == [EOS]
    turns = [call, sampled(tok, chat[4]["content"]), sampled(tok, chat[6]["content"])]
    ids, roles, mask, _ = build_episode(tok, chat, turns=turns)
    assert [*ids, NL] == render(tok, chat)
    at = len(first_prompt_ids(tok, chat[:2])) + len(call)
    assert ids[at] == EOS and mask[at] == 0 and roles[at] == A and mask[at - 1] == 1 and ids[at + 1] == NL


def _text_method(tok: Any, chat: list[dict[str, str]], *, fixed_base: bool) -> list[int]:
    """What rlgen avoids: the next message's tokens as a text difference (render(all) minus
    render(history)), or a fixed base conversation stripped off as text, then tokenized."""
    first = next(i for i, m in enumerate(chat) if m["role"] == A)
    ids = first_prompt_ids(tok, chat[:first])
    i = first
    while i < len(chat):
        ids += sampled(tok, chat[i]["content"])
        j = i + 1
        while j < len(chat) and chat[j]["role"] != A:
            j += 1
        if j > i + 1:
            if fixed_base:
                base = [msg("system", "S"), msg(U, "U"), msg(A, "A")]
                before = tok.apply_chat_template(base, tokenize=False)
                after = tok.apply_chat_template([*base, *chat[i + 1:j]], add_generation_prompt=True, tokenize=False)
            else:
                before = tok.apply_chat_template(chat[:i + 1], tokenize=False)
                after = tok.apply_chat_template(chat[:j], add_generation_prompt=True, tokenize=False)
            assert after.startswith(before)
            ids += tok.encode(after[len(before):], add_special_tokens=False)
        i = j
    return ids


@pytest.mark.parametrize("fixed_base", [False, True])
def test_the_text_difference_method_loses_the_newline_at_every_boundary(tok: Any, fixed_base: bool) -> None:
    chat = CHATS["user-assistant x3"]  # 3 assistant turns, 2 boundaries (assistant -> user)
    good, roles, *_ = build_episode(tok, chat)
    bad = _text_method(tok, chat, fixed_base=fixed_base)
    full = render(tok, chat)
    assert (len(bad), len(good), len(full)) == (113, 115, 116)
    # exactly the '\n' after each assistant EOS but the last is missing
    boundaries = [i for i in range(1, len(good)) if roles[i - 1] == A != roles[i]]
    assert len(boundaries) == 2
    assert bad == [t for i, t in enumerate(good) if i not in boundaries]
    for b in boundaries:
        assert good[b - 1 : b + 2] == [EOS, NL, tok.convert_tokens_to_ids("<|im_start|>")]


def test_a_template_that_renders_the_base_differently_once_followed_is_refused_by_name(tmp_path: Path) -> None:
    # the last assistant turn gets an empty think block, earlier ones do not (as some thinking templates do)
    template = (
        "{%- for m in messages -%}{{- '<|im_start|>' + m['role'] + '\\n' -}}"
        "{%- if m['role'] == 'assistant' and loop.last -%}{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}"
        "{{- m['content'] + '<|im_end|>\\n' -}}{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}")
    tok = tokenizer_with_template(tmp_path / "last-think", template)
    with pytest.raises(TemplateError, match=r"last-think \(chat template [0-9a-f]{8}\) is not append-only"):
        message_delta_ids(tok, [msg(U, "again")])
    tok.chat_template = None
    with pytest.raises(TemplateError, match="has no chat template"):
        first_prompt_ids(tok, [msg(U, "hi")])


def test_check_template_refuses_a_template_without_eos_after_an_assistant_message_saying_what_to_do(
        tmp_path: Path, tok: Any) -> None:
    no_eos = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}\n{% endfor %}"
              "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    bare = tokenizer_with_template(tmp_path / "no-eos", no_eos)
    with pytest.raises(TemplateError, match=r"no-eos \(chat template [0-9a-f]{8}\) puts no EOS token "
                                            r"\('<\|im_end\|>', id 2\) after an assistant message.*"
                                            r"end each assistant message with the EOS token"):
        check_template(bare)
    check_template(tok)  # ChatML: <|im_end|> after every message
    # a template that refuses the base conversation is left to the episodes that send it
    no_system = "{% if messages[0]['role'] == 'system' %}{{ raise_exception('no system') }}{% endif %}" + no_eos
    check_template(tokenizer_with_template(tmp_path / "no-system", no_system))


def test_an_empty_delta_is_refused(tok: Any) -> None:
    with pytest.raises(ValueError, match="at least one new message"):
        message_delta_ids(tok, [])


def test_render_ids_is_a_plain_list(tok: Any) -> None:
    ids = render_ids(tok, [msg(U, "hi")], add_generation_prompt=False)
    assert isinstance(ids, list) and all(type(i) is int for i in ids)


def test_a_delta_renderer_renders_the_base_once_and_gives_the_same_deltas(tok: Any, monkeypatch: pytest.MonkeyPatch
                                                                          ) -> None:
    from rlgen.episodes._template import DeltaRenderer

    news = [[msg(U, "Are you sure?")], [msg("tool", '{"result": 391}')], [msg("tool", "higher"), msg(U, "Again.")]]
    expected = [message_delta_ids(tok, m, tools=TOOLS) for m in news]
    renders: list[int] = []
    original = type(tok).apply_chat_template

    def counted(self: Any, conversation: Any, *args: Any, **kwargs: Any) -> Any:
        renders.append(len(conversation))
        return original(self, conversation, *args, **kwargs)

    monkeypatch.setattr(type(tok), "apply_chat_template", counted)
    deltas = DeltaRenderer(tok, tools=TOOLS)
    assert [deltas(m) for m in news] == expected
    # one render of the base conversation, then one per delta (message_delta_ids renders two per delta)
    assert len(renders) == 1 + len(news)
    with pytest.raises(ValueError, match="at least one new message"):
        deltas([])


def test_a_delta_renderer_renders_messages_it_has_seen_once(tok: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """An environment that answers every episode alike ("Continue.") costs one render per call,
    not one per episode and turn; a delta handed out is the caller's own list."""
    from rlgen.episodes._template import DeltaRenderer

    expected = message_delta_ids(tok, [msg(U, "Continue.")])
    renders: list[int] = []
    original = type(tok).apply_chat_template

    def counted(self: Any, conversation: Any, *args: Any, **kwargs: Any) -> Any:
        renders.append(len(conversation))
        return original(self, conversation, *args, **kwargs)

    monkeypatch.setattr(type(tok), "apply_chat_template", counted)
    deltas = DeltaRenderer(tok)
    first = deltas([msg(U, "Continue.")])
    first.append(-1)  # the caller's list: the kept delta is not changed
    again = [deltas([{"content": "Continue.", "role": U}]) for _ in range(5)]  # key order does not matter
    assert first[:-1] == expected and all(d == expected for d in again)
    assert len(renders) == 2  # the base and one delta
    renders.clear()
    deltas([msg(U, "Other.")])
    deltas([{"role": U, "content": "x", "name": None}, msg(U, "y")])
    deltas([{"role": "tool", "content": "1", "extra": ["not", "plain"]}])  # not memoised, still rendered
    deltas([{"role": "tool", "content": "1", "extra": ["not", "plain"]}])
    assert len(renders) == 4


def test_the_episodes_of_one_prompt_share_one_render_of_its_first_request(tok: Any,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from rlgen.episodes import _episode
    from rlgen.episodes._env import as_environment

    renders: list[int] = []

    def counted(*args: Any, **kwargs: Any) -> list[int]:
        renders.append(1)
        return first_prompt_ids(*args, **kwargs)

    monkeypatch.setattr(_episode, "first_prompt_ids", counted)
    call = _episode.EpisodeCall(tok, as_environment(lambda messages: "done"), None,  # type: ignore[arg-type]
                                max_turns=1, max_new_tokens=1, context_length=None)
    chat = [{"role": "user", "content": "What is 2+2?"}]
    first = call.first_ids(chat, None)
    assert first == first_prompt_ids(tok, chat)
    first.append(-1)  # a caller's list is its own
    assert call.first_ids([dict(m) for m in chat], None) == first_prompt_ids(tok, chat)
    assert call.first_ids([{"role": "user", "content": "What is 3+3?"}], None) != first[:-1]
    assert len(renders) == 2


def test_a_plain_message_has_the_same_memo_key_by_the_fast_path_as_by_the_general_one() -> None:
    from collections import OrderedDict

    from rlgen.episodes._template import memo_key

    plain = [{"role": "user", "content": "Continue."}]  # a dict of two str: the fast path
    general = [OrderedDict(content="Continue.", role="user")]  # a dict subclass: the general path
    assert memo_key(plain) == memo_key(general) is not None
    assert memo_key([{"role": "user", "content": "Stop."}]) != memo_key(plain)
    assert memo_key([{"role": "tool", "content": "Continue."}]) != memo_key(plain)
    assert memo_key([{"role": "user", "content": 1}]) != memo_key([{"role": "user", "content": True}])
