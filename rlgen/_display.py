"""Notebook and terminal display: how results and progress look.

Owns: the one-line text summary and the HTML table (with a per-token logprob heatmap) of a
`Rollouts`, a small HTML card for an Engine, the progress-bar selection layer (tqdm.auto:
widgets in notebooks, text elsewhere), and `PhaseLine`, the single status line shown while a
server starts. Knows nothing about generation, HTTP or processes: it reads a `Rollouts` (CPU data
only, so a repr never touches a GPU) or an Engine's plain attributes, or is told what to show.
"""

from __future__ import annotations

import colorsys
import html
import math
import os
import re
import shutil
import sys
import time
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from tqdm.std import tqdm as Tqdm

    from ._results import Rollouts

__all__ = [
    "PhaseLine",
    "engine_html",
    "in_notebook",
    "logprob_color",
    "progress_bar",
    "progress_enabled",
    "rollouts_html",
    "short_repr",
]


# ----------------------------------------------------------------------------------------------
# text summary


def _finish_counts(r: Rollouts) -> list[tuple[str, int]]:
    counts = r.df["finish_reason"].value_counts(sort=False)
    return sorted(((str(k), int(v)) for k, v in counts.items()), key=lambda kv: (-kv[1], kv[0]))


def _shape_text(r: Rollouts) -> str:
    n = len(r)
    per_prompt = r.df["prompt_index"].value_counts()
    text = f"{n} row{'s' if n != 1 else ''}"
    if len(per_prompt) and per_prompt.nunique() == 1:
        text += f" ({len(per_prompt)} prompt{'s' if len(per_prompt) != 1 else ''} x {int(per_prompt.iloc[0])})"
    elif len(per_prompt):
        text += f" ({len(per_prompt)} prompts)"
    return text


def short_repr(r: Rollouts) -> str:
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


def _clip(value: Any, limit: int, *, tail: bool = False) -> str:
    text = "" if value is None else str(value)
    if len(text) <= limit:
        return text
    return "…" + text[-limit:] if tail else text[:limit] + "…"


def _fmt(value: Any, limit: int = 60) -> str:
    if isinstance(value, float):
        return "NaN" if math.isnan(value) else f"{value:.4g}"
    return _clip(value, limit)


def _safe_decode(r: Rollouts, ids: list[int]) -> list[str] | None:
    """`r.decode(ids)` if it gives one piece per id, else None: a repr must never raise."""
    if r.decode is None or not ids:
        return None
    try:
        decoded = [str(t) for t in r.decode(list(ids))]
    except Exception:
        return None
    return decoded if len(decoded) == len(ids) else None


def _token_pieces(r: Rollouts, ids: list[int], texts: list[str | None] | None) -> list[str] | None:
    """Per-token text: the server's token texts, else `r.decode(ids)`, else None (show ids)."""
    if texts is not None:
        return ["" if t is None else str(t) for t in texts]
    return _safe_decode(r, ids)


# Special tokens as text: "<|im_end|>", "<s>", "</s>", "<unk>", "<pad>", "<eos>", "<bos>".
_SPECIAL = re.compile(r"<\|[^\s|]{1,40}\|>|</?s>|<(?:unk|pad|eos|bos|mask)>")
_TAG_STYLE = "color:#555;border:1px solid #999;border-radius:3px;padding:0 2px;font-size:85%"


def _piece_html(piece: str, token_id: int, pad_id: int | None) -> str:
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


def _alternatives(r: Rollouts, top_ids: Any) -> dict[int, str]:
    """Text of each top-k alternative id (decoded alone), for hover titles; {} without decode."""
    unique = sorted({int(a) for row in top_ids for a in row})
    texts: dict[int, str] = {}
    for a in unique:
        piece = _safe_decode(r, [a])
        if piece is None:
            return {}
        texts[a] = piece[0]
    return texts


