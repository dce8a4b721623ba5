"""Progress: one status line per slow thing, rewritten in place, ending with what was done.

Owns: whether progress shows (`progress_enabled`: True / False / None = auto, with TQDM_DISABLE),
whether we run inside a Jupyter kernel (`in_notebook`), and two lines built on one renderer:
`PhaseLine` (a server's start-up phases) and `ProgressLine` (samples or rows done out of a total,
then one line of totals: count, tokens, tok/s, seconds). Knows nothing about generation, HTTP or
rewards: callers tell it what happened.

How it renders. In a notebook: one HTML output, published with both text/html and text/plain and
replaced through its display id, so a saved notebook holds the final line (never a widget whose
saved fallback is a stale "0%"). In a live terminal: one stderr line rewritten with "\\r". In a log
file or a pipe: plain lines, one per phase, and only the final line for progress.

Threads. Counts may be advanced from any thread (rlgen's loop thread advances them as requests
finish); drawing happens only in the thread that created the line, from `tick()` (called while it
waits) or from `advance()` when that thread is the caller, because a notebook output published
from another thread can land in another cell.
"""

from __future__ import annotations

import html
import math
import os
import shutil
import sys
import threading
import time
from typing import Any, TextIO

__all__ = ["PhaseLine", "ProgressLine", "in_notebook", "progress_enabled"]


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


_MODES = ("auto", "notebook", "terminal")
_ICONS = {"running": ("⏳", "#555"), "ok": ("✓", "#2a7"), "warn": ("⚠", "#b80"), "failed": ("✗", "#c33")}


class _Line:
    """The renderer both lines share: a notebook display updated in place, or a terminal line."""

    def __init__(self, *, show: bool | None, mode: str, file: TextIO | None) -> None:
        if mode not in _MODES:
            raise ValueError(f"mode must be 'auto', 'notebook' or 'terminal', got {mode!r}")
        self.enabled = progress_enabled(show)
        self.mode = ("notebook" if in_notebook() else "terminal") if mode == "auto" else mode
        self._file = file
        self._handle: Any = None
        self._width = 0
        self._last_line = ""

    def _stream(self) -> TextIO:
        return self._file if self._file is not None else sys.stderr

    def _live_terminal(self) -> bool:
        if self.mode == "notebook":
            return True
        try:
            return self._stream().isatty()
        except (AttributeError, ValueError):
            return False

    def _render(self, text: str, *, state: str, final: bool = False, extra_html: str = "") -> None:
        if self.mode == "notebook":
            self._render_notebook(text, state, extra_html)
            return
        stream = self._stream()
        if not self._live_terminal():
            # A log file or a pipe: plain lines (a \r rewrite would run them together).
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

    def _render_notebook(self, text: str, state: str, extra_html: str) -> None:
        from IPython.display import display  # untyped: its call is marked below

        icon, colour = _ICONS[state]
        body = {
            "text/plain": f"{icon} {text}",
            "text/html": f'<div style="font-family:monospace;color:{colour}">{extra_html}{icon} {html.escape(text)}</div>',
        }
        if self._handle is None:
            self._handle = display(body, raw=True, display_id=True)  # type: ignore[no-untyped-call]
        else:
            self._handle.update(body, raw=True)


