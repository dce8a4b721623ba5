"""The view and the browser of episodes: a row per episode drawn as turns (role labels, the model's
tokens coloured by logprob, the environment's grey, turn boundaries, tool calls and their results,
the drift marker), status badges, the header line, and browse()'s status filter and episode steps.

The episodes are built by hand, token-faithfully, on the default tokenizer (no server): the ids are
the first prompt, each assistant turn's sampled ids, a closing EOS where a turn has none, and the
template delta of the messages that follow (tests/episodes/_episodes_build.py).
"""

from __future__ import annotations

import html
import re
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "episodes"))
from _episodes_build import build_episode, default_tokenizer, sampled

from rlgen.episodes import EpisodeRecord, Episodes, episodes_from_records, first_prompt_ids
from rlgen.rollouts._display import rollouts_html
from rlgen.rollouts._episode_html import is_episodes, segments, turns_html
from rlgen.rollouts._token_html import logprob_color

U, A, T = "user", "assistant", "tool"
ADD_CALL = {"name": "add", "arguments": {"a": 2, "b": 3}, "status": "ok", "error": None}
FAILED_CALL = {"name": "divide", "arguments": {"a": 1, "b": 0}, "status": "tool_error",
               "error": "ZeroDivisionError: division by zero"}


def msg(role: str, content: str, **kw: Any) -> dict[str, Any]:
    return {"role": role, "content": content, **kw}


def assistant_turn(k: int, tokens: int, finish: str = "stop", matched: Any = 2) -> dict[str, Any]:
    return {"turn": k, "role": "assistant", "text": "", "tokens": tokens, "logprob_mean": -0.1, "tool_calls": None,
            "tool_calls_failed": None, "finish_reason": finish, "matched_stop": matched if finish == "stop" else None,
            "cached_tokens": 0, "prompt_tokens": 0, "latency_s": 0.5}


def env_turn(k: int, tokens: int, *, text: str | None = None, calls: list[dict[str, Any]] | None = None,
             status: str | None = None, done: bool = False) -> dict[str, Any]:
    calls = calls or []
    return {"turn": k, "role": "env", "text": text, "tokens": tokens, "logprob_mean": None, "tool_calls": len(calls),
            "tool_calls_failed": sum(c["status"] != "ok" for c in calls), "finish_reason": None, "cached_tokens": None,
            "prompt_tokens": None, "latency_s": 0.01, "status": status, "done": done, "calls": calls}


def record(tok: Any, prompt_index: int, sample_index: int, messages: list[dict[str, Any]], *, status: str,
           turns: list[list[int]] | None = None, meta: list[dict[str, Any]], error: str | None = None,
           unlikely: int | None = None) -> EpisodeRecord:
    """An EpisodeRecord of `messages` (the prompt is the messages before the first assistant one):
    ids, roles and loss mask from build_episode, turn ids from the runs of sampled tokens, logprob
    -0.1 on sampled tokens (-9.0 on the `unlikely`-th sampled token) and 0.0 elsewhere."""
    first = next((i for i, m in enumerate(messages) if m["role"] == A), len(messages))
    if first == len(messages):  # no assistant turn: the first request failed
        ids = first_prompt_ids(tok, messages)
        mask, prompt_len = [0] * len(ids), len(ids)
    else:
        ids, _, mask, prompts = build_episode(tok, messages, turns)
        prompt_len = len(prompts[0])
    turn_ids, k = [], -1
    for j, m in enumerate(mask):
        if m and (j == 0 or not mask[j - 1]):
            k += 1
        turn_ids.append(max(k, 0))
    sampled_at = [j for j, m in enumerate(mask) if m]
    logprobs = [-0.1 if m else 0.0 for m in mask]
    if unlikely is not None:
        logprobs[sampled_at[unlikely]] = -9.0
    return EpisodeRecord(
        prompt_index=prompt_index, sample_index=sample_index, messages=messages, ids=ids, prompt_len=prompt_len,
        loss_mask=mask, logprobs=logprobs, turn_ids=turn_ids,
        roles=["prompt"] * prompt_len + ["assistant" if m else "env" for m in mask[prompt_len:]],
        status=status, error=error, turns=meta, n_prompt_messages=first)


@pytest.fixture(scope="module")
def tok() -> Any:
    return default_tokenizer()