def _completion_cell(r: Rollouts, i: int, *, max_tokens: int) -> str:
    tok = r.tokens(i)
    ids = [int(t) for t in tok["ids"][:max_tokens]]
    texts = tok["texts"][:max_tokens] if tok["texts"] is not None else None
    pieces = _token_pieces(r, ids, texts)
    pad_id = r.pad_token_id
    lps = tok["logprobs"]
    top_lp = tok["top_logprobs"][:max_tokens] if tok["top_logprobs"] is not None else None
    top_ids = tok["top_ids"][:max_tokens] if tok["top_ids"] is not None else None
    alt_texts = _alternatives(r, top_ids) if top_ids is not None else {}
    spans = []
    for j, tid in enumerate(ids):
        if pieces is None:  # no text at all: the ids themselves, the pad/EOS id as a tag
            body = f'<span style="{_TAG_STYLE}">{tid}</span> ' if tid == pad_id else f"{tid} "
        else:
            body = _piece_html(pieces[j], tid, pad_id)
        title = f"id {tid}" if pieces is None else f"id {tid} {pieces[j]!r}"
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
        f'line-height:1.5;text-align:left;min-width:16em">{body}</div>'
    )


def _finish_cell(row: Any) -> str:
    reason = str(row["finish_reason"])
    text = reason
    matched = row["matched_stop"]
    if matched is not None and not (isinstance(matched, float) and math.isnan(matched)):
        text += f" ⟨{matched}⟩" if isinstance(matched, (int, float)) else f" {matched!r}"
    err = row.get("error")
    if isinstance(err, str) and err:
        text += f": {_clip(err, 80)}"
    colour = {"stop": "#2a7", "length": "#c80", "abort": "#c33", "error": "#c33"}.get(reason, "#888")
    return f'<span style="color:{colour}">{html.escape(text)}</span>'


# Jupyter right-aligns and vertically centres table cells; token text reads left to right from
# the top. JupyterLab's rule is `:not(.jp-RenderedMarkdown).jp-RenderedHTMLCommon td` (specificity
# 0,2,1); `.jp-RenderedHTMLCommon .rlgen-rollouts table td` (0,2,2) beats it wherever it applies,
# and `.rlgen-rollouts table td` (0,1,2) covers pages without JupyterLab's classes. Lab also
# centres tables (margin auto) in some contexts: rlgen's tables sit at the left.
_CELLS = "text-align:left; vertical-align:top; padding:2px 6px"
_STYLE = (
    "<style>"
    ".jp-RenderedHTMLCommon .rlgen-rollouts table td, .jp-RenderedHTMLCommon .rlgen-rollouts table th, "
    f".rlgen-rollouts table td, .rlgen-rollouts table th {{{_CELLS}}}"
    ".jp-RenderedHTMLCommon .rlgen-rollouts table, .rlgen-rollouts table {margin-left:0; margin-right:0}"
    "</style>"
)


