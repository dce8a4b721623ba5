"""Notebook and terminal display of results: how a Rollouts and an Engine look.

Owns: the one-line text summary and the HTML view of a `Rollouts` (a row per sample, the prompt
once per group, the completion as a per-token logprob heatmap after the prompt's last tokens; for
episodes a row per episode drawn as turns by `_episode_html`), the header line and its notes
(masking, the run record), the shared stylesheet (`VIEW_STYLE`), and a small HTML card for an
Engine. The token-level pieces are `_token_html`'s (re-exported here for rlgen's other views).
Knows nothing about generation, HTTP, processes or progress (`core._progress`): it reads a
`Rollouts` (CPU data only, so a repr never touches a GPU) or an Engine's plain attributes.
"""

from __future__ import annotations

import html
import math
from typing import TYPE_CHECKING, Any

from ..core._columns import EPISODE_COLUMNS, VERSION_COLUMNS, adapter_of, reward_output_columns
from ._episode_html import episode_cell, episodes_line, episodes_mask_note, episodes_repr, is_episodes, turns_html
from ._token_html import (
    CELL_STYLE,
    LINE_STYLE,
    TABLE_STYLE,
    TEXT_STYLE,
    alternative_texts,
    clip_text,
    completion_html,
    fmt_value,
    legend_html,
    logprob_color,
    piece_html,
    prompt_tail_html,
    shape_text,
    token_pieces,
    version_legend_html,
)

if TYPE_CHECKING:
    from ._protocol import RolloutsView

__all__ = [
    "COLORS",
    "RETOKENIZED_NOTE",
    "VIEW_STYLE",
    "HTMLView",
    "adapter_html",
    "adapter_name",
    "alternative_texts",
    "clip_text",
    "completion_html",
    "engine_html",
    "last_user_message",
    "logprob_color",
    "piece_html",
    "record_note",
    "rollouts_html",
    "short_repr",
    "token_pieces",
]

# What the view says of rows imported from a framework's text-only log (`RolloutLog.from_trl`, ...).
RETOKENIZED_NOTE = ("re-tokenized from text: these rows come from a training framework's text-only log, so their "
                    "token ids were made from the text by a tokenizer, not sampled by the model; they have no "
                    "logprobs, and token boundaries may differ from what the model saw")


# What the tokens of the HTML view can be coloured by (`Rollouts.view(color=...)`).
COLORS = ("logprob", "version")


class HTMLView:
    """An HTML view a notebook shows (`_repr_html_`); `html` is the markup itself."""

    def __init__(self, markup: str, text: str) -> None:
        self.html, self._text = markup, text

    def _repr_html_(self) -> str:
        return self.html

    def __repr__(self) -> str:
        return self._text


# ----------------------------------------------------------------------------------------------
# text summary


def _finish_counts(r: RolloutsView) -> list[tuple[str, int]]:
    counts = r.df["finish_reason"].value_counts(sort=False)
    return sorted(((str(k), int(v)) for k, v in counts.items()), key=lambda kv: (-kv[1], kv[0]))


def short_repr(r: RolloutsView) -> str:
    """`<Rollouts 16 rows (4 prompts x 4) | 812 tokens | finish: length 12, stop 4 | model=m>`, then
    `| adapters: policy 8, base model 8` when rows used LoRA adapters; episodes say theirs
    (`_episode_html.episodes_repr`)."""
    if is_episodes(r):
        return episodes_repr(r)
    parts = [shape_text(r, noun="row"), f"{r.n_tokens} tokens"]
    finish = _finish_counts(r)
    if finish:
        parts.append("finish: " + ", ".join(f"{k} {v}" for k, v in finish))
    if r.model:
        parts.append(f"model={r.model}")
    adapters = _adapter_counts(r)
    if adapters:
        parts.append("adapters: " + ", ".join(f"{k} {v}" for k, v in adapters))
    return f"<Rollouts {' | '.join(parts)}>"