def _records(tok: Any) -> list[EpisodeRecord]:
    add = [msg(U, "Add 2 and 3."), msg(A, "I will call add."), msg(T, "5", name="add"), msg(A, "It is 5.")]
    # A turn cut at max_new_tokens (no EOS: the environment appends one), a user's reply, and a
    # second turn sampled with '\n\n' as one token where re-tokenizing its text gives '\n','\n'.
    again = [msg(U, "Add 2 and 3."), msg(A, "Maybe 6"), msg(U, "Are you sure?"), msg(A, "Sure.\n\nIt is 5.")]
    (nn,) = tok.encode("\n\n", add_special_tokens=False)
    merged = [*tok.encode("Sure.", add_special_tokens=False), nn, *tok.encode("It is 5.", add_special_tokens=False),
              tok.eos_token_id]
    again_turns = [sampled(tok, "Maybe 6", eos=False), merged]
    fail = [msg(U, "Divide 1 by 0."), msg(A, "Calling divide.")]
    refused = [msg(U, "Divide 1 by 0.")]
    n_fail = len(sampled(tok, fail[1]["content"]))
    return [
        record(tok, 0, 0, add, status="done", unlikely=1,
               meta=[assistant_turn(0, len(sampled(tok, add[1]["content"]))), env_turn(0, 12, calls=[ADD_CALL]),
                     assistant_turn(1, len(sampled(tok, add[3]["content"]))), env_turn(1, 0, done=True)]),
        record(tok, 0, 1, again, turns=again_turns, status="max_turns",
               meta=[assistant_turn(0, len(again_turns[0]), finish="length"), env_turn(0, 12, text="Are you sure?"),
                     assistant_turn(1, len(merged)), env_turn(1, 0, text="Still not sure?")]),
        record(tok, 1, 0, fail, status="tool_error", error="tool 'divide': ZeroDivisionError: division by zero",
               meta=[assistant_turn(0, n_fail), env_turn(0, 0, calls=[FAILED_CALL], status="tool_error")]),
        record(tok, 1, 1, refused, status="request_error", error="turn 0: the server refused the request",
               meta=[]),
    ]


@pytest.fixture(scope="module")
def res(tok: Any) -> Episodes:
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    return episodes_from_records(_records(tok), pad_token_id=pad, tokenizer=tok, model="tiny").check_drift()


def cells(page: str, i: int) -> list[str]:
    """Row i's <td> contents (the prompt cell sits only on a group's first row)."""
    row = page.split("<tbody>")[1].split("<tr>")[i + 1]
    return re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)


def turns_cell(page: str, i: int) -> str:
    return cells(page, i)[-1]


def labels(fragment: str) -> list[str]:
    return re.findall(r'<span style="font-size:75%;font-weight:bold;color:#fff[^"]*" title="[^"]*">([^<]*)</span>', fragment)


# -- the table -------------------------------------------------------------------------------------


def test_an_episodes_result_is_told_by_its_data_and_says_so_in_its_text_repr(res: Episodes) -> None:
    assert is_episodes(res)
    assert repr(res) == (f"<Episodes 4 episodes (2 prompts x 2) | {res.n_tokens} tokens, {int(res.df.sampled_tokens.sum())} "
                         "sampled | statuses: done 1, max_turns 1, request_error 1, tool_error 1 | drift: 1 of 3 | model=tiny>")


def test_each_turn_gets_a_role_label_and_its_own_block(res: Episodes) -> None:
    page = res._repr_html_()
    assert labels(turns_cell(page, 0)) == ["assistant 1", "tool", "assistant 2"]
    assert labels(turns_cell(page, 1)) == ["assistant 1", "user", "assistant 2", "env · not sent"]
    # a turn boundary: each turn is its own block with a coloured left edge
    assert turns_cell(page, 0).count('<div style="border-left:3px solid') == 3
    assert turns_cell(page, 1).count('<div style="border-left:3px solid') == 4


def test_the_model_s_tokens_keep_their_logprob_colour_and_the_environment_s_are_grey(res: Episodes, tok: Any) -> None:
    page = res._repr_html_()
    cell = turns_cell(page, 0)
    t = res.tokens(0)
    sampled_n, env_n = int(t["loss_mask"].sum()), int((~t["loss_mask"]).sum())
    coloured = re.findall(r'<span style="background:(#[0-9a-f]{6})[^"]*" title="response token', cell)
    grey = re.findall(r'<span style="color:#666" title="response token \d+: [^"]*environment \(loss_mask 0', cell)
    assert len(coloured) == sampled_n and len(grey) == env_n
    assert coloured.count(logprob_color(-9.0)) == 1 and coloured.count(logprob_color(-0.1)) == sampled_n - 1
    # the tool message's text is among the grey tokens, shown as text
    assert ">5</span>" in cell and "tool</span>" in cell