class PhaseLine(_Line):
    """One status line, rewritten in place, e.g. "server: loading weights (12s)".

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
        super().__init__(show=show, mode=mode, file=file)
        self.label = label
        self._min_interval_s = min_interval_s
        self._phase = ""
        self._elapsed = 0.0
        self._last_write = -math.inf
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


def _count(value: int, unit: str) -> str:
    return f"{value:,} {unit}{'' if value == 1 else 's'}"


def _seconds(value: float) -> str:
    return f"{value:.1f} s" if value < 60 else f"{int(value // 60)} min {value % 60:.0f} s"


class ProgressLine(_Line):
    """Progress of one call: "generate 37/64 samples · 4.2 s", then its totals on one line.

    "✓ generate: 64 samples · 8,192 tokens · 2,345 tok/s · 3.5 s", or on failure "✗ generate:
    stopped after 37/64 samples (KeyboardInterrupt) · 4.2 s".

    Usage::

        with ProgressLine("generate", total=64, unit="sample") as line:
            ...  # line.advance(8, tokens=900) as work finishes (any thread); line.tick() while waiting

    Args:
        label: what runs ("generate", "score", "rewards").
        total: how many units the call does.
        unit: singular name of a unit ("sample", "row").
        show: True (from the start), False, or None = auto: only once the call has run `delay_s`
            (so fast calls print nothing) and unless TQDM_DISABLE is set.
        mode, file: as PhaseLine.
        delay_s: auto mode's delay before the line appears.
        min_interval_s: redraws are at most this frequent.
    """

    def __init__(
        self,
        label: str,
        *,
        total: int,
        unit: str = "sample",
        show: bool | None = None,
        mode: str = "auto",
        file: TextIO | None = None,
        delay_s: float = 1.0,
        min_interval_s: float = 0.25,
    ) -> None:
        super().__init__(show=show, mode=mode, file=file)
        self.label, self.total, self.unit = label, int(total), unit
        self._delay_s = 0.0 if show is True else delay_s
        self._min_interval_s = min_interval_s
        self._owner = threading.get_ident()
        self._lock = threading.Lock()
        self._t0 = time.perf_counter()
        self._last_draw = -math.inf
        self.done = 0
        self.tokens = 0
        self.note = ""   # what is happening inside the unfinished units ("16 running · 3,120 tokens in use")
        self.shown = False
        self.closed = False

    @property
    def elapsed_s(self) -> float:
        return time.perf_counter() - self._t0

    def advance(self, count: int = 1, tokens: int = 0) -> None:
        """`count` more units done (and `tokens` generated). Safe from any thread."""
        with self._lock:
            self.done += int(count)
            self.tokens += int(tokens)
        if threading.get_ident() == self._owner:
            self.tick()

    def set_note(self, note: str) -> None:
        """Show `note` in the running line (e.g. the server's load while no unit has finished yet).
        Safe from any thread; the owner's next tick draws it."""
        with self._lock:
            self.note = note

    def tick(self) -> None:
        """Draw the line if it is due (the owner thread only; other threads' calls do nothing)."""
        if self.closed or not self.enabled or threading.get_ident() != self._owner:
            return
        elapsed = self.elapsed_s
        if elapsed < self._delay_s or elapsed - self._last_draw < self._min_interval_s:
            return
        if not self._live_terminal():
            return  # a log gets the totals line only
        self._last_draw = elapsed
        self.shown = True
        done = min(self.done, self.total)
        note = f" · {self.note}" if self.note and done < self.total else ""
        text = f"{self.label} {done:,}/{self.total:,} {self.unit}s{note} · {_seconds(elapsed)}"
        bar = f'<progress value="{done}" max="{max(self.total, 1)}" style="width:12em;vertical-align:middle"></progress> '
        self._render(text, state="running", extra_html=bar)

    def summary(self) -> str:
        """The totals: count, tokens and tok/s when tokens were counted, seconds."""
        elapsed = self.elapsed_s
        parts = [_count(self.done, self.unit)]
        if self.tokens:
            parts.append(_count(self.tokens, "token"))
            parts.append(f"{self.tokens / elapsed:,.0f} tok/s" if elapsed > 0 else "")
        parts.append(_seconds(elapsed))
        return " · ".join(p for p in parts if p)

    def close(self, ok: bool = True, reason: str | None = None, *, totals: str | None = None,
              warn: bool = False) -> None:
        """Replace the line with the call's totals (or where it stopped). Idempotent.

        `totals` replaces the count in the totals ("119 ok · 9 timeout"); `warn` marks a call that
        finished with something wrong (⚠ instead of ✓). Auto mode prints the totals only for a
        call that ran past its delay: fast calls stay silent.
        """
        if self.closed:
            return
        self.closed = True
        if not self.enabled or (not self.shown and self.elapsed_s < self._delay_s):
            return
        if ok:
            summary = self.summary() if totals is None else f"{totals} · {_seconds(self.elapsed_s)}"
            text = f"{self.label}: {summary}"
        else:
            why = f" ({reason})" if reason else ""
            text = f"{self.label}: stopped after {min(self.done, self.total):,}/{_count(self.total, self.unit)}{why} · {_seconds(self.elapsed_s)}"
        self._render(text, state=("warn" if warn else "ok") if ok else "failed", final=True)

    def __enter__(self) -> ProgressLine:
        return self

    def __exit__(self, exc_type: Any, exc: Any, _tb: Any) -> None:
        self.close(ok=exc_type is None, reason=None if exc_type is None else exc_type.__name__)
