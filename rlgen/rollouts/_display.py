"""Notebook and terminal display of results: how a Rollouts and an Engine look.

Owns: the one-line text summary and the HTML view of a `Rollouts` (a row per sample, the prompt
once per group, the completion as a per-token logprob heatmap after the prompt's last tokens), the
token-level pieces the rollout browser reuses (`completion_html`, `token_pieces`,
`alternative_texts`), and a small HTML card for an Engine. Knows nothing about generation, HTTP,
processes or progress (`core._progress`): it reads a `Rollouts` (CPU data only, so a repr never touches
a GPU) or an Engine's plain attributes.
"""

from __future__ import annotations

import colorsys
import html
import math
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._protocol import RolloutsView

__all__ = [
    "VIEW_STYLE",
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


# ----------------------------------------------------------------------------------------------
# text summary


def _finish_counts(r: RolloutsView) -> list[tuple[str, int]]:
    counts = r.df["finish_reason"].value_counts(sort=False)
    return sorted(((str(k), int(v)) for k, v in counts.items()), key=lambda kv: (-kv[1], kv[0]))


def _shape_text(r: RolloutsView) -> str:
    n = len(r)
    per_prompt = r.df["prompt_index"].value_counts()
    text = f"{n} row{'s' if n != 1 else ''}"
    if len(per_prompt) and per_prompt.nunique() == 1:
        text += f" ({len(per_prompt)} prompt{'s' if len(per_prompt) != 1 else ''} x {int(per_prompt.iloc[0])})"
    elif len(per_prompt):
        text += f" ({len(per_prompt)} prompts)"
    return text


def short_repr(r: RolloutsView) -> str:
    """`<Rollouts 16 rows (4 prompts x 4) | 812 tokens | finish: length 12, stop 4 | model=m>`."""
    parts = [_shape_text(r), f"{r.n_tokens} tokens"]
    finish = _finish_counts(r)
    if finish:
        parts.append("finish: " + ", ".join(f"{k} {v}" for k, v in finish))
    if r.model:
        parts.append(f"model={r.model}")
    return f"<Rollouts {' | '.join(parts)}>"


# ----------------------------------------------------------------------------------------------
# HTML table with a logprob heatmap

# The colour scale is logarithmic in p: log10(p) from 0 (p = 1) down to -6 (p = 1e-6 and below), so
# p = 0.05 and p = 1e-6 look different. Light tones keep dark text readable in light and dark themes.
_LOG10_P_FLOOR = -6.0
_LEGEND_P = ((1.0, "1"), (0.1, "0.1"), (0.01, "0.01"), (1e-4, "1e-4"), (1e-6, "≤1e-6"))


def logprob_color(logprob: float) -> str:
    """Background colour for a token: green for p = exp(logprob) = 1, yellow, red for p <= 1e-6.

    Linear in log10(p), clamped to [-6, 0]; grey where the logprob is missing (None or NaN).
    """
    if logprob is None or math.isnan(logprob):
        return "#dddddd"
    log10_p = min(float(logprob), 0.0) / math.log(10)
    t = 1.0 - max(log10_p, _LOG10_P_FLOOR) / _LOG10_P_FLOOR  # 1 at p = 1, 0 at p <= 1e-6
    r, g, b = colorsys.hls_to_rgb(t / 3, 0.8, 0.75)
    return f"#{round(r * 255):02x}{round(g * 255):02x}{round(b * 255):02x}"


def _legend_html() -> str:
    """The colour scale as a row of swatches, one per decade-ish step of p."""
    swatches = "".join(
        f'<span style="background:{logprob_color(math.log(p))};color:#111;padding:0 5px">{html.escape(label)}</span>'
        for p, label in _LEGEND_P
    )
    return f'<span class="rlgen-legend" style="white-space:nowrap">p = {swatches}</span>'


def clip_text(value: Any, limit: int, *, tail: bool = False) -> str:
    text = "" if value is None else str(value)
    if len(text) <= limit:
        return text
    return "…" + text[-limit:] if tail else text[:limit] + "…"


def _fmt(value: Any, limit: int = 60) -> str:
    if isinstance(value, float):
        return "NaN" if math.isnan(value) else f"{value:.4g}"
    return clip_text(value, limit)


def _safe_decode(r: RolloutsView, ids: list[int]) -> list[str] | None:
    """`r.decode(ids)` if it gives one piece per id, else None: a repr must never raise."""
    if r.decode is None or not ids:
        return None
    try:
        decoded = [str(t) for t in r.decode(list(ids))]
    except Exception:
        return None
    return decoded if len(decoded) == len(ids) else None


def token_pieces(r: RolloutsView, ids: list[int], texts: list[str | None] | None) -> list[str] | None:
    """Per-token text: the server's token texts, else `r.decode(ids)`, else None (show ids)."""
    if texts is not None:
        return ["" if t is None else str(t) for t in texts]
    return _safe_decode(r, ids)


# Special tokens as text: "<|im_end|>", "<s>", "</s>", "<unk>", "<pad>", "<eos>", "<bos>".
_SPECIAL = re.compile(r"<\|[^\s|]{1,40}\|>|</?s>|<(?:unk|pad|eos|bos|mask)>")
_TAG_STYLE = "color:#555;border:1px solid #999;border-radius:3px;padding:0 2px;font-size:85%"


def piece_html(piece: str, token_id: int, pad_id: int | None) -> str:
    """A token's text as escaped HTML, with whitespace made visible where it would vanish.

    A newline shows as "↵" then a real line break, a tab as "⇥" then the tab, a token of only
    spaces as "·" per space; other spaces stay real spaces (so long lines wrap there). A special
    token is a grey tag. An empty piece (bytes of a character that a later token completes) is
    "▯"; an empty pad/EOS id (a server that gives special tokens no text) is the tag "⟨id⟩", so
    the EOS still shows where it sits. U+FFFD (undecodable bytes) also shows as "▯".
    """
    if _SPECIAL.fullmatch(piece) or (not piece and token_id == pad_id):
        return f'<span style="{_TAG_STYLE}">{html.escape(piece or f"⟨{token_id}⟩")}</span>'
    if not piece:
        return '<span style="color:#888">▯</span>'
    if piece.strip(" ") == "":
        return "·" * len(piece)
    text = piece.replace("\ufffd", "▯").replace("\r\n", "\n").replace("\n", "↵\n").replace("\t", "⇥\t")
    return html.escape(text)


def alternative_texts(r: RolloutsView, top_ids: Any) -> dict[int, str]:
    """Text of each top-k alternative id (decoded alone), for hover titles; {} without decode."""
    unique = sorted({int(a) for row in top_ids for a in row})
    texts: dict[int, str] = {}
    for a in unique:
        piece = _safe_decode(r, [a])
        if piece is None:
            return {}
        texts[a] = piece[0]
    return texts


# The prompt's last tokens drawn before the response: an off-by-one boundary shows here.
_PROMPT_TAIL = 3
_TAIL_STYLE = "color:#666;background:#f3f3f3;border:1px dashed #aaa;border-radius:3px"
_BOUNDARY = '<span title="prompt | response" style="color:#c33;font-weight:bold">│</span>'


def _prompt_tail_html(r: RolloutsView, i: int) -> str:
    """The prompt's last few tokens, grey and dashed (not part of the response), then "│"."""
    # One row's prompt only: the whole result's lists would cost O(rows) per drawn row.
    ids = [int(t) for t in r[[i]].id_lists("prompt")[0][-_PROMPT_TAIL:]] if len(r) else []
    if not ids:
        return ""
    pieces = _safe_decode(r, ids)
    spans = []
    for j, tid in enumerate(ids):
        body = f"{tid} " if pieces is None else piece_html(pieces[j], tid, None)
        title = f"prompt token, id {tid}" + ("" if pieces is None else f" {pieces[j]!r}")
        spans.append(f'<span style="{_TAIL_STYLE}" title="{html.escape(title)}">{body}</span>')
    return '<span style="color:#888">…</span>' + "".join(spans) + _BOUNDARY


def completion_html(r: RolloutsView, i: int, *, max_tokens: int) -> str:
    """Row i's response as a token heatmap after the prompt's last tokens (see rollouts_html)."""
    tok = r.tokens(i)
    ids = [int(t) for t in tok["ids"][:max_tokens]]
    texts = tok["texts"][:max_tokens] if tok["texts"] is not None else None
    pieces = token_pieces(r, ids, texts)
    pad_id = r.pad_token_id
    lps = tok["logprobs"]
    top_lp = tok["top_logprobs"][:max_tokens] if tok["top_logprobs"] is not None else None
    top_ids = tok["top_ids"][:max_tokens] if tok["top_ids"] is not None else None
    alt_texts = alternative_texts(r, top_ids) if top_ids is not None else {}
    spans = [_prompt_tail_html(r, i)]
    for j, tid in enumerate(ids):
        if pieces is None:  # no text at all: the ids themselves, the pad/EOS id as a tag
            body = f'<span style="{_TAG_STYLE}">{tid}</span> ' if tid == pad_id else f"{tid} "
        else:
            body = piece_html(pieces[j], tid, pad_id)
        title = f"response token {j}: id {tid}" if pieces is None else f"response token {j}: id {tid} {pieces[j]!r}"
        if tid == pad_id:
            title += f" (= pad id {pad_id}: response_mask keeps it; response_ids != {pad_id} would drop it)"
        style = ""
        if lps is not None:
            lp = float(lps[j])
            title += f" | logprob {lp:.4f} (p={math.exp(lp):.3g})" if not math.isnan(lp) else " | logprob n/a"
            style = f' style="background:{logprob_color(lp)}"'
        if top_lp is not None and top_ids is not None:
            alts = [
                f"{alt_texts[int(a)]!r} p={math.exp(float(b)):.3g}" if int(a) in alt_texts else f"id {int(a)} p={math.exp(float(b)):.3g}"
                for a, b in zip(top_ids[j], top_lp[j])
                if not math.isnan(b)
            ]
            if alts:
                title += "\ntop: " + ", ".join(alts)
        spans.append(f'<span{style} title="{html.escape(title)}">{body}</span>')
    more = len(tok["ids"]) - len(ids)
    if more > 0:
        spans.append(f'<span style="color:#888"> … +{more} tokens</span>')
    if not len(tok["ids"]):
        spans.append('<span style="color:#888">(empty)</span>')
    body = "".join(spans)
    # pre-wrap keeps the completion's own spaces and line breaks and wraps long lines at spaces;
    # break-word also breaks a long run without spaces, so nothing runs off the right edge.
    return (
        '<div style="white-space:pre-wrap;word-break:break-word;overflow-wrap:anywhere;color:#111;'
        f'line-height:1.5;text-align:left;min-width:12em">{body}</div>'
    )


def _finish_cell(row: Any) -> str:
    reason = str(row["finish_reason"])
    text = reason
    matched = row["matched_stop"]
    if matched is not None and not (isinstance(matched, float) and math.isnan(matched)):
        text += f" ⟨{matched}⟩" if isinstance(matched, (int, float)) else f" {matched!r}"
    err = row.get("error")
    if isinstance(err, str) and err:
        text += f": {clip_text(err, 80)}"
    colour = {"stop": "#2a7", "length": "#c80", "abort": "#c33", "error": "#c33"}.get(reason, "#888")
    return f'<span style="color:{colour}">{html.escape(text)}</span>'


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


def _prompt_cell(row: Any, *, max_chars: int) -> str:
    """The last user message (or the prompt's end), the full prompt one click away."""
    prompt = row["prompt"]
    full = prompt if isinstance(prompt, str) else f"({int(row['prompt_tokens'])} prompt tokens, given as ids)"
    short = last_user_message(row)
    shown = clip_text(short, max_chars) if short is not None else clip_text(full, max_chars, tail=True)
    label = f'<span style="color:#888">prompt {row["prompt_index"]}</span> '
    if shown == full:
        return f'<div class="rlgen-prompt">{label}{html.escape(shown)}</div>'
    return (
        f'<div class="rlgen-prompt">{label}{html.escape(shown)}<details><summary style="color:#888;cursor:pointer">'
        f'full prompt ({len(full):,} chars)</summary><div style="white-space:pre-wrap;color:#444">'
        f"{html.escape(clip_text(full, 20_000, tail=True))}</div></details></div>"
    )


# Reward detail columns live in res.df; the view shows each reward's value, `reward`, `advantage`.
_HIDDEN_SUFFIXES = ("_status", "_error", "_traceback", "_seconds")
_HIDDEN = ("prompt_messages", "group_mean", "group_std", "group_zero_std", "reward", "advantage")
_MAX_DATA_COLUMNS = 4


def _view_columns(r: RolloutsView) -> tuple[list[str], list[str]]:
    """(columns shown before the completion, columns left out) among the extra ones."""
    extra = [c for c in r.extra_columns if c not in _HIDDEN and not c.endswith(_HIDDEN_SUFFIXES)]
    rewards = [c for c in extra if c.startswith("reward_")]
    rest = [c for c in extra if not c.startswith("reward_")]
    shown = rewards + [c for c in ("reward", "advantage") if c in r.df.columns] + rest[:_MAX_DATA_COLUMNS]
    return shown, rest[_MAX_DATA_COLUMNS:]


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


def _mask_note(r: RolloutsView, shown: Any) -> str:
    """What the colours cover, and the pad = EOS trap when a shown response ends with the pad id."""
    text = ("Coloured tokens are the response: response_ids where response_mask is 1 (the EOS included); "
            "the dashed grey tokens before │ are the prompt's last tokens.")
    last_ids = (r.tokens(i)["ids"][-1:] for i in range(len(shown)))
    ends = sum(1 for last in last_ids if len(last) and int(last[0]) == r.pad_token_id)
    if ends:
        text += (f" The pad id {r.pad_token_id} is also the last token of {ends} shown response{'s' if ends != 1 else ''}"
                 f" (this model's EOS): mask with response_mask, not response_ids != {r.pad_token_id}, or the EOS is dropped.")
    return f'<div style="color:#666;font-size:90%;margin-bottom:4px">{html.escape(text)}</div>'


def record_note(r: RolloutsView) -> str:
    """One grey line on what made the result (`Rollouts.record`): server, weights, version, seed,
    time and cache hits, with the whole record under "record"; "" when no run has one."""
    import json

    records = [rec for rec in r.run_records.values() if rec]
    if not records:
        return ""
    if len(r.run_records) > 1:
        line = f"{len(r.run_records)} runs, each with its record in res.run_records"
        full = json.dumps(r.run_records, indent=1, default=str)
    else:
        rec = records[0]
        parts = [f"{rec.get('backend')} server {rec.get('server_version')}"]
        digest = rec.get("weights_sha256")
        parts.append(f"weights sha256 {digest[:12]}" if digest else "weights not hashed (not on this machine)")
        parts.append("weight version " + ", ".join(map(str, rec.get("weight_versions") or ["?"])))
        if rec.get("seed") is not None:
            parts.append(f"seed {rec['seed']}")
        parts.append(str(rec.get("started_utc", "")).replace("+00:00", " UTC").replace("T", " "))
        if rec.get("gpu"):
            parts.append(str(rec["gpu"]))
        cache = rec.get("cache")
        if cache:
            total = cache["hits"] + cache["sent"]
            parts.append(f"{cache['hits']} of {total} prompts from the completion cache")
        line = " · ".join(parts)
        full = json.dumps(rec, indent=1, default=str)
    return (f'<div style="color:#888;font-size:85%">{html.escape(line)} '
            f'<details style="display:inline"><summary style="display:inline;cursor:pointer">record</summary>'
            f'<pre style="font-size:85%;max-height:240px;overflow:auto">{html.escape(full)}</pre></details></div>')


def _decode_note(r: RolloutsView) -> str:
    error = getattr(r.decode, "error", None)
    if not isinstance(error, str):
        return ""
    return f'<div style="color:#c80;font-size:90%">Token ids shown: {html.escape(error)}.</div>'


# Jupyter right-aligns and vertically centres table cells; token text reads left to right from
# the top. JupyterLab's rule is `:not(.jp-RenderedMarkdown).jp-RenderedHTMLCommon td` (specificity
# 0,2,1); `.jp-RenderedHTMLCommon .rlgen-rollouts table td` (0,2,2) beats it wherever it applies,
# and `.rlgen-rollouts table td` (0,1,2) covers pages without JupyterLab's classes. Lab also
# centres tables (margin auto) in some contexts: rlgen's tables sit at the left. The prompt column
# is capped so the completion gets the width, and the table never exceeds its output area.
_CELLS = "text-align:left; vertical-align:top; padding:2px 6px"
VIEW_STYLE = (
    "<style>"
    ".jp-RenderedHTMLCommon .rlgen-rollouts table td, .jp-RenderedHTMLCommon .rlgen-rollouts table th, "
    f".rlgen-rollouts table td, .rlgen-rollouts table th {{{_CELLS}}}"
    ".jp-RenderedHTMLCommon .rlgen-rollouts table, .rlgen-rollouts table {margin-left:0; margin-right:0; max-width:100%}"
    # Inside a widget (the browser) the text would inherit nowrap and a 28 px line height.
    ".rlgen-rollouts, .rlgen-browser {white-space:normal; line-height:1.4; max-width:100%}"
    ".rlgen-rollouts .rlgen-prompt {max-width:18em; min-width:8em; white-space:pre-wrap; overflow-wrap:anywhere}"
    ".jp-RenderedHTMLCommon .rlgen-rollouts table td.rlgen-num, .rlgen-rollouts table td.rlgen-num {white-space:nowrap}"
    "</style>"
)


def rollouts_html(r: RolloutsView, *, max_rows: int = 20, max_tokens: int = 200, max_chars: int = 200) -> str:
    """An HTML view of `r`: a header line, then the first `max_rows` rows, a row per sample.

    Each prompt group shows its prompt once (the last user message; the full prompt under "full
    prompt"), then per sample: row id, sample index, finish reason, completion tokens, the rewards
    and advantage when present, a few data columns, and the completion drawn token by token as
    real text (visible newlines, special tokens as grey tags) after the prompt's last tokens,
    coloured by p = exp(logprob) on a log scale with a legend (hover: id, text, logprob, top-k
    alternatives with their texts). Tokens past `max_tokens` and prompt text past `max_chars` are
    cut. All text is escaped.
    """
    df = r.df
    shown = df.head(max_rows)
    columns, left_out = _view_columns(r)
    head = ["row", "prompt", "sample", "finish", "tokens", "mean lp", *columns, "completion"]
    spans = _groups(shown)
    rows_html = []
    for pos, (_, row) in enumerate(shown.iterrows()):
        num = ' class="rlgen-num"'
        cells = [f'<td{num} style="color:#888">{int(row["row_id"])}</td>']
        if spans[pos]:
            cells.append(f'<td rowspan="{spans[pos]}">{_prompt_cell(row, max_chars=max_chars)}</td>')
        cells += [
            f"<td{num}>{row['sample_index']}</td>",
            f"<td{num}>{_finish_cell(row)}</td>",
            f'<td{num} title="{int(row["prompt_tokens"])} prompt tokens">{row["completion_tokens"]}</td>',
            f"<td{num}>{_fmt(row['logprob_mean'])}</td>",
            *(f"<td{num}>{html.escape(_fmt(row[c], 24))}</td>" for c in columns),
            f"<td>{completion_html(r, pos, max_tokens=max_tokens)}</td>",
        ]
        rows_html.append("<tr>" + "".join(cells) + "</tr>")
    # Long column names may break after "_" (reward_exact_match), so they do not widen the table.
    header = "".join(f"<th>{html.escape(str(h)).replace('_', '_<wbr>')}</th>" for h in head)
    summary = html.escape(short_repr(r)[1:-1])
    if r.has_logprobs:
        summary += f" | colour (log scale): {_legend_html()} | hover a token for its id, logprob and top-k"
    foot = []
    if len(df) > max_rows:
        foot.append(f"showing {max_rows} of {len(df)} rows; use res[i], res[a:b], res.where(...) or res.browse()")
    if left_out:
        foot.append("more columns in res.df: " + ", ".join(left_out))
    foot_html = "".join(f'<div style="color:#888">{html.escape(f)}</div>' for f in foot)
    return (
        f'<div class="rlgen-rollouts">{VIEW_STYLE}<div style="font-family:monospace;margin-bottom:4px">{summary}</div>'
        f"{record_note(r)}{_mask_note(r, shown) if len(shown) else ''}{_decode_note(r)}"
        f"<table><thead><tr>{header}</tr></thead><tbody>{''.join(rows_html)}</tbody></table>{foot_html}</div>"
    )


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