def test_a_closing_eos_the_environment_appended_ends_its_turn_dashed_and_is_not_drawn_as_sampled(res: Episodes) -> None:
    t = res.tokens(1)
    segs = segments(t["loss_mask"], t["turn_ids"], [{"finish_reason": "length"}, {"finish_reason": "stop", "matched_stop": 2}])
    assert [(s.kind, s.turn, s.closing) for s in segs] == [("assistant", 0, 0), ("env", 0, 1), ("assistant", 1, 0)]
    first_block = turns_cell(res._repr_html_(), 1).split('<div style="border-left')[1]
    assert "a closing EOS the environment appended (loss_mask 0)" in first_block
    assert "border:1px dashed #999" in first_block


def test_tool_calls_show_with_their_results_and_a_failed_call_is_red(res: Episodes) -> None:
    page = res._repr_html_()
    assert html.escape("add(a=2, b=3) → 5") in turns_cell(page, 0)
    failed = turns_cell(page, 2)
    assert html.escape('divide(a=1, b=0) ✗ tool_error') in failed
    assert "background:#c33" in failed and "ZeroDivisionError: division by zero" in failed
    assert labels(failed) == ["assistant 1", "tool · not sent"]


def test_the_status_is_a_badge_for_failures_and_ended_lines_say_how_an_episode_ended(res: Episodes) -> None:
    page = res._repr_html_()
    episode = [cells(page, i)[1 if i in (0, 2) else 0] for i in range(4)]
    assert ">done</span>" in episode[0] and "background" not in episode[0].split(">done</span>")[0].rsplit("<span", 1)[1]
    assert "color:#b70" in episode[1] and ">max_turns</span>" in episode[1]
    for i, status in ((2, "tool_error"), (3, "request_error")):
        badge = re.search(r'<span style="background:#c33;color:#fff[^"]*" title="status ' + status + r'[^"]*">' + status, episode[i])
        assert badge, episode[i]
    assert "2 turns" in episode[0] and "1 tool call" in episode[0] and "1 tool call" in episode[2] and "(1 failed)" in episode[2]
    assert "ended: " not in turns_cell(page, 0)  # done: the status cell says it
    assert "ended: " in turns_cell(page, 1) and "the server refused the request" in turns_cell(page, 3)
    assert "(empty)" in turns_cell(page, 3)


def test_the_header_counts_episodes_prompts_statuses_and_drift(res: Episodes) -> None:
    page = res._repr_html_()
    line = re.sub(r"<[^>]+>", "", re.search(r"<summary[^>]*>(.*?)</summary>", page, re.S).group(1))
    assert line.startswith("4 episodes · 2 prompts · statuses: done 1 · max_turns 1 · request_error 1 · tool_error 1 · "
                           "drift: 1 of 3 · ")
    assert "mask with loss_mask" in line


def test_without_check_drift_the_header_says_drift_was_not_checked_and_no_marker_shows(tok: Any) -> None:
    plain = episodes_from_records(_records(tok), pad_token_id=2, tokenizer=tok)
    page = plain._repr_html_()
    assert "drift not checked" in page and "drift ▸" not in page


def test_the_drift_marker_sits_at_the_first_divergent_token_with_its_cause_and_neighbours(res: Episodes) -> None:
    row = res.df.iloc[1]
    assert row["drift"] == "retokenized"
    j = int(row["drift_position"]) - int(row["prompt_tokens"])
    cell = turns_cell(res._repr_html_(), 1)
    (mark,) = re.findall(r'<span style="background:#c62828[^"]*" title="([^"]*)">drift ▸</span><span style="([^"]*)" title="([^"]*)"', cell)
    title, style, token_title = (html.unescape(x) for x in mark)
    assert token_title.startswith(f"response token {j}: ") and "outline:2px solid #c62828" in style
    assert title.startswith("drift: retokenized") and f"response token {j}" in title and "in assistant 2" in title
    assert "'\\n\\n'" in title  # the token sampled where the re-render has '\n','\n', with its neighbours
    assert "retokenized" in cells(res._repr_html_(), 1)[0] and "drift: " in cells(res._repr_html_(), 1)[0]
    assert "drift ▸" not in turns_cell(res._repr_html_(), 0)