def _adapter_counts(r: RolloutsView) -> list[tuple[str, int]]:
    """Rows per LoRA adapter ("base model" for base rows), most rows first; [] when no row used one."""
    if "adapter" not in r.df.columns:
        return []
    counts: dict[str, int] = {}
    for value, count in r.df["adapter"].value_counts(dropna=False, sort=False).items():
        name = adapter_of(value) or "base model"  # None and NaN both mean the base model
        counts[name] = counts.get(name, 0) + int(count)
    if list(counts) in ([], ["base model"]):
        return []
    return sorted(counts.items(), key=lambda kv: -kv[1])


# ----------------------------------------------------------------------------------------------
# HTML table with a logprob heatmap


# Percent of the table per column; the completion takes the rest (never under half).
_WIDTHS = {"prompt": 16, "sample": 10, "episode": 10, "reward": 11, "data": 13}  # the completion gets the rest (>= 50%)


def _finish_cell(row: Any) -> str:
    """The finish reason, coloured, with what it means on hover (stop ⟨2⟩: stopped at token id 2)."""
    reason = str(row["finish_reason"])
    text = reason
    title = {"stop": "stop: the model ended the response", "length": "length: cut at max_new_tokens",
             "abort": "abort: the request was aborted", "error": "error: the request failed"}.get(reason, reason)
    matched = row["matched_stop"]
    if matched is not None and not (isinstance(matched, float) and math.isnan(matched)):
        if isinstance(matched, (int, float)):
            text += f" ⟨{int(matched)}⟩"
            title = f"stop: stopped at token id {int(matched)} (a stop token, e.g. the EOS)"
        else:
            text += f" {matched!r}"
            title = f"stop: stopped at the stop string {matched!r}"
    err = row.get("error")
    if isinstance(err, str) and err:
        text += f": {clip_text(err, 80)}"
        title += f": {clip_text(err, 2000)}"
    colour = {"stop": "#2a7", "length": "#c80", "abort": "#c33", "error": "#c33"}.get(reason, "#888")
    return f'<span style="color:{colour}" title="{html.escape(title)}">{html.escape(text)}</span>'


def last_user_message(row: Any) -> str | None:
    """The last user turn of a chat prompt (the part a reader wants), None for a plain prompt."""
    messages = row.get("prompt_messages")
    if not isinstance(messages, (list, tuple)) and not hasattr(messages, "__len__"):
        return None
    try:
        users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    except TypeError:
        return None
    return str(users[-1].get("content", "")) if users else None


def _prompt_cell(r: RolloutsView, pos: int, row: Any, *, max_chars: int) -> str:
    """The last user message (or the prompt's end), the full prompt one click away, then the
    prompt's last tokens before the response (once per group: every sample shares them)."""
    prompt = row["prompt"]
    full = prompt if isinstance(prompt, str) else f"({int(row['prompt_tokens'])} prompt tokens, given as ids)"
    short = last_user_message(row)
    shown = clip_text(short, max_chars) if short is not None else clip_text(full, max_chars, tail=True)
    label = f'<span style="color:#888">prompt {row["prompt_index"]}</span> '
    tail = prompt_tail_html(r, pos)
    tail_html = (f'<div style="color:#888;font-size:85%;margin-top:2px" title="the prompt\'s last tokens; '
                 f'each response starts after │">ends {tail}</div>') if tail else ""
    style = f'class="rlgen-prompt" style="{TEXT_STYLE}"'
    if shown == full:
        return f"<div {style}>{label}{html.escape(shown)}{tail_html}</div>"
    return (
        f'<div {style}>{label}{html.escape(shown)}<details><summary style="color:#888;cursor:pointer">'
        f'full prompt ({len(full):,} chars)</summary><div style="white-space:pre-wrap;color:#444">'
        f"{html.escape(clip_text(full, 20_000, tail=True))}</div></details>{tail_html}</div>"
    )


