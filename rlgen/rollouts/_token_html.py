"""Token-level HTML: a response drawn token by token, coloured by logprob or by weight version, and the inline layout rules.

Owns: the logprob colour scale and its legend, the weight versions' colours and their legend
(`color="version"`: each token by the version index that sampled it), a token's text as HTML (visible whitespace, special
tokens as tags), per-token text (the server's, else decoded), top-k alternatives' texts, the
prompt's last tokens before the response boundary, one row's tokens ready to draw (`RowTokens`,
`token_span`), a single-turn response as a heatmap (`completion_html`), and the inline styles every
view's layout uses (they must survive JupyterLab's sanitizer in an untrusted notebook). Knows
nothing about tables, episodes, browsers or how a result is made: it reads a `RolloutsView`'s
tokens and decode.
"""

from __future__ import annotations

import colorsys
import html
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._protocol import RolloutsView

__all__ = [
    "BOUNDARY",
    "CELL_STYLE",
    "LINE_STYLE",
    "TABLE_STYLE",
    "TAG_STYLE",
    "TEXT_STYLE",
    "RowTokens",
    "alternative_texts",
    "clip_text",
    "completion_html",
    "fmt_value",
    "legend_html",
    "logprob_color",
    "piece_html",
    "prompt_tail_html",
    "row_tokens",
    "safe_decode",
    "shape_text",
    "special_piece",
    "token_body",
    "token_pieces",
    "token_span",
    "version_color",
    "version_legend_html",
]

# Layout that must survive an untrusted notebook. JupyterLab strips <style> from an untrusted
# output (one nbconvert executed, one a colleague sent) and keeps inline style= declarations whose
# property and value its sanitizer allows (apputils' sanitizer: e.g. overflow-wrap only
# normal|break-word, word-break only normal|keep-all|break-all). So everything the layout needs is
# inline, with such values only; `_display.VIEW_STYLE` only repeats it for other
# pages and for rlgen's other views.
CELL_STYLE = "text-align:left;vertical-align:top;padding:2px 6px;overflow-wrap:break-word"
TEXT_STYLE = "white-space:pre-wrap;overflow-wrap:break-word;color:#111;line-height:1.5;text-align:left"
# A fixed layout at 100%: the columns get the widths of the <col>s whatever their content, so the
# table fits its output area and the completion keeps at least half of it.
TABLE_STYLE = "table-layout:fixed;width:100%;max-width:100%;border-collapse:collapse;margin-left:0;margin-right:0"
LINE_STYLE = "white-space:normal;line-height:1.4;max-width:100%"


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


def legend_html() -> str:
    """The colour scale as a row of swatches, one per decade-ish step of p."""
    swatches = "".join(
        f'<span style="background:{logprob_color(math.log(p))};color:#111;padding:0 5px">{html.escape(label)}</span>'
        for p, label in _LEGEND_P
    )
    return f'<span class="rlgen-legend" style="white-space:nowrap">p = {swatches}</span>'


# Weight versions get light, well separated hues (cycled past eight versions); the newest version
# a result holds is not special: the colour names the index, the title says it.
_VERSION_HUES = (0.58, 0.08, 0.33, 0.83, 0.14, 0.47, 0.0, 0.7)


def version_color(version: int) -> str:
    """Background colour for a token sampled by weight version index `version`; grey where not known (-1)."""
    if version is None or int(version) < 0:
        return "#dddddd"
    r, g, b = colorsys.hls_to_rgb(_VERSION_HUES[int(version) % len(_VERSION_HUES)], 0.8, 0.7)
    return f"#{round(r * 255):02x}{round(g * 255):02x}{round(b * 255):02x}"


def version_legend_html(versions: Any) -> str:
    """The colour of each weight version present, as swatches ("version 0 1 2")."""
    present = sorted({int(v) for v in versions if int(v) >= 0})
    swatches = "".join(f'<span style="background:{version_color(v)};color:#111;padding:0 5px">{v}</span>'
                       for v in present)
    return f'<span class="rlgen-legend" style="white-space:nowrap">version {swatches or "n/a"}</span>'


def clip_text(value: Any, limit: int, *, tail: bool = False) -> str:
    text = "" if value is None else str(value)
    if len(text) <= limit:
        return text
    return "…" + text[-limit:] if tail else text[:limit] + "…"


def fmt_value(value: Any, limit: int = 60) -> str:
    if isinstance(value, float):
        return "NaN" if math.isnan(value) else f"{value:.4g}"
    return clip_text(value, limit)