def test_an_episode_never_answered_has_no_drift_and_a_divergence_in_the_prompt_is_marked_where_the_response_starts(
        res: Episodes) -> None:
    # The episode whose first request failed sampled nothing: nothing to compare, no cause, no mark.
    row = res.df.iloc[3]
    assert row["drift"] is None and "drift ▸" not in turns_cell(res._repr_html_(), 3)
    # A template that rewrites a message of the prompt (a demo's think block) diverges before the response.
    inside = res.with_columns({"drift": ["rewritten history", *res.df.drift[1:]],
                               "drift_position": [int(res.df.prompt_tokens[0]) - 3, *res.df.drift_position[1:]],
                               "drift_turn": [0, *res.df.drift_turn[1:]]})
    cell = turns_cell(inside._repr_html_(), 0)
    (title,) = re.findall(r'<span style="background:#c62828[^"]*" title="([^"]*)">drift ▸</span>', cell)
    assert f"position {int(res.df.prompt_tokens[0]) - 3}, in the prompt" in html.unescape(title)
    assert cell.index("assistant 1") < cell.index("drift ▸") < cell.index("&lt;|im_end|&gt;")  # on the first response token


def test_episode_columns_are_not_shown_as_data_columns(res: Episodes) -> None:
    page = res._repr_html_()
    header = re.findall(r"<th[^>]*>([^<]*)</th>", page)
    assert header == ["prompt", "episode", "turns"]
    assert "completion_messages" not in page and "more columns" not in page


def test_long_episodes_are_cut_with_a_note_and_long_environment_messages_keep_their_start_and_end(tok: Any) -> None:
    long_tool = " ".join(f"line{k}" for k in range(120))
    messages = [msg(U, "Read the file."), msg(A, "Reading it."), msg(T, long_tool, name="read"), msg(A, "Done reading.")]
    _, _, mask, _ = build_episode(tok, messages)
    env_n = len(mask) - mask.index(0, mask.index(1)) - len(sampled(tok, "Done reading."))
    rec = record(tok, 0, 0, messages, status="done",
                 meta=[assistant_turn(0, 4), env_turn(0, env_n, calls=[{**ADD_CALL, "name": "read", "arguments": {}}]),
                       assistant_turn(1, 4), env_turn(1, 0, done=True)])
    res = episodes_from_records([rec], pad_token_id=2, tokenizer=tok)
    cell = turns_cell(res._repr_html_(), 0)
    visible = re.sub(r"<[^>]+>", "", cell)  # the text a reader sees (the tool's whole result is on hover)
    assert f" … {env_n - 48} environment tokens … " in visible
    assert "line0 line1" in visible and "line118 line119" in visible and "line60" not in visible
    assert labels(cell) == ["assistant 1", "tool", "assistant 2"]
    short = turns_html(res, 0, max_tokens=20)
    assert "more assistant turn" in short and "res.browse() shows the whole episode" in short
    assert labels(short) == ["assistant 1", "tool"]
    # the browser draws the whole episode
    full = res.browse(widgets=False).html().split("episode 0 (row 0)")[1]
    assert "line60" in re.sub(r"<[^>]+>", "", full) and "environment tokens …" not in full


def test_the_html_survives_a_parquet_round_trip(res: Episodes, tmp_path: Path) -> None:
    res.to_parquet(tmp_path / "e.parquet")
    back = Episodes.from_parquet(tmp_path / "e.parquet")
    assert back._repr_html_() == res._repr_html_().replace(f"run {res.df.run[0]}", f"run {back.df.run[0]}")


def test_every_style_is_inline_apart_from_the_shared_stylesheet(res: Episodes) -> None:
    page = rollouts_html(res)
    assert page.count("<style>") == 1  # VIEW_STYLE, which only repeats the inline rules
    assert set(re.findall(r'class="([^"]*)"', page)) <= {"rlgen-rollouts", "rlgen-prompt", "rlgen-legend"}