def adapter_name(row: Any) -> str | None:
    """The LoRA adapter a row was sampled with; None for the base model (the `adapter` column is
    missing, None or NaN: pandas reads a base row's None as NaN)."""
    return adapter_of(row.get("adapter"))


def adapter_html(row: Any) -> str:
    """The row's adapter, "LoRA <name>", or a grey "base model"; "" for a result without an `adapter`
    column (a server that serves no adapters). "LoRA", not "adapter": the sample column is narrow
    (~95 px in JupyterLab beside the file browser), and "LoRA policy" stays on one line there; the
    name is whole (it wraps, never cut: names often differ only at their end)."""
    if "adapter" not in row.index:
        return ""
    name = adapter_name(row)
    if name is None:
        return '<span style="color:#888" title="sampled with the base model (adapter column: None)">base model</span>'
    return (f'<span title="sampled with the LoRA adapter {html.escape(repr(name))} (the adapter column)">'
            f'<span style="color:#888">LoRA</span> {html.escape(name)}</span>')


def _sample_cell(row: Any) -> str:
    """Sample index and row id, finish reason, completion tokens and mean logprob, one a line; then
    the LoRA adapter it was sampled with ("base model") where the result has an `adapter` column."""
    lines = [
        f'<span title="sample {row["sample_index"]} of its prompt; row_id {int(row["row_id"])}">'
        f'#{row["sample_index"]} <span style="color:#888">row {int(row["row_id"])}</span></span>',
        _finish_cell(row),
        f'<span title="{row["completion_tokens"]} completion tokens after {int(row["prompt_tokens"])} prompt tokens">'
        f'{row["completion_tokens"]} tok</span>',
        f'<span title="mean logprob of the response tokens" style="color:#555">lp {html.escape(fmt_value(row["logprob_mean"]))}</span>',
    ]
    adapter = adapter_html(row)
    if adapter:
        lines.append(adapter)
    return "".join(f"<div>{line}</div>" for line in lines)


_REWARD_NAME_CHARS = 8  # a reward function's name in the reward column, at most (its value follows)


def _reward_cell(row: Any, columns: list[str]) -> str:
    """Each reward function's value, then `reward` and `advantage`, one a line."""
    lines = []
    for c in columns:
        name = {"advantage": "adv"}.get(c, c.removeprefix("reward_") if c != "reward" else c)
        # A long function name is shortened so its value stays in view (the full name on hover).
        short = name if len(name) <= _REWARD_NAME_CHARS else name[:_REWARD_NAME_CHARS - 1] + "…"
        weight = "font-weight:bold;" if c == "reward" else ""
        lines.append(f'<div title="{html.escape(c)}" style="{weight}white-space:nowrap;overflow:hidden">'
                     f'<span style="color:#888">{html.escape(short)}</span> {html.escape(fmt_value(row[c], 12))}</div>')
    return "".join(lines)


def _data_text(value: Any) -> str:
    """A data value as one line of text: JSON for nested values (dicts, lists, arrays)."""
    import json

    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        value = value.tolist()
    if isinstance(value, (dict, list, tuple)):
        try:
            return json.dumps(value, ensure_ascii=False, default=str)
        except (TypeError, ValueError):
            return str(value)
    if isinstance(value, float):
        return fmt_value(value)
    return "" if value is None else str(value)


_DATA_CHARS = 48


def _data_cell(row: Any, columns: list[str]) -> str:
    """Each data column as "name value", shortened to a line or two; the full value on hover."""
    lines = []
    for c in columns:
        text = _data_text(row[c])
        short = clip_text(text.replace("\n", " "), _DATA_CHARS)
        title = f' title="{html.escape(c)}: {html.escape(clip_text(text, 4000))}"' if short != text else ""
        lines.append(f'<div{title}><span style="color:#888">{html.escape(c)}</span> {html.escape(short)}</div>')
    return "".join(lines)