def rollouts_html(r: Rollouts, *, max_rows: int = 20, max_tokens: int = 200, max_chars: int = 200) -> str:
    """An HTML summary of `r`: a header line, then the first `max_rows` rows.

    Each completion is drawn token by token as real text (visible newlines, special tokens as grey
    tags), coloured by p = exp(logprob) on a log scale with a legend (hover: id, text, logprob,
    top-k alternatives with their texts); tokens past `max_tokens` and prompt text past `max_chars` are cut. All text is escaped.
    """
    df = r.df
    shown = df.head(max_rows)
    # The chat messages repeat the prompt, and tracebacks are long: both stay in res.df, not here.
    extra = [c for c in r.extra_columns if c != "prompt_messages" and not c.endswith("_traceback")]
    head = [
        "row", "prompt_index", "sample_index", "prompt", "completion", "finish_reason", "completion_tokens",
        "logprob_mean", *extra,
    ]  # fmt: skip
    rows_html = []
    for pos, (_, row) in enumerate(shown.iterrows()):
        prompt = row["prompt"]
        if not isinstance(prompt, str):
            prompt = f"({int(row['prompt_tokens'])} prompt tokens)"
        cells = [
            str(pos),
            str(row["prompt_index"]),
            str(row["sample_index"]),
            html.escape(_clip(prompt, max_chars, tail=True)),
            _completion_cell(r, pos, max_tokens=max_tokens),
            _finish_cell(row),
            str(row["completion_tokens"]),
            _fmt(row["logprob_mean"]),
            *(html.escape(_fmt(row[c])) for c in extra),
        ]
        rows_html.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    header = "".join(f"<th>{html.escape(str(h))}</th>" for h in head)
    summary = html.escape(short_repr(r)[1:-1])
    if r.has_logprobs:
        summary += f" | colour (log scale): {_legend_html()} | hover a token for its id, logprob and top-k"
    foot = ""
    if len(df) > max_rows:
        foot = (
            f'<div style="color:#888">showing {max_rows} of {len(df)} rows; '
            f"use res[i], res[a:b] or res.where(...) to see others</div>"
        )
    return (
        f'<div class="rlgen-rollouts">{_STYLE}<div style="font-family:monospace;margin-bottom:4px">{summary}</div>'
        f"<table><thead><tr>{header}</tr></thead><tbody>{''.join(rows_html)}</tbody></table>{foot}</div>"
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
    body = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(_clip(v, 200))}</td></tr>" for k, v in rows)
    return (
        f'<div class="rlgen-rollouts">{_STYLE}<div style="font-family:monospace">{html.escape(repr(engine))}</div>'
        f"<table>{body}</table></div>"
    )


# ----------------------------------------------------------------------------------------------
# progress selection


