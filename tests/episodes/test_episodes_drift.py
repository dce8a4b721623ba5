"""rlgen.episodes._drift on two real templates: the default model's ChatML, and a Qwen3-style thinking
template (drops `<think>` blocks from assistant turns before the last user turn) built locally on the
same tokenizer files. Each cause: same, boundary, retokenized, rewritten history, other."""

from __future__ import annotations

from typing import Any

import pytest
from _episodes_build import (
    EOS,
    NL,
    THINK_TEMPLATE,
    build_episode,
    default_tokenizer,
    first_prompt_ids,
    sampled,
    tokenizer_with_template,
)

from rlgen.episodes import CAUSES, Drift, drift, drift_summary, message_delta_ids

U, A = "user", "assistant"


def msg(role: str, content: str) -> dict[str, str]:
    return {"role": role, "content": content}


CHAT = [msg(U, "What is 12 * 12?"), msg(A, "12 * 12 = 144."), msg(U, "Are you sure?"),
        msg(A, "Yes: 12 * 12 is 144."), msg(U, "And 13 * 13?"), msg(A, "13 * 13 = 169.")]
THINK_CHAT = [msg(U, "What is 12 * 12?"), msg(A, "<think>\n12 * 12 is 12 * 10 + 12 * 2 = 120 + 24 = 144.\n</think>\n\n144."),
              msg(U, "And 13 * 13?"), msg(A, "<think>\n13 * 13 = 130 + 39 = 169.\n</think>\n\n169."),
              msg(U, "Sum of both?"), msg(A, "<think>\n144 + 169 = 313.\n</think>\n\n313.")]
MERGED = msg(A, "Sure.\n\nThe answer is 144.")


@pytest.fixture(scope="module")
def tok() -> Any:
    return default_tokenizer()