# Reward detail columns live in res.df; the view shows each reward's value, `reward`, `advantage`.
_HIDDEN_SUFFIXES = ("_status", "_error", "_traceback", "_seconds")
_HIDDEN = ("prompt_messages", "group_mean", "group_std", "group_zero_std", "reward", "advantage")
_MAX_DATA_COLUMNS = 4


def _repeats_prompt(df: Any, column: str) -> bool:
    """Whether a data column only repeats the prompt: on every row equal to the prompt text or to
    the last user message (a dataset's `question` that the prompt was built from)."""
    if not len(df):
        return False
    values = df[column].tolist()
    if not all(isinstance(v, str) for v in values):
        return False
    for (_, row), value in zip(df.iterrows(), values):
        text = value.strip()
        prompt = row["prompt"]
        if isinstance(prompt, str) and text == prompt.strip():
            continue
        user = last_user_message(row)
        if user is None or text != user.strip():
            return False
    return True


def _spans_versions(df: Any) -> bool:
    """Whether the version columns say something: some row's tokens were sampled by more than one
    version, or are stale. Else (a call no weight update touched) they stay in the df, out of the view."""
    if "version_min" not in df.columns:
        return False
    stale = df["staleness"].gt(0).any() if "staleness" in df.columns else False
    return bool(df["version_max"].gt(df["version_min"]).any() or stale)


def _view_columns(r: RolloutsView) -> tuple[list[str], list[str], list[str], list[str]]:
    """(reward columns, data columns shown, data columns left out, data columns that repeat the prompt)."""
    written = set(reward_output_columns(r.df.columns))  # a verl `reward_model` column is data
    # An episode's own columns are in its cells; a sample's adapter is in its sample cell.
    hidden = (*_HIDDEN, *EPISODE_COLUMNS) if is_episodes(r) else (*_HIDDEN, "adapter")
    if not _spans_versions(r.df):
        hidden = (*hidden, *VERSION_COLUMNS)
    extra = [c for c in r.extra_columns if c not in hidden and not c.endswith(_HIDDEN_SUFFIXES)]
    rewards = [c for c in extra if c in written]
    rest = [c for c in extra if c not in written]
    repeats = [c for c in rest if _repeats_prompt(r.df, c)]
    rest = [c for c in rest if c not in repeats]
    rewards += [c for c in ("reward", "advantage") if c in r.df.columns]
    return rewards, rest[:_MAX_DATA_COLUMNS], rest[_MAX_DATA_COLUMNS:], repeats


def _groups(df: Any) -> list[int]:
    """For each row, how many rows its prompt cell spans: k on a group's first row, 0 after it."""
    keys = list(zip(df["run"].tolist(), df["prompt_index"].tolist()))
    spans = [0] * len(keys)
    start = 0
    for k in range(1, len(keys) + 1):
        if k == len(keys) or keys[k] != keys[start]:
            spans[start] = k - start
            start = k
    return spans


def _mask_note(r: RolloutsView, shown: Any) -> tuple[str, str]:
    """(a label for the header line, the note on what the colours cover): the label warns of the
    pad = EOS trap when a shown response ends with the pad id."""
    text = ("Coloured tokens are the response: response_ids where response_mask is 1 (the EOS included); "
            "the dashed grey tokens before │ are the prompt's last tokens.")
    last_ids = (r.tokens(i)["ids"][-1:] for i in range(len(shown)))
    ends = sum(1 for last in last_ids if len(last) and int(last[0]) == r.pad_token_id)
    label = '<span style="color:#888">masking</span>'
    if ends:
        text += (f" The pad id {r.pad_token_id} is also the last token of {ends} shown response{'s' if ends != 1 else ''}"
                 f" (this model's EOS): mask with response_mask, not response_ids != {r.pad_token_id}, or the EOS is dropped.")
        label = f'<span style="color:#b60">⚠ pad id {r.pad_token_id} = EOS: mask with response_mask</span>'
    return label, f'<div style="color:#666;white-space:normal">{html.escape(text)}</div>'


