"""The rollout browser: filter a Rollouts, step through its prompt groups, read one sample's tokens.

Owns: the browser's selection (finish reason, an episode's status, reward range, text search, which
group and which sample: `RolloutBrowser`'s plain attributes, `matching()` and `step()`), the HTML it
draws for a selection (the group through the view's table, then the selected sample's token heatmap
(an episode's trajectory as turns) and its least likely tokens with their top-k alternatives), and
the ipywidgets controls around it. Where widgets cannot render (a static export, a frontend without
the widget manager) the same HTML is in the output's text/html. Knows nothing about servers,
generation or `rlgen.episodes`: it reads a `Rollouts` (episodes by their data: a `status` column)
and draws through `rollouts._display` and `rollouts._episode_html`.
"""

from __future__ import annotations

import html
import math
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ._display import adapter_name, rollouts_html
from ._episode_html import episode_title, is_episodes, status_counts, turns_html
from ._token_html import LINE_STYLE, alternative_texts, completion_html, token_pieces

if TYPE_CHECKING:
    from ._protocol import RolloutsView

__all__ = ["RolloutBrowser", "interactive_frontend", "sample_html", "widget_bundle"]

# The least likely tokens of the selected sample listed with their alternatives: at most this
# many, and only tokens that were actually unlikely (p below _UNLIKELY_P).
_SURPRISES = 8
_UNLIKELY_P = 0.5