def test_single_turn_results_are_not_episodes(res: Episodes) -> None:
    from test_display import make

    plain = make(2)
    assert not is_episodes(plain) and "assistant 1" not in plain._repr_html_()
    assert repr(plain).startswith("<Rollouts 2 rows")


# -- the browser -----------------------------------------------------------------------------------


def test_the_browser_filters_by_status_and_steps_through_episodes_across_groups(res: Episodes) -> None:
    b = res.browse(widgets=False)
    assert repr(b) == "<RolloutBrowser 2 groups, 4 of 4 episodes>"
    b.status = "tool_error"
    assert b.matching().tolist() == [2]
    page = b.html()
    assert "episode 1 of 1 matching (4 in all)" in page and "status = tool_error" in page
    assert "episode 0 (row 2) · tool_error · 1 turn · 1 tool call (1 failed)" in page
    b.status = None
    b.step(1)
    assert (b.group, b.sample) == (0, 1)
    b.step(1)
    assert (b.group, b.sample) == (1, 0)  # into the next prompt's group
    b.step(5)
    assert (b.group, b.sample) == (1, 1)  # clamped
    b.step(-2)
    assert (b.group, b.sample) == (0, 1)
    whole = b.html().split("episode 1 (row 1)")[1]
    assert labels(whole) == ["assistant 1", "user", "assistant 2", "env · not sent"]
    assert "drift ▸" in whole and "ended: " in whole


def test_the_browser_widget_has_a_status_dropdown_and_episode_buttons(res: Episodes) -> None:
    pytest.importorskip("ipywidgets")
    b = res.browse()
    box = b.widget()
    (status, finish, search), (previous, following, episode), view = (c.children if hasattr(c, "children") else c
                                                                      for c in box.children)
    assert (status.description, finish.description, search.description) == ("status", "finish", "search")
    assert status.options[0] == ("all", "all")
    assert ("tool_error (1)", "tool_error") in status.options
    assert previous.description == "◀ episode" and following.description == "episode ▶"
    status.value = "max_turns"
    assert b.status == "max_turns" and b.matching().tolist() == [1] and "status = max_turns" in view.value
    status.value = "all"
    following.click()
    following.click()
    assert (b.group, b.sample) == (1, 0) and "episode 3 of 4 matching" in view.value
    assert [label for label, _ in episode.options] == ["0 (row 2) tool_error", "1 (row 3) request_error"]


def test_the_browser_controls_open_on_a_status_set_from_code(res: Episodes) -> None:
    pytest.importorskip("ipywidgets")
    b = res.browse()
    b.status = "max_turns"
    status = b.widget().children[0].children[0]
    assert status.value == "max_turns" and b.matching().tolist() == [1]


def test_an_environment_steps_own_reward_shows_on_its_turn_also_when_it_sent_nothing(tok: Any) -> None:
    said = [msg(U, "What is 2+3?"), msg(A, "4"), msg(U, "Try again."), msg(A, "5")]
    meta = [assistant_turn(0, len(sampled(tok, "4"))), {**env_turn(0, 12, text="Try again."), "reward": 0.25},
            assistant_turn(1, len(sampled(tok, "5"))), {**env_turn(1, 0, done=True), "reward": 1.0}]
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    one = episodes_from_records([record(tok, 0, 0, said, status="done", meta=meta)], pad_token_id=pad, tokenizer=tok)
    page = rollouts_html(one)
    assert "step reward 0.25" in page and "step reward 1" in page
    assert one.df.step_rewards[0] == [0.25, 1.0]


def test_a_call_the_parser_could_not_read_shows_as_unreadable_with_its_parser_and_error(tok: Any) -> None:
    said = [msg(U, "Add 2 and 3."), msg(A, '<tool_call>{"name": "add"</tool_call>')]
    bad = {"name": None, "arguments": None, "status": "bad_tool_call", "parser": "server:hermes",
           "error": "malformed tool call: bad JSON"}
    meta = [assistant_turn(0, len(sampled(tok, said[1]["content"]))), env_turn(0, 0, calls=[bad], status="bad_tool_call")]
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    page = rollouts_html(episodes_from_records([record(tok, 0, 0, said, status="bad_tool_call", meta=meta)],
                                               pad_token_id=pad, tokenizer=tok))
    assert "unreadable call ✗ bad_tool_call" in page and "None(" not in page
    assert html.escape("the server:hermes parser could not read") in page and "bad JSON" in page