def safe_decode(r: RolloutsView, ids: list[int]) -> list[str] | None:
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
    return safe_decode(r, ids)


# Special tokens as text: "<|im_end|>", "<s>", "</s>", "<unk>", "<pad>", "<eos>", "<bos>".
_SPECIAL = re.compile(r"<\|[^\s|]{1,40}\|>|</?s>|<(?:unk|pad|eos|bos|mask)>")
TAG_STYLE = "color:#555;border:1px solid #999;border-radius:3px;padding:0 2px;font-size:85%"


def special_piece(piece: str) -> bool:
    """Whether a token's text is a special token's ("<|im_end|>", "</s>", ...)."""
    return _SPECIAL.fullmatch(piece) is not None


def piece_html(piece: str, token_id: int, pad_id: int | None) -> str:
    """A token's text as escaped HTML, with whitespace made visible where it would vanish.

    A newline shows as "↵" then a real line break, a tab as "⇥" then the tab, a token of only
    spaces as "·" per space; other spaces stay real spaces (so long lines wrap there). A special
    token is a grey tag. An empty piece (bytes of a character that a later token completes) is
    "▯"; an empty pad/EOS id (a server that gives special tokens no text) is the tag "⟨id⟩", so
    the EOS still shows where it sits. U+FFFD (undecodable bytes) also shows as "▯".
    """
    if _SPECIAL.fullmatch(piece) or (not piece and token_id == pad_id):
        return f'<span style="{TAG_STYLE}">{html.escape(piece or f"⟨{token_id}⟩")}</span>'
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
        piece = safe_decode(r, [a])
        if piece is None:
            return {}
        texts[a] = piece[0]
    return texts


# The prompt's last tokens drawn before the response: an off-by-one boundary shows here.
_PROMPT_TAIL = 3
_TAIL_STYLE = "color:#666;background:#f3f3f3;border:1px dashed #aaa;border-radius:3px"
BOUNDARY = '<span title="prompt | response" style="color:#c33;font-weight:bold">│</span>'


def prompt_tail_html(r: RolloutsView, i: int) -> str:
    """The prompt's last few tokens, grey and dashed (not part of the response), then "│"."""
    # One row's prompt only: the whole result's lists would cost O(rows) per drawn row.
    ids = [int(t) for t in r[[i]].id_lists("prompt")[0][-_PROMPT_TAIL:]] if len(r) else []
    if not ids:
        return ""
    pieces = safe_decode(r, ids)
    spans = []
    for j, tid in enumerate(ids):
        body = f"{tid} " if pieces is None else piece_html(pieces[j], tid, None)
        title = f"prompt token, id {tid}" + ("" if pieces is None else f" {pieces[j]!r}")
        spans.append(f'<span style="{_TAIL_STYLE}" title="{html.escape(title)}">{body}</span>')
    return '<span style="color:#888">…</span>' + "".join(spans) + BOUNDARY


@dataclass
class RowTokens:
    """One row's response tokens cut at `max_tokens`, ready to draw: ids, text pieces (None: show
    ids), logprobs, top-k ids and logprobs with the alternatives' texts, an episode's `loss_mask`
    and `turn_ids` (None for single-turn rows), each token's weight version index (None where
    the result has none), and how many tokens the row has in all."""

    ids: list[int]
    pieces: list[str] | None
    logprobs: Any
    top_ids: Any
    top_logprobs: Any
    alt_texts: dict[int, str]
    loss_mask: Any
    turn_ids: Any
    total: int
    pad_id: int
    versions: Any = None

    def piece(self, j: int) -> str | None:
        return None if self.pieces is None else self.pieces[j]


def row_tokens(r: RolloutsView, i: int, *, max_tokens: int) -> RowTokens:
    """Row i's response tokens, the first `max_tokens` of them (see `RowTokens`)."""
    tok = r.tokens(i)
    ids = [int(t) for t in tok["ids"][:max_tokens]]
    texts = tok["texts"][:max_tokens] if tok["texts"] is not None else None
    top_ids = tok["top_ids"][:max_tokens] if tok["top_ids"] is not None else None

    def cut(name: str) -> Any:
        return tok[name][:max_tokens] if tok.get(name) is not None else None

    return RowTokens(ids=ids, pieces=token_pieces(r, ids, texts), logprobs=tok["logprobs"], top_ids=top_ids,
                     top_logprobs=cut("top_logprobs"), alt_texts=alternative_texts(r, top_ids) if top_ids is not None else {},
                     loss_mask=cut("loss_mask"), turn_ids=cut("turn_ids"), total=len(tok["ids"]), pad_id=r.pad_token_id,
                     versions=cut("versions"))