def in_notebook() -> bool:
    """True inside a Jupyter kernel (the same test tqdm.autonotebook uses)."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    try:
        shell = ipython.get_ipython()
        return shell is not None and "IPKernelApp" in shell.config
    except Exception:
        return False


def _env_true(value: str | None) -> bool:
    return value is not None and value.strip().lower() not in ("", "0", "false", "no", "off")


def progress_enabled(progress: bool | None, *, environ: dict[str, str] | None = None) -> bool:
    """Resolve `progress=`: True/False win; None (auto) shows unless TQDM_DISABLE is set."""
    if progress is not None:
        if not isinstance(progress, bool):
            raise TypeError(f"progress must be True, False or None (auto), got {progress!r}")
        return progress
    env = os.environ if environ is None else environ
    return not _env_true(env.get("TQDM_DISABLE"))


def progress_bar(
    *,
    total: int | None,
    progress: bool | None = None,
    desc: str = "",
    unit: str = "it",
    file: TextIO | None = None,
    leave: bool = True,
) -> Tqdm:
    """A tqdm bar: a widget in notebooks, text elsewhere, a silent no-op when disabled.

    Advance it per finished request or chunk (never per token). `file` forces a text bar writing
    there (tests, logs).
    """
    if not progress_enabled(progress):
        from tqdm.std import tqdm

        return tqdm(total=total, disable=True)
    if file is not None:
        from tqdm.std import tqdm

        return tqdm(total=total, desc=desc, unit=unit, file=file, leave=leave, disable=False)
    from tqdm.auto import tqdm as auto_tqdm

    # disable=False explicitly: progress=True must win over TQDM_DISABLE, which tqdm reads itself.
    return auto_tqdm(total=total, desc=desc, unit=unit, leave=leave, disable=False)


# ----------------------------------------------------------------------------------------------
# one status line while something starts


class PhaseLine:
    """One status line, rewritten in place, e.g. "server: loading weights (12s)".

    In a notebook it is an HTML display updated through its display id; in a terminal it is one
    stderr line rewritten with `\\r`. Either way a long startup is one line, not thousands.

    Usage::

        line = PhaseLine("sglang")
        line.update("loading weights", 3.0)
        line.close(ok=True)          # "sglang: ready (41s)"

    Args:
        label: what is starting.
        show: True/False, or None = auto (off when TQDM_DISABLE is set).
        mode: "auto" (notebook if in a Jupyter kernel, else terminal), "notebook" or "terminal".
        file: the terminal stream (default sys.stderr).
        min_interval_s: rewrites of an unchanged phase are at most this frequent.
    """

    def __init__(
        self,
        label: str,
        *,
        show: bool | None = None,
        mode: str = "auto",
        file: TextIO | None = None,
        min_interval_s: float = 0.25,
    ) -> None:
        if mode not in ("auto", "notebook", "terminal"):
            raise ValueError(f"mode must be 'auto', 'notebook' or 'terminal', got {mode!r}")
        self.label = label
        self.enabled = progress_enabled(show)
        self.mode = ("notebook" if in_notebook() else "terminal") if mode == "auto" else mode
        self._file = file
        self._min_interval_s = min_interval_s
        self._phase = ""
        self._elapsed = 0.0
        self._last_write = -math.inf
        self._width = 0
        self._handle: Any = None
        self._last_line = ""
        self.closed = False

    def update(self, phase: str, elapsed_s: float) -> None:
        """Show `phase`, `elapsed_s` seconds after the start."""
        if self.closed:
            return
        changed = phase != self._phase
        self._phase, self._elapsed = phase, float(elapsed_s)
        if not self.enabled:
            return
        now = time.monotonic()
        if not changed and (now - self._last_write < self._min_interval_s or not self._live_terminal()):
            return  # a log file gets one write per phase, a live terminal a few per second
        self._last_write = now
        self._render(f"{self.label}: {phase} ({self._elapsed:.0f}s)", state="running")

    def close(self, ok: bool, message: str | None = None) -> None:
        """Leave the final state on screen: ready, or failed during the last phase. Idempotent."""
        if self.closed:
            return
        self.closed = True
        if not self.enabled:
            return
        if ok:
            text = f"{self.label}: {message or 'ready'} ({self._elapsed:.0f}s)"
        else:
            where = f" during '{self._phase}'" if self._phase else ""
            text = f"{self.label}: {message or 'failed'}{where} ({self._elapsed:.0f}s)"
        self._render(text, state="ok" if ok else "failed", final=True)

    def __enter__(self) -> PhaseLine:
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        self.close(ok=exc_type is None)

    # -- rendering ---------------------------------------------------------------------------------
    def _stream(self) -> TextIO:
        return self._file if self._file is not None else sys.stderr

    def _live_terminal(self) -> bool:
        if self.mode == "notebook":
            return True
        try:
            return self._stream().isatty()
        except (AttributeError, ValueError):
            return False

    def _render(self, text: str, *, state: str, final: bool = False) -> None:
        if self.mode == "notebook":
            self._render_notebook(text, state)
            return
        stream = self._stream()
        if not self._live_terminal():
            # A log file or a pipe: one plain line per phase (a \r rewrite would run them together).
            if text != self._last_line:
                stream.write(text + "\n")
                stream.flush()
            self._last_line = text
            return
        # Wrapping would turn the \r rewrite into a new line each time; keep it within the width.
        width = shutil.get_terminal_size((100, 24)).columns - 1
        text = text if len(text) <= width else text[: width - 1] + "…"
        pad = max(0, self._width - len(text))
        stream.write("\r" + text + " " * pad + ("\n" if final else ""))
        stream.flush()
        self._width = len(text)

    def _render_notebook(self, text: str, state: str) -> None:
        from IPython.display import HTML, display  # untyped: its calls are marked below

        icon, colour = {"running": ("⏳", "#555"), "ok": ("✓", "#2a7"), "failed": ("✗", "#c33")}[state]
        body = HTML(f'<div style="font-family:monospace;color:{colour}">{icon} {html.escape(text)}</div>')  # type: ignore[no-untyped-call]
        if self._handle is None:
            self._handle = display(body, display_id=True)  # type: ignore[no-untyped-call]
        else:
            self._handle.update(body)
