"""The HTML of multi-turn episodes: a trajectory drawn as turns, an episode's cell and header line.

Owns: telling an episodes result from a single-turn one by its data (`is_episodes`: a `status` and
a `turns` column), an episode's response cut into turns (`segments`: the model's sampled tokens,
loss_mask 1, and the environment's / tools' tokens, loss_mask 0, with a closing EOS the environment
appended), the trajectory as HTML (`turns_html`: a role label per turn, the model's tokens coloured
by logprob, the environment's grey, a visible boundary between turns, the tool calls and their
results, the drift marker at the first token that differs from a trainer's re-render, how the
episode ended), the table's episode cell (status badge, turns, tool calls), the header line
(`episodes_line`), the text repr (`episodes_repr`) and the masking note. Every style is inline
(JupyterLab's sanitizer keeps it in an untrusted notebook, see `_token_html`).

Knows nothing about `rlgen.episodes` (the class, the runner, environments, the drift inspector):
it reads a `RolloutsView`'s df columns (`status`, `turns`, `tool_calls`, `completion_messages`,
`drift*`), its per-token `loss_mask` / `turn_ids` and `meta_info[i]["turns"]`.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._token_html import (
    BOUNDARY,
    TEXT_STYLE,
    RowTokens,
    clip_text,
    fmt_value,
    prompt_tail_html,
    row_tokens,
    shape_text,
    special_piece,
    token_body,
    token_pieces,
    token_span,
)

if TYPE_CHECKING:
    from ._protocol import RolloutsView

__all__ = [
    "Segment",
    "episode_cell",
    "episode_title",
    "episodes_line",
    "episodes_mask_note",
    "episodes_repr",
    "is_episodes",
    "segments",
    "status_counts",
    "status_html",
    "turns_html",
]


def is_episodes(r: RolloutsView) -> bool:
    """Whether `r` holds episodes (a row per multi-turn episode): its df has `status` and `turns`."""
    columns = r.df.columns
    return "status" in columns and "turns" in columns


# -- statuses ------------------------------------------------------------------------------------

# What each status means (the hover text of its badge).
STATUS_MEANING = {
    "done": "the environment ended the episode",
    "max_turns": "stopped after max_turns assistant turns (the environment still answered)",
    "context_limit": "the next request would not fit the model's context",
    "env_error": "the environment raised",
    "env_timeout": "the environment took longer than env_timeout",
    "bad_env_return": "the environment returned something rlgen cannot read",
    "bad_tool_call": "a malformed tool call (bad JSON, an unknown tool)",
    "tool_error": "a tool raised",
    "tool_timeout": "a tool took longer than its timeout",
    "bad_arguments": "a tool call's arguments did not fit the tool",
    "not_serialisable": "a tool's result could not be made text",
    "template_error": "the chat template could not render the new messages token-faithfully",
    "request_error": "the server refused or failed a request",
    "error": "an unexpected failure (its traceback is in res.meta_info[i]['traceback'])",
    "cancelled": "Ctrl-C before it finished",
    "running": "not finished",
}
# done is green text, a budget end amber text; anything else is a badge: grey for an episode that
# did not finish, red for a failure.
_TEXT_COLOURS = {"done": "#2a7", "max_turns": "#b70", "context_limit": "#b70"}
_BADGE_COLOURS = {"cancelled": "#777", "running": "#777"}
_FAILURE = "#c33"


def _status_colour(status: str) -> str:
    return _TEXT_COLOURS.get(status) or _BADGE_COLOURS.get(status) or _FAILURE


def status_html(status: Any, error: Any = None, *, text: str | None = None) -> str:
    """A status as coloured text (done, a budget end) or a coloured badge (a failure), with what it
    means and the error on hover."""
    status = "?" if status is None or (isinstance(status, float) and math.isnan(status)) else str(status)
    title = f"status {status}: {STATUS_MEANING.get(status, 'see the Episodes docstring')}"
    if isinstance(error, str) and error:
        title += f"\n{clip_text(error, 2000)}"
    shown = html.escape(status if text is None else text)
    if status in _TEXT_COLOURS:
        return f'<span style="color:{_TEXT_COLOURS[status]}" title="{html.escape(title)}">{shown}</span>'
    return (f'<span style="background:{_status_colour(status)};color:#fff;border-radius:3px;padding:0 4px;'
            f'white-space:nowrap" title="{html.escape(title)}">{shown}</span>')


def status_counts(r: RolloutsView) -> list[tuple[str, int]]:
    """(status, count), most frequent first."""
    counts = r.df["status"].astype(str).value_counts(sort=False)
    return sorted(((str(k), int(v)) for k, v in counts.items()), key=lambda kv: (-kv[1], kv[0]))


def _drift_count(r: RolloutsView) -> tuple[int, int] | None:
    """(episodes whose ids differ from the re-render, episodes checked); None when not checked."""
    if "drift" not in r.df.columns:
        return None
    causes = [c for c in r.df["drift"].tolist() if isinstance(c, str)]
    return sum(c != "same" for c in causes), len(causes)


def _int(value: Any, default: int = 0) -> int:
    try:
        return default if value is None or math.isnan(float(value)) else int(value)
    except (TypeError, ValueError):
        return default


def _shape(r: RolloutsView) -> tuple[int, int]:
    return len(r), int(r.df["prompt_index"].nunique()) if len(r) else 0


def episodes_repr(r: RolloutsView) -> str:
    """`<Episodes 6 episodes (3 prompts x 2) | 410 tokens, 250 sampled | statuses: done 4, max_turns 2 | drift: 2 of 6 | model=m>`."""
    parts = [shape_text(r, noun="episode"), f"{r.n_tokens} tokens, {_int(r.df['sampled_tokens'].sum()) if 'sampled_tokens' in r.df else '?'} sampled"]
    counts = status_counts(r)
    if counts:
        parts.append("statuses: " + ", ".join(f"{k} {v}" for k, v in counts))
    drift = _drift_count(r)
    if drift is not None:
        parts.append(f"drift: {drift[0]} of {drift[1]}")
    if r.model:
        parts.append(f"model={r.model}")
    return f"<Episodes {' | '.join(parts)}>"


def episodes_line(r: RolloutsView) -> list[str]:
    """The header line's parts (HTML): "6 episodes", "3 prompts", "statuses: done 4 · max_turns 2",
    "drift: 2 of 6" (or "drift not checked"), the tokens, the model."""
    n, prompts = _shape(r)
    statuses = " · ".join(status_html(k, text=f"{k} {v}") for k, v in status_counts(r))
    parts = [f"{n} episode{'s' if n != 1 else ''}", f"{prompts} prompt{'s' if prompts != 1 else ''}"]
    if statuses:
        parts.append(f"statuses: {statuses}")
    drift = _drift_count(r)
    if drift is None:
        parts.append('<span style="color:#888" title="res.check_drift() compares each episode with a trainer\'s '
                     're-render of its messages; the view then marks the first token that differs">drift not checked</span>')
    else:
        colour = _FAILURE if drift[0] else "#2a7"
        parts.append(f'<span style="color:{colour}" title="episodes whose ids differ from the re-render of their '
                     f'messages (res.drift_summary() counts the causes)">drift: {drift[0]} of {drift[1]}</span>')
    sampled = _int(r.df["sampled_tokens"].sum()) if "sampled_tokens" in r.df.columns else None
    parts.append(html.escape(f"{r.n_tokens} tokens" + (f", {sampled} sampled" if sampled is not None else "")))
    if r.model:
        parts.append(html.escape(f"model={r.model}"))
    return parts


def episodes_mask_note(r: RolloutsView, rows: int) -> tuple[str, str]:
    """(the header line's masking label, the note on what the colours cover) for episodes."""
    text = ("Coloured tokens are the model's: sampled, loss_mask 1 (each turn's EOS included). Grey tokens are the "
            "environment's and tools' messages and a closing EOS the environment appended: in response_ids, "
            "loss_mask 0, not trained on. The dashed grey tokens before │ are the prompt's last tokens.")
    pad = r.pad_token_id
    has_pad = sum(1 for i in range(rows) if (r.tokens(i)["ids"] == pad).any())
    label = '<span style="color:#888">masking: loss_mask</span>'
    if has_pad:
        text += (f" The pad id {pad} is also in {has_pad} shown episode{'s' if has_pad != 1 else ''} (this model's EOS, "
                 f"which ends each turn): mask with loss_mask, not response_ids != {pad}.")
        label = f'<span style="color:#b60">⚠ pad id {pad} = EOS: mask with loss_mask</span>'
    return label, f'<div style="color:#666;white-space:normal">{html.escape(text)}</div>'


# -- the table's episode cell --------------------------------------------------------------------


def episode_cell(row: Any) -> str:
    """Sample index and row id, the status badge, turns, tool calls (failed), sampled and response
    tokens, mean logprob of the sampled tokens, and drift: one a line."""
    calls, failed = _int(row.get("tool_calls")), _int(row.get("tool_calls_failed"))
    lines = [
        f'<span title="episode {row["sample_index"]} of its prompt; row_id {int(row["row_id"])}">'
        f'#{row["sample_index"]} <span style="color:#888">row {int(row["row_id"])}</span></span>',
        status_html(row.get("status"), row.get("error")),
        f'<span title="assistant turns">{_int(row.get("turns"))} turn{"s" if _int(row.get("turns")) != 1 else ""}</span>',
    ]
    if calls:
        bad = f' <span style="color:{_FAILURE}">({failed} failed)</span>' if failed else ""
        lines.append(f'<span title="tool calls run ({failed} not ok)">{calls} tool call{"s" if calls != 1 else ""}{bad}</span>')
    sampled = _int(row.get("sampled_tokens"))
    lines.append(f'<span title="{sampled} sampled tokens (loss_mask 1) of {row["completion_tokens"]} response tokens after '
                 f'{int(row["prompt_tokens"])} prompt tokens">{sampled}/{row["completion_tokens"]} tok</span>')
    lines.append(f'<span title="mean logprob of the sampled tokens" style="color:#555">lp {html.escape(fmt_value(row["logprob_mean"]))}</span>')
    cause = row.get("drift")
    if isinstance(cause, str):
        if cause == "same":
            lines.append('<span style="color:#888" title="the ids are the re-render of the messages, token for token">no drift</span>')
        else:
            lines.append(f'<span style="color:{_FAILURE};font-weight:bold" title="the first divergence from a trainer\'s '
                         f're-render: {html.escape(cause)} (marked in the trajectory)">drift: '
                         f'<span style="white-space:nowrap">{html.escape(cause)}</span></span>')
    return "".join(f"<div>{line}</div>" for line in lines)


def episode_title(row: Any) -> str:
    """One line of text for an episode shown whole (the browser)."""
    calls, failed = _int(row.get("tool_calls")), _int(row.get("tool_calls_failed"))
    turns = _int(row.get("turns"))
    parts = [f"episode {row['sample_index']} (row {row['row_id']})", str(row.get("status")),
             f"{turns} turn{'s' if turns != 1 else ''}"]
    if calls:
        parts.append(f"{calls} tool call{'s' if calls != 1 else ''}" + (f" ({failed} failed)" if failed else ""))
    parts.append(f"{_int(row.get('sampled_tokens'))} sampled of {row['completion_tokens']} tokens")
    parts.append(f"mean logprob {fmt_value(row['logprob_mean'])}")
    if isinstance(row.get("drift"), str):
        parts.append(f"drift: {row['drift']}")
    return " · ".join(parts)


# -- the trajectory as turns ---------------------------------------------------------------------


@dataclass(frozen=True)
class Segment:
    """A run of response tokens [start, end): the model's ("assistant", loss_mask 1) or the
    environment's ("env", loss_mask 0) after assistant turn `turn`. An env segment's first
    `closing` tokens (0 or 1) are a closing EOS the environment appended to a turn that stopped
    without one (on length or a stop string)."""

    kind: str
    turn: int
    start: int
    end: int
    closing: int = 0


def _ended_without_eos(meta_turn: dict[str, Any] | None) -> bool | None:
    """Whether an assistant turn stopped without sampling its stop token (so a closing EOS was
    appended): on length or on a stop string. None where the turn's record does not say."""
    if not meta_turn or meta_turn.get("finish_reason") is None:
        return None
    if meta_turn.get("finish_reason") != "stop":
        return True
    return isinstance(meta_turn.get("matched_stop"), str)


def segments(loss_mask: Sequence[Any], turn_ids: Sequence[Any] | None, assistant_turns: Sequence[dict[str, Any]] = (),
             special: Callable[[int], bool] | None = None) -> list[Segment]:
    """An episode's response cut into runs of the same (loss_mask, turn). A closing EOS is the
    first token of an env run after a turn that stopped without one (the turn's record says so;
    without a record, `special(position)`: whether the token there is a special token)."""
    out: list[Segment] = []
    n = len(loss_mask)
    start = 0
    for k in range(1, n + 1):
        same = k < n and bool(loss_mask[k]) == bool(loss_mask[start]) and (
            turn_ids is None or int(turn_ids[k]) == int(turn_ids[start]))
        if same:
            continue
        turn = int(turn_ids[start]) if turn_ids is not None else 0
        kind = "assistant" if bool(loss_mask[start]) else "env"
        closing = 0
        if kind == "env" and out and out[-1].kind == "assistant":
            ended = _ended_without_eos(assistant_turns[turn] if turn < len(assistant_turns) else None)
            if ended is None and special is not None:
                ended = special(start)
            closing = 1 if ended else 0
        out.append(Segment(kind, turn, start, k, closing))
        start = k
    return out


def _turns_of(meta: dict[str, Any] | None, role: str) -> list[dict[str, Any]]:
    turns = (meta or {}).get("turns") or []
    return [t for t in turns if isinstance(t, dict) and t.get("role") == role]


def _env_messages(row: Any) -> list[list[dict[str, Any]]]:
    """The messages after each assistant message of `completion_messages`: [k] follows turn k."""
    messages = row.get("completion_messages")
    groups: list[list[dict[str, Any]]] = []
    try:
        for m in messages if messages is not None else ():
            if not isinstance(m, dict):
                continue
            if m.get("role") == "assistant":
                groups.append([])
            elif groups:
                groups[-1].append(m)
    except TypeError:
        return []
    return groups


_LABEL = "font-size:75%;font-weight:bold;color:#fff;border-radius:3px;padding:0 4px;margin-right:4px;white-space:nowrap"
_ROLE_COLOURS = {"assistant": "#3a8a5c", "tool": "#6a5acd", "user": "#777", "system": "#777", "env": "#777"}
# Each turn is a block with a coloured left edge: the boundary between turns is where a block ends.
_TURN = "border-left:3px solid {};padding-left:4px;margin:3px 0"
_ENV_TOKEN = "color:#666"
_ENV_BLOCK = "background:#ebebeb"  # distinct from JupyterLab's striped rows (#f5f5f5-ish)
_CLOSING = "color:#666;border:1px dashed #999;border-radius:3px"
_DRIFT = "outline:2px solid #c62828"
_DRIFT_MARK = "background:#c62828;color:#fff;font-weight:bold;font-size:75%;border-radius:2px;padding:0 3px;margin-right:1px"


def _label(text: str, role: str, title: str) -> str:
    return (f'<span style="{_LABEL};background:{_ROLE_COLOURS.get(role, "#777")}" '
            f'title="{html.escape(title)}">{html.escape(text)}</span>')


def _env_label(messages: list[dict[str, Any]], turn: dict[str, Any] | None) -> tuple[str, str]:
    """(the label, its role) of an environment turn: its messages' roles ("tool", "user", "tool ×2")."""
    roles = [str(m.get("role")) for m in messages]
    if not roles:
        role = "tool" if turn and turn.get("calls") else "env"
        return role, role
    role = roles[0] if len(set(roles)) == 1 else "env"
    text = role if len(roles) == 1 else (f"{role} ×{len(roles)}" if role != "env" else " + ".join(roles))
    return text, role


def _arguments_text(arguments: Any) -> str:
    if isinstance(arguments, dict):
        return ", ".join(f"{k}={json.dumps(v, ensure_ascii=False, default=str)}" for k, v in arguments.items())
    return json.dumps(arguments, ensure_ascii=False, default=str)


def _calls_html(turn: dict[str, Any] | None, messages: list[dict[str, Any]]) -> str:
    """The tool calls of an environment turn, each as `name(args) → result` (red when it failed),
    the whole call and result on hover."""
    calls = [c for c in (turn or {}).get("calls") or [] if isinstance(c, dict)]
    results = [str(m.get("content", "")) for m in messages if m.get("role") == "tool"]
    if not messages and len(calls) == 1 and isinstance((turn or {}).get("text"), str):
        results = [str((turn or {})["text"])]  # a reply not sent (the episode ended): the turn kept its text
    chips = []
    for k, call in enumerate(calls):
        status = str(call.get("status") or "ok")
        args = _arguments_text(call.get("arguments"))
        result = results[k] if len(results) == len(calls) else None
        if call.get("name") is None:  # a call the parser could not read: kept as data, with its parser
            shown, title = "unreadable call", f"a tool call the {call.get('parser') or 'tool-call'} parser could not read"
        else:
            shown, title = f"{call.get('name')}({clip_text(args, 60)})", f"tool call {call.get('name')}({args}): {status}"
        if status == "ok":
            shown += f" → {clip_text(result, 40)}" if result is not None else ""
            colour = "#3b2f8f;border:1px solid #6a5acd"
        else:
            shown += f" ✗ {status}"
            colour = f"#fff;background:{_FAILURE};border:1px solid {_FAILURE}"
        if call.get("error"):
            title += f"\n{clip_text(call.get('error'), 2000)}"
        if result is not None:
            title += f"\nresult: {clip_text(result, 2000)}"
        chips.append(f'<span style="color:{colour};border-radius:3px;padding:0 3px;margin-right:4px;font-size:90%" '
                     f'title="{html.escape(title)}">{html.escape(shown)}</span>')
    return "".join(chips)


def _drift_info(r: RolloutsView, i: int, row: Any, segs: Sequence[Segment] = ()) -> tuple[int, str] | None:
    """(the response position of the first divergence, the marker's title), None without drift."""
    cause = row.get("drift")
    position = row.get("drift_position")
    if not isinstance(cause, str) or cause == "same" or position is None or _int(position, -1) < 0:
        return None
    whole = _int(position)
    j = whole - int(row["prompt_tokens"])
    ids = [int(t) for t in r.tokens(i)["ids"]]
    lo, hi = max(j - 3, 0), min(j + 4, len(ids))
    window = ids[lo:hi] if j >= 0 else []
    pieces = token_pieces(r, window, None) or [f"id {t}" for t in window]
    shown = " ".join(f"[{p!r}]" if lo + k == j else repr(p) for k, p in enumerate(pieces))
    where = f"response token {j} (position {whole} of the ids)" if j >= 0 else f"position {whole}, in the prompt"
    seg = next((s for s in segs if s.start <= j < s.end), None)
    if seg is not None:
        closing = seg.kind == "env" and j < seg.start + seg.closing
        where += (f", in assistant {seg.turn + 1}" if seg.kind == "assistant" else
                  f", the closing EOS after assistant {seg.turn + 1}" if closing else
                  f", in the environment's message after assistant {seg.turn + 1}")
    title = (f"drift: {cause} — the first token where these ids differ from a trainer's re-render of the messages, "
             f"at {where}"
             + (f"\nthese ids: {shown}" if shown else "") + (" (the ids end here)" if j >= len(ids) else "")
             + "\nres.drift(i) shows both sides")
    return j, title


def _drift_mark(title: str) -> str:
    return f'<span style="{_DRIFT_MARK}" title="{html.escape(title)}">drift ▸</span>'


def _env_span(t: RowTokens, j: int, extra: str = "") -> str:
    piece = t.piece(j)
    title = (f"response token {j}: id {t.ids[j]}" + ("" if piece is None else f" {piece!r}")
             + " | environment (loss_mask 0: not sampled, not trained on)")
    style = ";".join(s for s in (_ENV_TOKEN, extra) if s)
    # A newline shows as "↵" without breaking the line: the environment's messages stay compact.
    body = token_body(t, j).replace("↵\n", "↵")
    return f'<span style="{style}" title="{html.escape(title)}">{body}</span>'


_ELIDED = -1  # in a plan: where a long environment message's middle is left out


def _plan(segs: list[Segment], cap: int | None, budget: int) -> tuple[list[tuple[Segment, list[int]]], int | None]:
    """Which tokens of each segment are drawn, in order: an environment run longer than `cap`
    keeps its first two thirds and last third (`_ELIDED` between), and at most `budget` tokens are
    drawn in all. Returns the segments with their positions, and where drawing stopped (None: the
    whole episode is drawn)."""
    out: list[tuple[Segment, list[int]]] = []
    left = budget
    for seg in segs:
        if left <= 0:
            return out, seg.start
        keep = list(range(seg.start, seg.end))
        if seg.kind == "env" and cap is not None and seg.end - seg.start - seg.closing > cap:
            body = keep[seg.closing:]
            head = cap * 2 // 3
            keep = [*keep[: seg.closing], *body[:head], _ELIDED, *body[len(body) - (cap - head):]]
        drawn = [j for j in keep if j != _ELIDED]
        if len(drawn) > left:
            last = drawn[left - 1]
            keep = keep[: keep.index(last) + 1]
            out.append((seg, keep))
            return out, last + 1
        out.append((seg, keep))
        left -= len(drawn)
    return out, None


def turns_html(r: RolloutsView, i: int, *, max_tokens: int, env_cap: int | None = 48, prompt_tail: bool = False,
               ended: bool | None = None) -> str:
    """Row i's trajectory as turns: each turn a block with a coloured left edge and a label
    ("assistant 1", "tool", "user"), the model's tokens coloured by logprob, the environment's grey
    (a message longer than `env_cap` tokens shows its first and last ones), the tool calls with
    their results, the drift marker, and how the episode ended (`ended`: always, never, or None:
    unless it is "done" without an error, which the table's status cell says). At most
    `max_tokens` tokens are drawn (the left-out middles of environment messages do not count); a
    note says what was left out."""
    row = r.df.iloc[i]
    tok = r.tokens(i)
    ids = [int(x) for x in tok["ids"]]
    total = len(ids)
    mask = tok["loss_mask"] if tok["loss_mask"] is not None else [True] * total
    meta = r.meta_info[i] if i < len(r.meta_info) else {}
    assistant, env = _turns_of(meta, "assistant"), _turns_of(meta, "env")

    def special(j: int) -> bool:
        piece = token_pieces(r, [ids[j]], None)
        return piece is not None and special_piece(piece[0])

    segs = segments(mask, tok["turn_ids"], assistant, special)
    plan, cut_at = _plan(segs, env_cap, max_tokens)
    drift = _drift_info(r, i, row, segs)
    drawn = [j for _, keep in plan for j in keep if j != _ELIDED]
    t = row_tokens(r, i, max_tokens=max(drawn) + 1 if drawn else 0)
    env_messages = _env_messages(row)

    def marked(j: int) -> tuple[str, str]:
        """(the drift mark before token j, the style that outlines it): empty unless j is the divergence."""
        return (_drift_mark(drift[1]), _DRIFT) if drift is not None and drift[0] == j else ("", "")

    # The prompt | response boundary (after the prompt's last tokens in the browser) opens the first turn.
    lead = (prompt_tail_html(r, i) if prompt_tail else BOUNDARY) + (
        _drift_mark(drift[1]) if drift is not None and drift[0] < 0 else "")
    blocks: list[str] = []
    shown_turns: set[int] = set()
    for seg, keep in plan:
        if seg.kind == "assistant":
            at = assistant[seg.turn] if seg.turn < len(assistant) else {}
            blocks.append(_assistant_block(seg, at, keep, t, marked, lead="" if blocks else lead))
            shown_turns.add(seg.turn)
            continue
        # An environment run: its closing EOS ends the assistant block above; the rest is a block.
        rest = keep
        if seg.closing and keep and keep[0] == seg.start and blocks:
            a = seg.start
            title = (f"response token {a}: id {t.ids[a]} | a closing EOS the environment appended (loss_mask 0): "
                     "the turn stopped without one (on length or a stop string)")
            mark, style = marked(a)
            closing = f'{mark}<span style="{_CLOSING}{";" + style if style else ""}" title="{html.escape(title)}">{token_body(t, a)}</span>'
            blocks[-1] = blocks[-1][: -len("</div>")] + closing + "</div>"
            rest = keep[1:]
        if not rest:
            continue
        hidden = seg.end - seg.start - seg.closing - (len(rest) - 1) if _ELIDED in rest else 0
        spans = []
        for j in rest:
            if j == _ELIDED:
                spans.append(f'<span style="color:#888;font-style:italic" title="res.tokens(i) and res.browse() have them all">'
                             f" … {hidden} environment tokens … </span>")
                continue
            mark, style = marked(j)
            spans.append(mark + _env_span(t, j, style))
        blocks.append(("" if blocks else lead) + _env_block(seg.turn, seg.end - seg.start - seg.closing, "".join(spans),
                                                            env_messages, env))
    if cut_at is None:
        blocks.extend(_env_after_blocks(env, env_messages, segs))
    else:
        turns_left = len({s.turn for s in segs if s.kind == "assistant" and s.end > cut_at} - shown_turns)
        note = f" … +{total - cut_at} tokens" + (f" ({turns_left} more assistant turn{'s' if turns_left != 1 else ''})" if turns_left else "")
        if drift is not None and drift[0] >= cut_at:
            note += " · the drift marker is in what is not shown"
        blocks.append(f'<div style="color:#888">{html.escape(note)}; res.browse() shows the whole episode</div>')
    if not total:
        blocks.append(f'{lead}<span style="color:#888">(empty)</span>')
    if ended or (ended is None and (row.get("status") != "done" or isinstance(row.get("error"), str))):
        blocks.append(_ended(row))
    return f'<div style="{TEXT_STYLE}">{"".join(blocks)}</div>'


def _assistant_block(seg: Segment, at: Mapping[str, Any], keep: Sequence[int], t: Any,
                     marked: Callable[[int], tuple[str, str]], *, lead: str) -> str:
    """One assistant turn's block: its label (with the turn's finish, mean logprob and latency in
    the title) and its sampled tokens coloured by logprob; `lead` opens it (the first block)."""
    title = (f"assistant turn {seg.turn + 1} (turn_ids {seg.turn}): {seg.end - seg.start} sampled tokens (loss_mask 1)"
             + (f", finish {at.get('finish_reason')}" if at.get("finish_reason") else "")
             + (f", mean logprob {fmt_value(at.get('logprob_mean'))}" if at.get("logprob_mean") is not None else "")
             + (f", {float(at['latency_s']):.2f} s" if at.get("latency_s") is not None else ""))
    spans = [_label(f"assistant {seg.turn + 1}", "assistant", title), lead]
    pad_note = " (the EOS that ended the turn: sampled, loss_mask 1)"
    for j in keep:
        mark, style = marked(j)
        spans.append(mark + token_span(t, j, pad_note=pad_note, extra_style=style))
    return f'<div style="{_TURN.format(_ROLE_COLOURS["assistant"])}">{"".join(spans)}</div>'


def _env_block(turn: int, n_tokens: int, tokens_html: str, env_messages: list[list[dict[str, Any]]],
               env: list[dict[str, Any]]) -> str:
    messages = env_messages[turn] if turn < len(env_messages) else []
    meta = env[turn] if turn < len(env) else None
    text, role = _env_label(messages, meta)
    title = (f"after assistant turn {turn + 1}: the environment's message" + ("s" if len(messages) != 1 else "")
             + f" ({n_tokens} tokens, loss_mask 0: not sampled, not trained on)")
    head = _label(text, role, title) + _calls_html(meta, messages) + _step_reward_html(meta)
    return f'<div style="{_TURN.format(_ROLE_COLOURS.get(role, "#777"))};{_ENV_BLOCK}">{head}{tokens_html}</div>'


def _env_after_blocks(env: list[dict[str, Any]], env_messages: list[list[dict[str, Any]]], segs: list[Segment]) -> list[str]:
    """The environment turns that sent no tokens: their tool calls, a message not sent because the
    episode ended."""
    out = []
    sent = {s.turn for s in segs if s.kind == "env" and s.end - s.start > s.closing}
    for k, turn in enumerate(env):
        if k in sent or not (turn.get("calls") or turn.get("text") or turn.get("status")
                             or turn.get("reward") is not None):
            continue
        messages = env_messages[k] if k < len(env_messages) else []
        text, role = _env_label(messages, turn)
        calls = _calls_html(turn, messages)
        said = turn.get("text") if not turn.get("calls") else None  # a tool's result is in its call
        said_html = f'<span style="color:#666">{html.escape(clip_text(said, 300))}</span>' if said else ""
        title = (f"after assistant turn {k + 1}: the environment's reply, not sent to the model (no tokens): "
                 "the episode ended")
        out.append(f'<div style="{_TURN.format(_ROLE_COLOURS.get(role, "#777"))};{_ENV_BLOCK}">'
                   f'{_label(f"{text} · not sent", role, title)}{calls}{_step_reward_html(turn)}{said_html}</div>')
    return out


def _step_reward_html(turn: dict[str, Any] | None) -> str:
    """An environment step's own reward (SkyRL's step, a verl tool's), when it gave one."""
    reward = (turn or {}).get("reward")
    if reward is None:
        return ""
    return (f'<span style="color:#555;border:1px solid #bbb;border-radius:3px;padding:0 3px;margin-right:4px;'
            f'font-size:90%" title="the environment\'s reward for this step">step reward {float(reward):.3g}</span>')


def _ended(row: Any) -> str:
    """How the episode ended: its status, and the error."""
    error = row.get("error")
    tail = f' <span style="color:#666">{html.escape(clip_text(error, 160))}</span>' if isinstance(error, str) and error else ""
    return (f'<div style="margin-top:2px;font-size:90%"><span style="color:#888">ended: </span>'
            f'{status_html(row.get("status"), error)}{tail}</div>')