def token_body(t: RowTokens, j: int) -> str:
    """Token j's text as HTML (see `piece_html`); its id where there is no text."""
    tid, pad_id = t.ids[j], t.pad_id
    piece = t.piece(j)
    if piece is None:  # no text at all: the ids themselves, the pad/EOS id as a tag
        return f'<span style="{TAG_STYLE}">{tid}</span> ' if tid == pad_id else f"{tid} "
    return piece_html(piece, tid, pad_id)


def token_span(t: RowTokens, j: int, *, pad_note: str | None = None, extra_style: str = "", note: str = "",
               color: str = "logprob") -> str:
    """Token j as a span coloured by its logprob (`color="version"`: by the weight version that
    sampled it), with id, text, logprob, version and the top-k alternatives on hover. `pad_note`
    replaces what the title says of a pad id (default: the response_mask advice); `extra_style` is
    added to the style, `note` to the title's first line."""
    tid, pad_id = t.ids[j], t.pad_id
    piece = t.piece(j)
    title = f"response token {j}: id {tid}" if piece is None else f"response token {j}: id {tid} {piece!r}"
    if tid == pad_id:
        title += pad_note if pad_note is not None else (
            f" (= pad id {pad_id}: response_mask keeps it; response_ids != {pad_id} would drop it)")
    title += note
    style = ""
    if t.logprobs is not None:
        lp = float(t.logprobs[j])
        title += f" | logprob {lp:.4f} (p={math.exp(lp):.3g})" if not math.isnan(lp) else " | logprob n/a"
        style = f"background:{logprob_color(lp)}"
    if t.versions is not None:
        version = int(t.versions[j])
        title += f" | version {version}" if version >= 0 else " | version n/a"
        if color == "version":
            style = f"background:{version_color(version)}"
    if t.top_logprobs is not None and t.top_ids is not None:
        alts = [
            f"{t.alt_texts[int(a)]!r} p={math.exp(float(b)):.3g}" if int(a) in t.alt_texts else f"id {int(a)} p={math.exp(float(b)):.3g}"
            for a, b in zip(t.top_ids[j], t.top_logprobs[j])
            if not math.isnan(b)
        ]
        if alts:
            title += "\ntop: " + ", ".join(alts)
    style = ";".join(s for s in (style, extra_style) if s)
    style_attr = f' style="{style}"' if style else ""
    return f'<span{style_attr} title="{html.escape(title)}">{token_body(t, j)}</span>'


def completion_html(r: RolloutsView, i: int, *, max_tokens: int, prompt_tail: bool = True,
                    color: str = "logprob") -> str:
    """Row i's response as a token heatmap after the prompt's last tokens (see `_display.rollouts_html`).

    `prompt_tail=False` starts at the boundary mark alone: the table shows the tail once per
    prompt group, in the prompt's cell. `color`: "logprob" or "version" (see `token_span`)."""
    t = row_tokens(r, i, max_tokens=max_tokens)
    spans = [prompt_tail_html(r, i) if prompt_tail else BOUNDARY]
    spans += [token_span(t, j, color=color) for j in range(len(t.ids))]
    more = t.total - len(t.ids)
    if more > 0:
        spans.append(f'<span style="color:#888"> … +{more} tokens</span>')
    if not t.total:
        spans.append('<span style="color:#888">(empty)</span>')
    # pre-wrap keeps the completion's own spaces and line breaks and wraps long lines at spaces;
    # overflow-wrap:break-word also breaks a long run without spaces, so nothing runs off the right
    # edge (the values JupyterLab's sanitizer keeps in an untrusted notebook: see TEXT_STYLE).
    return f'<div style="{TEXT_STYLE}">{"".join(spans)}</div>'


def shape_text(r: RolloutsView, *, noun: str) -> str:
    """"8 rows (2 prompts x 4)", "6 episodes (3 prompts)": the count, and prompts x samples when even."""
    n = len(r)
    per_prompt = r.df["prompt_index"].value_counts()
    text = f"{n} {noun}{'s' if n != 1 else ''}"
    if len(per_prompt) and per_prompt.nunique() == 1:
        text += f" ({len(per_prompt)} prompt{'s' if len(per_prompt) != 1 else ''} x {int(per_prompt.iloc[0])})"
    elif len(per_prompt):
        text += f" ({len(per_prompt)} prompts)"
    return text