@pytest.fixture(scope="module")
def think_tok(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return tokenizer_with_template(tmp_path_factory.mktemp("think") / "smollm2-think", THINK_TEMPLATE)


def _without_boundary_newlines(ids: list[int], roles: list[str]) -> tuple[list[int], list[str]]:
    """The episode as the text-difference method builds it: no '\\n' after an assistant turn's EOS."""
    keep = [i for i in range(len(ids)) if not (i and roles[i - 1] == A != roles[i])]
    assert all(ids[i] == NL for i in range(len(ids)) if i not in keep)
    return [ids[i] for i in keep], [roles[i] for i in keep]


def _merged_newlines(tok: Any) -> tuple[list[int], int]:
    """MERGED's turn as sampled with '\\n\\n' as one token, where re-tokenizing its text gives '\\n','\\n'."""
    (nn,) = tok.encode("\n\n", add_special_tokens=False)
    plain = sampled(tok, MERGED["content"])
    at = plain.index(NL)
    assert plain[at : at + 2] == [NL, NL] and nn != NL and tok.decode([nn]) == "\n\n"
    return [*plain[:at], nn, *plain[at + 2 :]], at


def test_a_token_faithful_episode_is_the_same(tok: Any) -> None:
    ids, roles, *_ = build_episode(tok, CHAT)
    for r in (None, roles):
        d = drift(tok, CHAT, ids, roles=r)
        assert d.same and d.cause == "same" and d.position is None and d.causes == ("same",)
        assert (d.n_ids, d.n_render, d.assistant_turns, d.retokenized_turns) == (115, 115, 3, 0)
    assert repr(d) == "Drift(cause='same', ids=115, render=115, retokenized=0/3 assistant turns)"


def test_the_text_method_drifts_at_the_boundary_after_the_first_eos(tok: Any) -> None:
    ids, roles, *_ = build_episode(tok, CHAT)
    bad, bad_roles = _without_boundary_newlines(ids, roles)
    first_eos = len(first_prompt_ids(tok, CHAT[:1])) + len(sampled(tok, CHAT[1]["content"])) - 1
    for r in (None, bad_roles):
        d = drift(tok, CHAT, bad, roles=r)
        assert d.cause == "boundary" and d.causes == ("boundary",)
        assert d.position == first_eos + 1 == 53 and (d.n_ids, d.n_render) == (113, 115)
        assert (d.turn, d.role) == (2, U)  # the user message after the first assistant turn
        k = d.position - d.window_start
        assert d.render_window[k - 1 : k + 1] == (EOS, NL) and d.ids_window[k - 1 : k + 1] == (EOS, 1)
        assert d.render_tokens[k] == "\n" and d.ids_tokens[k] == "<|im_start|>"
    assert repr(d) == ("Drift(cause='boundary', position=53, turn=2 (user), ids=113, render=115, "
                       "retokenized=0/3 assistant turns)")


def test_a_closing_eos_left_out_is_a_boundary_drift(tok: Any) -> None:
    chat = [msg(U, "Call the tool."), msg(A, "<tool_call>x</tool_call>"), msg("tool", "1"), msg(A, "Done.")]
    call = sampled(tok, chat[1]["content"], eos=False)
    start = len(first_prompt_ids(tok, chat[:1]))
    ids, *_ = build_episode(tok, chat, turns=[call, sampled(tok, "Done.")])
    assert drift(tok, chat, ids).same
    forgot = ids[: start + len(call)] + ids[start + len(call) + 1 :]  # no EOS appended after the stop string
    d = drift(tok, chat, forgot)
    assert d.cause == "boundary" and d.position == start + len(call)


def test_a_merged_newline_token_is_retokenized_drift_inside_the_assistant_turn(tok: Any) -> None:
    chat = [msg(U, "Explain."), MERGED, msg(U, "ok"), msg(A, "Good.")]
    turn, at = _merged_newlines(tok)
    ids, roles, *_ = build_episode(tok, chat, turns=[turn, sampled(tok, "Good.")])
    start = len(first_prompt_ids(tok, chat[:1]))
    for r in (None, roles):
        d = drift(tok, chat, ids, roles=r)
        assert d.cause == "retokenized" and d.causes == ("retokenized",)
        assert d.position == start + at and (d.turn, d.role) == (1, A)
        assert (d.n_ids, d.n_render) == (58, 59) and (d.retokenized_turns, d.assistant_turns) == (1, 2)
        k = d.position - d.window_start
        assert d.ids_tokens[k] == "\n\n" and d.render_tokens[k : k + 2] == ("\n", "\n")


def test_a_thinking_template_rewrites_history_inside_the_first_assistant_turn(think_tok: Any) -> None:
    text = think_tok.apply_chat_template(THINK_CHAT[:3], tokenize=False)
    assert "<think>" not in text  # an assistant turn before the last user turn loses its think block
    assert "<think>" in think_tok.apply_chat_template(THINK_CHAT[:2], tokenize=False)  # the last one keeps it
    ids, roles, _, prompts = build_episode(think_tok, THINK_CHAT)
    # what was sent at turn 2 is not the render of the conversation so far: history was rewritten
    assert prompts[1] != think_tok.apply_chat_template(THINK_CHAT[:3], add_generation_prompt=True, return_dict=False)
    start = len(first_prompt_ids(think_tok, THINK_CHAT[:1]))
    for r in (None, roles):
        d = drift(think_tok, THINK_CHAT, ids, roles=r)
        assert d.cause == "rewritten history" and d.causes == ("rewritten history",)
        assert d.position == start == 19 and (d.turn, d.role) == (1, A)
        assert (d.n_ids, d.n_render) == (168, 91)  # 77 tokens of think blocks the re-render drops
        k = d.position - d.window_start
        assert "".join(d.ids_tokens[k : k + 3]) == "<think>" and d.render_tokens[k] != "<"
    assert "smollm2-think (chat template" in d.template


def test_the_thinking_template_still_gives_token_faithful_deltas(think_tok: Any, tok: Any) -> None:
    # its delta after an EOS is the same as ChatML's: the base has no think block to drop
    new = [msg(U, "And 13 * 13?")]
    assert message_delta_ids(think_tok, new) == message_delta_ids(tok, new)
    ids, *_ = build_episode(think_tok, THINK_CHAT[:2])
    assert drift(think_tok, THINK_CHAT[:2], ids).same  # one turn: nothing earlier to rewrite


def test_messages_that_are_not_the_episode_are_other(tok: Any) -> None:
    ids, *_ = build_episode(tok, CHAT)
    wrong = [*CHAT[:-1], msg(A, "13 * 13 = 196.")]
    d = drift(tok, wrong, ids)
    assert d.cause == "other" and (d.turn, d.role) == (5, A)


def test_roles_must_label_every_id(tok: Any) -> None:
    ids, roles, *_ = build_episode(tok, CHAT)
    with pytest.raises(ValueError, match="one label per id"):
        drift(tok, CHAT, ids, roles=roles[:-1])


def test_the_html_marks_the_divergence_with_inline_styles_only(tok: Any) -> None:
    ids, roles, *_ = build_episode(tok, CHAT)
    bad, _ = _without_boundary_newlines(ids, roles)
    page = drift(tok, CHAT, bad)._repr_html_()
    assert "<style" not in page and "boundary" in page and "re-render" in page
    assert page.count("outline:1px solid") == 2  # the divergent token, in both rows
    assert 'title="id 198 at 53"' in page and "↵" in page
    same = drift(tok, CHAT, ids)
    assert "<table" not in same._repr_html_() and "\n" not in repr(same)


def test_drift_is_a_frozen_record(tok: Any) -> None:
    ids, *_ = build_episode(tok, CHAT)
    d = drift(tok, CHAT, ids)
    with pytest.raises(AttributeError):
        d.cause = "other"  # type: ignore[misc]
    assert isinstance(d, Drift)


def test_drift_summary_counts_episodes_by_cause_and_the_share_of_turns_retokenized(tok: Any, think_tok: Any) -> None:
    ids, roles, *_ = build_episode(tok, CHAT)
    bad, _ = _without_boundary_newlines(ids, roles)
    chat = [msg(U, "Explain."), MERGED, msg(U, "ok"), msg(A, "Good.")]
    turn, _ = _merged_newlines(tok)
    merged, merged_roles, *_ = build_episode(tok, chat, turns=[turn, sampled(tok, "Good.")])
    both, _ = _without_boundary_newlines(merged, merged_roles)  # retokenized in turn 1, then a boundary
    think, *_ = build_episode(think_tok, THINK_CHAT)
    drifts = [drift(tok, CHAT, ids), drift(tok, CHAT, bad), drift(tok, chat, merged), drift(tok, chat, both),
              drift(think_tok, THINK_CHAT, think)]
    assert drifts[3].causes == ("retokenized", "boundary")
    df = drift_summary(drifts)
    assert list(df.index) == [*CAUSES, "all"]
    assert df["episodes"].to_dict() == {"same": 1, "boundary": 1, "retokenized": 2, "rewritten history": 1,
                                        "other": 0, "all": 5}
    assert df.loc["retokenized", "episodes_any"] == 2 and df.loc["boundary", "episodes_any"] == 2
    assert df.loc["all", "assistant_turns"] == 3 + 3 + 2 + 2 + 3 and df.loc["all", "retokenized_turns"] == 2
    assert df.loc["all", "retokenized_share"] == pytest.approx(2 / 13)
    assert df.loc["retokenized", "share"] == pytest.approx(0.4)
    assert df.loc["retokenized", "retokenized_share"] == pytest.approx(2 / 4)
    assert drift_summary([]).loc["all", "episodes"] == 0


def test_a_long_episode_drifts_at_every_boundary_and_only_there(tok: Any) -> None:
    chat = [msg(U, "Tell me a story.")]
    for k in range(20):
        chat += [msg(A, " ".join(f"word{k}x{j}" for j in range(60))), msg(U, f"Continue {k}.")]
    chat = chat[:-1]
    ids, roles, *_ = build_episode(tok, chat)
    bad, _ = _without_boundary_newlines(ids, roles)
    d = drift(tok, chat, bad)  # 6,711 ids against 6,730: aligned in well under a second
    assert (d.n_ids, d.n_render, d.cause, d.causes, d.assistant_turns) == (6711, 6730, "boundary", ("boundary",), 20)