class RolloutBrowser:
    """Browse `rollouts` a prompt group at a time: `res.browse()` in a notebook.

    The selection is plain attributes, so it can be set from code as well as from the controls:
    `finish` (a finish reason or None for all), `status` (episodes: a status or None for all),
    `reward_range` ((low, high) or None), `search` (text that the prompt or the completion must
    contain, case-insensitive), `group` (position among the groups with matching rows) and `sample`
    (position among the group's matching rows). `step(by)` moves through the matching rows one at
    a time across groups (the episode buttons).
    """

    def __init__(self, rollouts: RolloutsView, *, reward: str = "reward", widgets: bool | None = None) -> None:
        if widgets is not None and not isinstance(widgets, bool):
            raise TypeError(f"widgets must be True, False or None (auto), got {widgets!r}")
        self.rollouts = rollouts
        self.reward = reward if reward in rollouts.df.columns else None
        self.widgets = widgets
        self.finish: str | None = None
        self.episodes = is_episodes(rollouts)
        self.status: str | None = None
        self.reward_range: tuple[float, float] | None = None
        self.search = ""
        self.group = 0
        self.sample = 0
        self._widget: Any = None

    # -- the selection -------------------------------------------------------------------------------
    def matching(self) -> np.ndarray:
        """Positions of the rows that pass the filters, in row order."""
        df = self.rollouts.df
        keep = np.ones(len(df), dtype=bool)
        if self.finish is not None:
            keep &= (df["finish_reason"] == self.finish).to_numpy()
        if self.status is not None and "status" in df.columns:
            keep &= (df["status"].astype(str) == self.status).to_numpy()
        if self.reward_range is not None and self.reward is not None:
            low, high = self.reward_range
            values = df[self.reward].to_numpy(dtype=np.float64)
            keep &= (values >= low) & (values <= high)  # NaN rewards fall outside any range
        if self.search:
            needle = self.search.lower()
            text = df["prompt"].fillna("").astype(str).str.lower() + "\n" + df["completion"].fillna("").astype(str).str.lower()
            keep &= text.str.contains(needle, regex=False).to_numpy()
        return np.flatnonzero(keep)

    def groups(self) -> list[np.ndarray]:
        """The matching rows, split into prompt groups (run, prompt_index), in order of first row."""
        rows = self.matching()
        df = self.rollouts.df
        keys = list(zip(df["run"].to_numpy()[rows].tolist(), df["prompt_index"].to_numpy()[rows].tolist()))
        order: dict[tuple[Any, Any], list[int]] = {}
        for key, row in zip(keys, rows.tolist()):
            order.setdefault(key, []).append(row)
        return [np.asarray(v, dtype=np.int64) for v in order.values()]

    def selected(self) -> tuple[np.ndarray, int | None]:
        """(the current group's matching rows, the selected row), clamping group and sample."""
        groups = self.groups()
        if not groups:
            self.group = self.sample = 0
            return np.empty(0, dtype=np.int64), None
        self.group = min(max(self.group, 0), len(groups) - 1)
        rows = groups[self.group]
        self.sample = min(max(self.sample, 0), len(rows) - 1)
        return rows, int(rows[self.sample])

    def step(self, by: int) -> None:
        """Move `by` matching rows (an episode at a time), across groups; clamped at either end."""
        groups = self.groups()
        if not groups:
            return
        self.selected()
        flat = [(g, s) for g, rows in enumerate(groups) for s in range(len(rows))]
        at = flat.index((self.group, self.sample))
        self.group, self.sample = flat[min(max(at + by, 0), len(flat) - 1)]

    # -- drawing -------------------------------------------------------------------------------------
    def html(self) -> str:
        """The current selection as HTML: a status line, the group's rows, the selected sample."""
        rows, row = self.selected()
        groups = self.groups()
        n_groups = len(groups)
        status = f"group {self.group + 1 if n_groups else 0} of {n_groups} matching ({len(self.matching())} of {len(self.rollouts)} rows)"
        if self.episodes:
            at = sum(len(g) for g in groups[: self.group]) + self.sample + 1 if row is not None else 0
            status = (f"episode {at} of {len(self.matching())} matching ({len(self.rollouts)} in all) · "
                      f"group {self.group + 1 if n_groups else 0} of {n_groups}")
        filters = self._filters_text()
        lead = f'<span style="color:#555">{html.escape(status + filters)}</span>'
        box = f'class="rlgen-browser" style="{LINE_STYLE}"'
        if row is None:
            return (f'<div {box}><div style="font-family:monospace">{lead}</div>'
                    '<div style="color:#c80">no rows match these filters</div></div>')
        group = self.rollouts[rows]
        # One header line: where the browser is, then the group view's own line (legend, notes).
        return (
            f"<div {box}>{rollouts_html(group, max_rows=len(rows), lead=lead)}"
            f"{sample_html(self.rollouts, row, position=self.sample)}</div>"
        )

    def _status_text(self) -> str:
        return f"status = {self.status}" if self.status is not None else ""

    def _filters_text(self) -> str:
        parts = [self._status_text()] if self.status is not None else []
        if self.finish is not None:
            parts.append(f"finish = {self.finish}")
        if self.reward_range is not None and self.reward is not None:
            parts.append(f"{self.reward} in [{self.reward_range[0]:.3g}, {self.reward_range[1]:.3g}]")
        if self.search:
            parts.append(f"text contains {self.search!r}")
        return " · " + ", ".join(parts) if parts else ""

    def _repr_html_(self) -> str:
        return self.html()

    def _repr_mimebundle_(self, **_: Any) -> dict[str, Any]:
        """The widget where a widget manager runs, else the static HTML (see `use_widgets`)."""
        return widget_bundle(repr(self), self.html(), self.widget if self.use_widgets() else None)

    def __repr__(self) -> str:
        what = "episodes" if self.episodes else "rows"
        return f"<RolloutBrowser {len(self.groups())} groups, {len(self.matching())} of {len(self.rollouts)} {what}>"

    # -- widgets -------------------------------------------------------------------------------------
    def use_widgets(self) -> bool:
        """Whether the output is the widget: `widgets=True`, or auto (None) in a kernel that an
        interactive frontend started (see `interactive_frontend`) with ipywidgets installed.

        A widget output is blank wherever no widget manager renders it (a notebook executed by
        nbconvert, nbclient or papermill, then exported or viewed statically), and exporters
        prefer it over text/html: there the output is the static HTML of the selection.
        """
        if self.widgets is not None:
            return self.widgets
        from ..core._progress import in_notebook

        if not in_notebook():
            return False
        try:
            from ipywidgets import Widget
        except ImportError:
            return False
        return getattr(Widget, "_control_comm", None) is not None or interactive_frontend()

    def _filters(self, w: Any) -> tuple[list[Any], Any, Any, Any, Any]:
        """The filter controls, opened on the selection set from code (e.g. `b.status = "done"` before
        showing b): all of them in order, then finish, status (None without a status column), reward
        (None without a reward to slide over) and search."""
        df = self.rollouts.df
        finishes = ["all", *sorted({str(f) for f in df["finish_reason"]})]
        finish = w.Dropdown(options=finishes, value=self.finish if self.finish in finishes else "all", description="finish",
                            layout=w.Layout(width="14em"))
        # Wide enough for its placeholder next to its label (a narrower box cut it to "The pa").
        search = w.Text(placeholder="text in prompt or completion", description="search", continuous_update=False,
                        layout=w.Layout(width="24em", min_width="24em"))
        controls: list[Any] = [finish]
        status: Any = None
        if "status" in df.columns:
            options = [("all", "all"), *((f"{k} ({v})", k) for k, v in status_counts(self.rollouts))]
            status = w.Dropdown(options=options, value=self.status if self.status in {v for _, v in options} else "all",
                                description="status", layout=w.Layout(width="16em"))
            controls.insert(0, status)
        reward: Any = None
        if self.reward is not None:
            values = df[self.reward].to_numpy(dtype=np.float64)
            finite = values[np.isfinite(values)]
            if len(finite) and finite.min() < finite.max():
                low, high = float(finite.min()), float(finite.max())
                reward = w.FloatRangeSlider(value=(low, high), min=low, max=high, step=(high - low) / 100,
                                            description=self.reward, readout_format=".3g", continuous_update=False)
                controls.append(reward)
        controls.append(search)
        return controls, finish, status, reward, search

    def widget(self) -> Any:
        """The ipywidgets controls and view (built once), or None where ipywidgets is missing."""
        if self._widget is not None:
            return self._widget
        try:
            import ipywidgets as w
        except ImportError:
            return None
        df = self.rollouts.df
        controls, finish, status, reward, search = self._filters(w)
        unit = "episode" if self.episodes else "group"
        previous, following = w.Button(description=f"◀ {unit}", layout=w.Layout(width="8em")), w.Button(
            description=f"{unit} ▶", layout=w.Layout(width="8em"))
        sample = w.Dropdown(options=[0], description="episode" if self.episodes else "sample",
                            layout=w.Layout(width="22em" if self.episodes else _sample_width(df)))
        view = w.HTML(layout=w.Layout(width="auto", overflow="auto"))

        def redraw(*_: Any) -> None:
            rows, _row = self.selected()
            labels = [(f"{int(df['sample_index'].iat[r])} (row {int(df['row_id'].iat[r])})"
                       + (f" {df['status'].iat[r]}" if self.episodes else "") + _adapter_label(df.iloc[r]), k)
                      for k, r in enumerate(rows.tolist())]
            sample.unobserve(on_sample, "value")
            sample.options = labels or [("-", 0)]
            sample.value = self.sample if labels else 0
            sample.observe(on_sample, "value")
            view.value = self.html()

        def on_filter(*_: Any) -> None:
            self.finish = None if finish.value == "all" else finish.value
            if status is not None:
                self.status = None if status.value == "all" else status.value
            full = reward is not None and tuple(reward.value) == (reward.min, reward.max)
            self.reward_range = None if reward is None or full else (float(reward.value[0]), float(reward.value[1]))
            self.search = search.value.strip()
            self.group = self.sample = 0
            redraw()

        def on_sample(change: Any) -> None:
            self.sample = int(change["new"])
            view.value = self.html()

        def step(by: int) -> Any:
            def go(_: Any) -> None:
                if self.episodes:
                    self.step(by)
                else:
                    self.group += by
                    self.sample = 0
                redraw()
            return go

        for control in (finish, search, *([reward] if reward is not None else []), *([status] if status is not None else [])):
            control.observe(on_filter, "value")
        previous.on_click(step(-1))
        following.on_click(step(+1))
        sample.observe(on_sample, "value")
        redraw()
        # Controls wrap onto a second line rather than being cut at a narrow output area.
        wrap = w.Layout(flex_flow="row wrap", width="auto")
        self._widget = w.VBox([w.HBox(controls, layout=wrap), w.HBox([previous, following, sample], layout=wrap), view],
                              layout=w.Layout(width="auto"))
        return self._widget