def _provenance(rec: dict[str, Any]) -> str:
    parts = [f"{rec.get('backend')} server {rec.get('server_version')}"]
    parts.append(_weights_part(rec))
    if rec.get("adapters"):
        parts.append(_adapters_part(rec["adapters"]))
    parts.append("weight version " + ", ".join(map(str, rec.get("weight_versions") or ["?"])))
    if rec.get("seed") is not None:
        parts.append(f"seed {rec['seed']}")
    # "T" -> " " before " UTC" is added (else it reads "U C").
    parts.append(str(rec.get("started_utc", "")).replace("T", " ").replace("+00:00", " UTC"))
    if rec.get("gpu"):
        parts.append(str(rec["gpu"]))
    cache = rec.get("cache")
    if cache:
        total = cache["hits"] + cache["sent"]
        parts.append(f"{cache['hits']} of {total} prompts from the completion cache")
    return " · ".join(parts)


def _weights_part(rec: dict[str, Any]) -> str:
    """Where the served weights came from: a checkout's digest; weights pushed from the notebook's
    tensors (`Engine.update_weights`: the record's `weights_path` is None, they are on no disk); or
    a checkout this machine cannot read (a remote server's path)."""
    digest = rec.get("weights_sha256")
    if digest:
        return f"weights sha256 {digest[:12]}"
    if "weights_path" in rec and rec["weights_path"] is None:
        return "weights pushed from the notebook's tensors (update_weights; on no disk, not hashed)"
    return "weights not hashed (not on this machine)"


def _adapters_part(adapters: Any) -> str:
    """The LoRA adapters the rows used (the record's `adapters`: name -> source, rank, sha256,
    load), e.g. "adapters policy (rank 8, from tensors, sha256 4ee09cecc3f2, load 3)"."""
    if not isinstance(adapters, dict):
        return f"adapters {clip_text(adapters, 200)}"
    described = []
    for name, about in adapters.items():
        if not isinstance(about, dict):
            described.append(f"{name} (not loaded by this Engine)")
            continue
        source = about.get("source")
        details = [f"rank {about['rank']}" if about.get("rank") is not None else "loaded by the server at start",
                   "from tensors" if source == "tensors" else f"from {clip_text(source, 60, tail=True)}",
                   f"sha256 {str(about['sha256'])[:12]}" if about.get("sha256") else "not hashed"]
        if about.get("load"):
            details.append(f"load {about['load']}")
        described.append(f"{name} ({', '.join(details)})")
    return "adapters " + ", ".join(described)


def record_note(r: RolloutsView) -> str:
    """What made the result (`Rollouts.record`): server, weights, version, seed, time and cache
    hits on one grey line, then the whole record; "" when no run has one."""
    import json

    records = [rec for rec in r.run_records.values() if rec]
    if not records:
        return ""
    if len(r.run_records) > 1:
        line = f"{len(r.run_records)} runs, each with its record in res.run_records"
        full = json.dumps(r.run_records, indent=1, default=str)
    else:
        line = _provenance(records[0])
        full = json.dumps(records[0], indent=1, default=str)
    return (f'<div style="color:#666;white-space:normal">record: {html.escape(line)}</div>'
            f'<pre style="font-size:85%;max-height:240px;overflow:auto">{html.escape(full)}</pre>')


def _decode_note(r: RolloutsView) -> str:
    error = getattr(r.decode, "error", None)
    if not isinstance(error, str):
        return ""
    return f'<div style="color:#c80;font-size:90%">Token ids shown: {html.escape(error)}.</div>'