def widget_bundle(text: str, page: str, widget: Callable[[], Any] | None) -> dict[str, Any]:
    """A notebook output: the text, the static HTML, and the widget's view where `widget` makes one
    (exporters prefer the widget's view, so it is left out where no widget manager runs)."""
    bundle: dict[str, Any] = {"text/plain": text, "text/html": page}
    made = widget() if widget is not None else None
    if made is not None:
        view = made._repr_mimebundle_()
        if view:
            bundle.update({k: v for k, v in view.items() if k != "text/plain"})
    return bundle


def interactive_frontend(environ: Mapping[str, str] | None = None, user_ns: Mapping[str, Any] | None = None) -> bool:
    """Whether this kernel was started for a person at a notebook frontend that renders widgets.

    JupyterLab and Notebook 7 start kernels through jupyter_server, which sets JPY_SESSION_NAME
    (seen in JupyterLab 4.6); VS Code's Jupyter extension starts them from its extension host
    (VSCODE_* variables) and sets `__vsc_ipynb_file__` in the user namespace. Kernels that
    nbclient, nbconvert, nbmake or papermill start have none of these.
    """
    env = os.environ if environ is None else environ
    if env.get("JPY_SESSION_NAME") or any(k.startswith("VSCODE_") for k in env):
        return True
    if user_ns is None:
        try:
            from IPython import get_ipython

            shell = get_ipython()
            user_ns = {} if shell is None else shell.user_ns
        except ImportError:
            user_ns = {}
    return "__vsc_ipynb_file__" in user_ns