# Jupyter right-aligns and vertically centres table cells; token text reads left to right from
# the top. The inline styles win over JupyterLab's rules (trusted or not); this stylesheet repeats
# them for rlgen's other views (compare, ab) and other pages. JupyterLab's rule is
# `:not(.jp-RenderedMarkdown).jp-RenderedHTMLCommon td` (specificity 0,2,1);
# `.jp-RenderedHTMLCommon .rlgen-rollouts table td` (0,2,2) beats it wherever it applies.
_CELLS = "text-align:left; vertical-align:top; padding:2px 6px"
VIEW_STYLE = (
    "<style>"
    ".jp-RenderedHTMLCommon .rlgen-rollouts table td, .jp-RenderedHTMLCommon .rlgen-rollouts table th, "
    f".rlgen-rollouts table td, .rlgen-rollouts table th {{{_CELLS}}}"
    ".jp-RenderedHTMLCommon .rlgen-rollouts table, .rlgen-rollouts table {margin-left:0; margin-right:0; max-width:100%}"
    # Inside a widget (the browser) the text would inherit nowrap and a 28 px line height.
    ".rlgen-rollouts, .rlgen-browser {white-space:normal; line-height:1.4; max-width:100%}"
    ".rlgen-rollouts .rlgen-prompt {white-space:pre-wrap; overflow-wrap:break-word}"
    ".jp-RenderedHTMLCommon .rlgen-rollouts table td.rlgen-num, .rlgen-rollouts table td.rlgen-num {white-space:nowrap}"
    "</style>"
)