def sample_html(r: RolloutsView, i: int, *, position: int = 0) -> str:
    """One sample in full: a title line (with its LoRA adapter, or "base model", where the result
    has an `adapter` column), its token heatmap (an episode's trajectory as turns), then its
    unlikely tokens (p < 0.5) with the alternatives."""
    row = r.df.iloc[i]
    title = (f"sample {row['sample_index']} (row {row['row_id']}) · {row['finish_reason']} · "
             f"{row['completion_tokens']} tokens · mean logprob {row['logprob_mean']:.3f}"
             + _adapter_label(row, " · "))
    heat = completion_html(r, i, max_tokens=4096)
    if is_episodes(r):
        title = episode_title(row)
        heat = turns_html(r, i, max_tokens=4096, env_cap=None, prompt_tail=True, ended=True)
    return (
        f'<div style="margin-top:8px;font-family:monospace;color:#333">{html.escape(title)}</div>'
        f'<div style="border:1px solid #ccc;padding:4px;max-width:100%;{LINE_STYLE}">{heat}</div>{_surprises_html(r, i)}'
    )


def _adapter_label(row: Any, sep: str = " ") -> str:
    """`sep` + "LoRA <name>" or "base model" (as the view's sample cell says it) for a row of a
    result with an `adapter` column, else ""."""
    if "adapter" not in row.index:
        return ""
    name = adapter_name(row)
    return sep + ("base model" if name is None else f"LoRA {name}")


def _sample_width(df: Any) -> str:
    """The sample dropdown's width: 16em for "12 (row 345)", wider by what the longest adapter label
    adds (a 16em box cut "0 (row 0) base model" to "0 (row 0) base"); at most 40em."""
    if "adapter" not in df.columns:
        return "16em"
    names = [str(v) for v in df["adapter"].dropna().unique()]
    longest = max([len("base model"), *(len("LoRA ") + len(n) for n in names)])
    return f"{min(40, 16 + math.ceil(0.65 * (longest + 1)))}em"  # ~0.65em a character at the widgets' font


def _surprises_html(r: RolloutsView, i: int) -> str:
    """The sample's unlikely tokens (p < 0.5), least likely first: where it went somewhere the model
    did not expect. Says so when there are none; asks for top_logprobs only when the sample has none."""
    tok = r.tokens(i)
    lps = tok["logprobs"]
    if lps is None or not len(lps):
        return ""
    lps = np.asarray(lps, dtype=np.float64)
    limit = math.log(_UNLIKELY_P)
    order = [int(j) for j in np.argsort(np.where(np.isnan(lps), np.inf, lps))[:_SURPRISES]
             if not math.isnan(lps[j]) and lps[j] < limit]
    top_ids, top_lp = tok["top_ids"], tok["top_logprobs"]
    # (Episodes ask for no top-k: no hint there.)
    hint = "" if top_ids is not None or tok["loss_mask"] is not None else " (generate with top_logprobs=k to see what else the model considered)"
    caption = f"unlikely tokens (p &lt; {_UNLIKELY_P:g}), least likely first{html.escape(hint)}"
    if not order:
        return (f'<div class="rlgen-rollouts" style="margin-top:6px;color:#555;{LINE_STYLE}">no unlikely tokens: '
                f"every token of this sample had p ≥ {_UNLIKELY_P:g}</div>")
    ids = [int(t) for t in tok["ids"]]
    pieces = token_pieces(r, ids, tok["texts"])
    alt_text = alternative_texts(r, top_ids[order]) if top_ids is not None else {}
    rows = []
    for j in order:
        alts = ""
        if top_ids is not None and top_lp is not None:
            alts = ", ".join(f"{alt_text[int(a)]!r} {math.exp(float(b)):.3g}" if int(a) in alt_text else f"id {int(a)} {math.exp(float(b)):.3g}"
                             for a, b in zip(top_ids[j], top_lp[j]) if not math.isnan(b))
        text = repr(pieces[j]) if pieces is not None else f"id {ids[j]}"
        rows.append(f"<tr><td>{j}</td><td>{html.escape(text)}</td><td>{math.exp(lps[j]):.3g}</td>"
                    f"<td>{html.escape(alts) or '<span style=color:#888>(no top_logprobs)</span>'}</td></tr>")
    cell = "text-align:left;vertical-align:top;padding:2px 6px;overflow-wrap:break-word"
    head = "".join(f'<th style="{cell}">{h}</th>' for h in ("position", "token", "p", "top-k alternatives (p)"))
    body = "".join(rows).replace("<td>", f'<td style="{cell}">')
    return (
        f'<div class="rlgen-rollouts" style="{LINE_STYLE}"><div style="margin-top:6px;color:#555">{caption}</div>'
        f'<table style="border-collapse:collapse;margin-left:0;max-width:100%"><thead><tr>{head}</tr></thead>'
        f"<tbody>{body}</tbody></table></div>"
    )