def rollouts_html(r: RolloutsView, *, max_rows: int = 20, max_tokens: int = 200, max_chars: int = 200,
                  lead: str = "", color: str = "logprob") -> str:
    """An HTML view of `r`: one header line, then the first `max_rows` rows, a row per sample.

    The header line: the one-line repr, the colour legend, and folded notes (masking, record).
    Each prompt group shows its prompt once (the last user message; the full prompt under "full
    prompt"; the prompt's last tokens), then per sample: sample index and row id, finish reason,
    completion tokens and mean logprob, and its LoRA adapter where the result has an `adapter`
    column ("base model" for base rows); the rewards and advantage when present; up to four data
    columns (shortened, full value on hover; a column that only repeats the prompt is left out);
    and the completion drawn token by token as real text (visible newlines, special tokens as grey
    tags), coloured by p = exp(logprob) on a log scale (hover: id, text, logprob, top-k
    alternatives with their texts). The table fills its output area's width, and the completion
    gets at least half of it. Tokens past `max_tokens` and prompt text past `max_chars` are cut.
    Episodes (a `status` and a `turns` column) get a row per episode: its status, turns and tool
    calls, and its trajectory drawn as turns (`_episode_html.turns_html`).
    All text is escaped; `lead` (already HTML) opens the header line. Every layout rule is an
    inline style, so the view keeps its layout in an untrusted notebook. `color="version"` colours
    each token by the weight version index that sampled it instead (its logprob stays on hover),
    with a legend of the versions shown.
    """
    df = r.df
    shown = df.head(max_rows)
    episodes = is_episodes(r)
    rewards, data, left_out, repeats = _view_columns(r)
    columns = ["prompt", "episode" if episodes else "sample", *(["reward"] if rewards else []), *(["data"] if data else [])]
    widths = [_WIDTHS[c] for c in columns]
    columns.append("turns" if episodes else "completion")
    widths.append(100 - sum(widths))
    spans = _groups(shown)
    td = f'<td style="{CELL_STYLE}"'
    rows_html = []
    for pos, (_, row) in enumerate(shown.iterrows()):
        cells = []
        if spans[pos]:
            cells.append(f'{td} rowspan="{spans[pos]}">{_prompt_cell(r, pos, row, max_chars=max_chars)}</td>')
        cells.append(f"{td}>{episode_cell(row) if episodes else _sample_cell(row)}</td>")
        if rewards:
            cells.append(f"{td}>{_reward_cell(row, rewards)}</td>")
        if data:
            cells.append(f"{td}>{_data_cell(row, data)}</td>")
        drawn = (turns_html(r, pos, max_tokens=max_tokens) if episodes
                 else completion_html(r, pos, max_tokens=max_tokens, prompt_tail=False, color=color))
        cells.append(f"{td}>{drawn}</td>")
        rows_html.append("<tr>" + "".join(cells) + "</tr>")
    cols = "".join(f'<col style="width:{w}%">' for w in widths)
    header = "".join(f'<th style="{CELL_STYLE}">{html.escape(h)}</th>' for h in columns)
    parts = [lead] if lead else []
    parts.extend(episodes_line(r) if episodes else [html.escape(short_repr(r)[1:-1])])
    if color == "version":
        parts.append(version_legend_html(_shown_versions(r, len(shown))))
    elif r.has_logprobs:
        parts.append(legend_html())
    notes = []
    if len(shown):
        label, note = episodes_mask_note(r, len(shown)) if episodes else _mask_note(r, shown)
        parts.append(label)
        notes.append(note)
    if "retokenized" in df.columns and df["retokenized"].fillna(False).astype(bool).any():
        parts.append('<span style="color:#b35a00">re-tokenized from text</span>')
        notes.append(f'<div style="{LINE_STYLE}">{html.escape(RETOKENIZED_NOTE)}</div>')
    record = record_note(r)
    if record:
        parts.append('<span style="color:#888">record</span>')
        notes.append(record)
    # One line; what the colours cover and the record open under it (a <details>: no script, and
    # it survives an untrusted notebook).
    line = " · ".join(parts)
    head = (f'<details style="font-family:monospace;font-size:90%;margin-bottom:4px;{LINE_STYLE}">'
            f'<summary style="cursor:pointer">{line}</summary>{"".join(notes)}</details>')
    foot = []
    if len(df) > max_rows:
        what = "episodes" if episodes else "rows"
        foot.append(f"showing {max_rows} of {len(df)} {what}; use res[i], res[a:b], res.where(...) or res.browse()")
    if repeats:
        foot.append(f"not shown: {', '.join(repeats)} (the same text as the prompt)")
    if left_out:
        foot.append("more columns in res.df: " + ", ".join(left_out))
    foot_html = "".join(f'<div style="color:#888">{html.escape(f)}</div>' for f in foot)
    return (
        f'<div class="rlgen-rollouts" style="{LINE_STYLE}">{VIEW_STYLE}{head}{_decode_note(r)}'
        f'<table style="{TABLE_STYLE}"><colgroup>{cols}</colgroup><thead><tr>{header}</tr></thead>'
        f"<tbody>{''.join(rows_html)}</tbody></table>{foot_html}</div>"
    )


def _shown_versions(r: RolloutsView, rows: int) -> list[int]:
    """The weight version indices of the first `rows` rows' tokens."""
    found: set[int] = set()
    for i in range(rows):
        versions = r.tokens(i).get("versions")
        if versions is not None:
            found.update(int(v) for v in set(versions.tolist()))
    return sorted(found)


_ENGINE_FIELDS = ("model", "backend", "url", "log_path", "context_length")


def engine_html(engine: Any) -> str:
    """A small HTML card for an Engine: its repr and a few attributes it already holds.

    Reads plain attributes only (never `engine.info`, which polls GPU memory): a repr does no I/O.
    """
    rows = []
    state = getattr(engine, "state", None)
    if state is not None:
        rows.append(("state", getattr(state, "value", state)))
    for name in _ENGINE_FIELDS:
        try:
            value = getattr(engine, name, None)
        except Exception:  # a property that fails must not break the repr
            value = None
        if value is not None:
            rows.append((name, value))
    body = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(clip_text(v, 200))}</td></tr>" for k, v in rows)
    return (
        f'<div class="rlgen-rollouts">{VIEW_STYLE}<div style="font-family:monospace">{html.escape(repr(engine))}</div>'
        f"<table>{body}</table></div>"
    )
