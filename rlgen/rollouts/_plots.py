"""Plots of scored rollouts: the `res.plot` accessor.

Owns: `RolloutPlots` (what `Rollouts.plot` returns) and its five plots: reward histograms, reward
against completion length, prompt groups, advantages and the pass@k curve; the colours of finish
reasons, shared by every plot; and the figure and axes classes that show themselves as PNG in
Jupyter. Knows nothing about how rewards are computed or how samples were generated: it reads the
columns `add_rewards` wrote, through `rewards._summary` and `rewards._group_stats` for the arithmetic.

matplotlib is imported only when a plot is drawn. Figures are made with `matplotlib.figure.Figure`,
never through pyplot: nothing is registered with pyplot, so no figure stays open, a notebook shows
each plot once (the returned Figure or Axes renders itself as PNG; assign it to draw more on it and
end the cell with `ax.figure`), and `fig.savefig(...)` works without a display. With `ax=`, a plot
draws into your own axes (e.g. from `plt.subplots`) and displays however your figure does; its
legend stays outside the axes when the figure has room for it (one axes, or `layout="constrained"`)
and goes inside, where it covers least, otherwise.

Colours: finish reasons stop / length / abort / error are blue / orange / brown / red in every
plot (others grey, olive, cyan, pink); purple marks zero-variance prompt groups (every sample
scored the same, so their GRPO advantage is 0).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ._figures import (
    legend,
    new_axes,
    nothing_scored,
    panels,
    require_matplotlib,
    root_figure,
    user_axes,
)

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from ._protocol import RolloutsView

__all__ = ["FINISH_COLORS", "ZERO_STD_COLOR", "RolloutPlots"]

FINISH_COLORS: dict[str, str] = {"stop": "tab:blue", "length": "tab:orange", "abort": "tab:brown", "error": "tab:red"}
_OTHER_COLORS = ("tab:gray", "tab:olive", "tab:cyan", "tab:pink", "tab:green")
# For a `by` column other than finish_reason; purple is left out, it marks zero-variance groups.
_CATEGORY_COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:brown", "tab:pink", "tab:gray",
                    "tab:olive", "tab:cyan")
ZERO_STD_COLOR = "tab:purple"
_PLAIN_COLOR = "0.4"         # bars and lines not split by any column
_MAX_CATEGORIES = len(_CATEGORY_COLORS)
_MAX_DISCRETE = 10           # at most this many distinct values (each repeated): drawn as bars at the values
_MAX_BINS = 60
_MAX_GROUP_LABELS = 40       # more prompt groups than this: the x axis shows ranks, not prompt indices


class RolloutPlots:
    """`res.plot`: plots of a Rollouts' rewards, each drawn with matplotlib.

    Single-panel plots return their `Axes` and take `ax=` to draw into one of yours; `rewards()`
    returns the `Figure` (one panel per reward function). In Jupyter the result shows itself.
    """

    def __init__(self, res: RolloutsView) -> None:
        self._res = res

    def __repr__(self) -> str:
        return "<rlgen plots: rewards, reward_vs_length, groups, advantages, pass_at_k>"

    # -- 1. reward histograms ----------------------------------------------------------------------
    def rewards(
        self,
        funcs: str | Sequence[str] | None = None,
        *,
        by: str | None = "finish_reason",
        bins: int | Sequence[float] | str = "auto",
        ax: Axes | Sequence[Axes] | None = None,
    ) -> Figure:
        """Histograms of each reward function's values, one panel per function; returns the Figure.

        Args:
            funcs: function names ("exact" or "reward_exact"; "reward" is the combined reward);
                default every function `add_rewards` scored with.
            by: a column to stack the bars by (default the finish reason; None: no split).
            bins: "auto" draws a reward with a few repeated values (0/1, 0/0.5/1) as one bar per
                value and any other with numpy's "auto" bins; or numpy's bin count, edges or rule.
            ax: axes to draw into, one per function (a single Axes for a single function).

        Rows whose reward is NaN (not scored: none, error, timeout...) are counted in each panel's
        title, not drawn.
        """
        require_matplotlib()
        df = self._res.df
        columns = _reward_columns(df, funcs)
        labels, order, colors = _split(df, by)
        if ax is None:
            fig, axes = panels(len(columns))
        else:
            axes = user_axes(ax, len(columns))
            fig = root_figure(axes[0])
        for column, panel in zip(columns, axes):
            values = df[column].to_numpy(dtype=np.float64)
            ok = np.isfinite(values)
            groups = [values[ok & (labels == c)] for c in order]
            uniq = _discrete(values[ok]) if isinstance(bins, str) and bins == "auto" else None
            if uniq is not None:
                _stacked_bars(panel, uniq, groups, order, colors)
            elif ok.any():
                edges = _edges(values[ok], "auto" if isinstance(bins, str) and bins == "auto" else bins)
                _stacked_hist(panel, edges, groups, order, colors)
            else:
                nothing_scored(panel)
            name = "reward (combined)" if column == "reward" else column[len("reward_"):]
            panel.set_title(f"{name}\n{_scored_note(df, column)}", fontsize="medium")
            panel.set_xlabel(f"{column} value")
            panel.set_ylabel("rows")
        if by is not None and any(df[c].notna().any() for c in columns):
            scored = np.zeros(len(df), dtype=bool)
            for column in columns:
                scored |= np.isfinite(df[column].to_numpy(dtype=np.float64))
            scored_labels = labels.copy()
            scored_labels[~scored] = None
            handles = _category_handles([c for c in order if (scored_labels == c).any()], colors, scored_labels)
            if ax is None:
                fig.legend(handles=handles, title=by, loc="outside right upper", fontsize="small", title_fontsize="small",
                           frameon=False)
            else:
                legend(axes[-1], handles=handles, title=by)
        if ax is None and len(columns) > 1:
            fig.suptitle("reward values by function", fontsize="large")
        return fig

    # -- 2. reward against length ------------------------------------------------------------------
    def reward_vs_length(self, reward: str = "reward", *, ax: Axes | None = None) -> Axes:
        """A scatter of `reward` against `completion_tokens`, coloured by finish reason, with the
        Pearson correlation in the title; returns the Axes.

        A reward with a few repeated values (0/1, ...) is jittered up and down a little so that
        points do not hide each other (the y axis says so); rows with a NaN reward are counted in
        the title, not drawn.
        """
        require_matplotlib()
        df = self._res.df
        _require(df, reward)
        _require(df, "completion_tokens")
        out = new_axes(ax)
        y = df[reward].to_numpy(dtype=np.float64)
        x = df["completion_tokens"].to_numpy(dtype=np.float64)
        ok = np.isfinite(y) & np.isfinite(x)
        labels, order, colors = _split(df, "finish_reason")
        uniq = _discrete(y[ok])
        shown = y.copy()
        if uniq is not None:
            amplitude = 0.07 * _min_gap(uniq)
            shown = y + np.random.default_rng(0).uniform(-amplitude, amplitude, len(y))
        size = 16 if ok.sum() <= 500 else 6
        for c in order:
            rows = ok & (labels == c)
            if rows.any():
                out.scatter(x[rows], shown[rows], s=size, color=colors[c], alpha=0.7, linewidths=0,
                            label=f"{c} ({int(rows.sum())})")
        if uniq is not None and len(uniq) <= _MAX_DISCRETE and _min_gap(uniq) >= _span(uniq) / 12:
            out.set_yticks(uniq, [f"{v:.3g}" for v in uniq])
        from ..rewards._summary import correlation

        r = correlation(y, x)
        corr = f"Pearson r = {r:.2f}" if math.isfinite(r) else "r undefined (constant, or under 3 rows)"
        out.set_title(f"{reward} vs completion length: {corr}\n{_scored_note(df, reward)}", fontsize="medium")
        out.set_xlabel("completion tokens")
        out.set_ylabel(f"{reward} (jittered)" if uniq is not None else reward)
        if ok.any():
            legend(out, title="finish_reason", markerscale=1.5)
        else:
            nothing_scored(out)
        return out

    # -- 3. prompt groups --------------------------------------------------------------------------
    def groups(self, reward: str = "reward", *, sort: bool = True, ax: Axes | None = None) -> Axes:
        """Per prompt group: its mean (diamond), min-max range (line) and samples (dots, coloured
        by finish reason); zero-variance groups (every sample scored the same: GRPO advantage 0)
        in purple on a purple band and counted in the title. Returns the Axes.

        Args:
            reward: the column to plot (default the combined reward).
            sort: order the groups by mean reward (False: by prompt).
            ax: axes to draw into.

        The x axis names each group by its prompt_index (run/prompt_index after a concat with a
        `run` column), or by rank when there are many groups.
        """
        require_matplotlib()
        import pandas as pd

        from ..rewards import _group_stats
        from ._groups import group_keys

        df = self._res.df
        _require(df, reward)
        out = new_axes(ax)
        keys = group_keys(df)
        r = df[reward].to_numpy(dtype=np.float64)
        stats = _group_stats.group_arrays(r, keys)
        # The run is named only when there are several (every result has a run column).
        names = (df["run"].astype(str) + "/" + df["prompt_index"].astype(str)
                 if "run" in df.columns and df["run"].nunique() > 1 else df["prompt_index"].astype(str))
        frame = pd.DataFrame({"key": keys, "r": r, "mean": stats.mean, "zero": stats.zero_std,
                              "name": names.to_numpy()})
        table = frame.groupby("key", sort=False).agg(mean=("mean", "first"), lo=("r", "min"), hi=("r", "max"),
                                                      zero=("zero", "first"), name=("name", "first"))
        if sort:
            table = table.sort_values("mean", kind="stable", na_position="last")
        n_groups = len(table)
        x = np.arange(n_groups, dtype=np.float64)
        zero = table["zero"].to_numpy(dtype=bool)
        for position in x[zero]:
            out.axvspan(position - 0.45, position + 0.45, color=ZERO_STD_COLOR, alpha=0.1, linewidth=0, zorder=0)
        position_of = pd.Series(x, index=table.index)
        ok = np.isfinite(r)
        row_x = position_of.loc[keys].to_numpy()
        rank = frame[ok].groupby("key", sort=False).cumcount().to_numpy()
        count = frame[ok].groupby("key", sort=False)["r"].transform("size").to_numpy()
        dx = np.zeros(len(r))
        dx[ok] = ((rank + 0.5) / count - 0.5) * 0.6
        labels, order, colors = _split(df, "finish_reason")
        dense = n_groups > _MAX_GROUP_LABELS
        size = 5 if dense else 14
        for c in order:
            rows = ok & (labels == c)
            if rows.any():
                out.scatter(row_x[rows] + dx[rows], r[rows], s=size, color=colors[c], alpha=0.6, linewidths=0,
                            zorder=2, label=f"{c} ({int(rows.sum())})")
        mean, lo, hi = (table[c].to_numpy(dtype=np.float64) for c in ("mean", "lo", "hi"))
        spread = ~zero & np.isfinite(mean)
        out.vlines(x[spread], lo[spread], hi[spread], color="0.15", linewidth=0.6 if dense else 1.2,
                   alpha=0.5 if dense else 1.0, zorder=3)
        marker = 10 if dense else 28
        out.scatter(x[spread], mean[spread], marker="D", s=marker, color="0.15", zorder=4, label="group mean, min–max")
        out.scatter(x[zero], mean[zero], marker="D", s=marker, color=ZERO_STD_COLOR, zorder=4,
                    label=f"zero-variance group ({int(zero.sum())})")
        if not dense:
            out.set_xticks(x, table["name"].tolist(), fontsize="small", rotation=90 if n_groups > 16 else 0)
            out.set_xlabel("prompt group (prompt_index)" + (", sorted by mean" if sort else ""))
        else:
            from matplotlib.ticker import MaxNLocator

            out.xaxis.set_major_locator(MaxNLocator(integer=True))
            out.set_xlabel("prompt groups, " + ("ranked by mean" if sort else "in prompt order"))
        out.set_xlim(-0.6, n_groups - 0.4)
        uniq = _discrete(r[ok])
        if uniq is not None and _min_gap(uniq) >= _span(uniq) / 12:
            out.set_yticks(uniq, [f"{v:.3g}" for v in uniq])
        out.set_ylabel(reward)
        unscored = int(table["mean"].isna().sum())
        note = _scored_note(df, reward) + (f"; {unscored} groups with none scored" if unscored else "")
        out.set_title(f"{reward} by prompt group: {int(zero.sum())} of {n_groups} groups have zero variance\n{note}",
                      fontsize="medium")
        if ok.any():
            legend(out, markerscale=1.5)
        else:
            nothing_scored(out)
        return out

    # -- 4. advantages -----------------------------------------------------------------------------
    def advantages(
        self,
        *,
        by: str | None = "finish_reason",
        bins: int | Sequence[float] | str = "auto",
        ax: Axes | None = None,
    ) -> Axes:
        """The distribution of the `advantage` column; returns the Axes.

        Rows of zero-variance groups (advantage exactly 0: they teach nothing) are a purple bar
        of their own, counted in the title; the other rows are stacked by `by` (default the finish
        reason; None: no split). `bins`: numpy's bin count, edges or rule; one bin is centred on 0.
        """
        require_matplotlib()
        df = self._res.df
        _require(df, "advantage")
        out = new_axes(ax)
        adv = df["advantage"].to_numpy(dtype=np.float64)
        ok = np.isfinite(adv)
        if "group_zero_std" in df.columns:
            zero_group = df["group_zero_std"].fillna(False).to_numpy(dtype=bool) & ok
        else:
            zero_group = np.zeros(len(adv), dtype=bool)
        labels, order, colors = _split(df, by)
        groups = [adv[ok & ~zero_group & (labels == c)] for c in order] + [adv[zero_group]]
        names = [*order, "zero-variance groups"]
        palette = {**colors, "zero-variance groups": ZERO_STD_COLOR}
        out.set_xlabel("advantage")
        out.set_ylabel("rows")
        if not ok.any():
            nothing_scored(out)
            out.set_title(f"advantage\n{_scored_note(df, 'advantage')}", fontsize="medium")
            return out
        edges = _edges(adv[ok], bins, centre_zero=True)
        _stacked_hist(out, edges, groups, names, palette)
        out.axvline(0.0, color="0.3", linewidth=0.8, linestyle="--", zorder=0)
        n_zero, n_groups = int(zero_group.sum()), _count_zero_groups(df, zero_group)
        other_zero = int((adv[ok & ~zero_group] == 0).sum())
        head = (f"advantage: {n_zero} rows of {n_groups} zero-variance groups are exactly 0" if n_zero
                else "advantage: no zero-variance groups")
        note = f"{int(ok.sum())} rows scored"
        if other_zero:
            note += f", {other_zero} other rows exactly 0"
        missing = int((~ok).sum())
        if missing:
            note += f", {missing} not scored (NaN)"
        out.set_title(f"{head}\n{note}", fontsize="medium")
        from matplotlib.patches import Patch

        drawn = ok & ~zero_group
        handles = [Patch(color=colors[c], label=f"{c} ({int((drawn & (labels == c)).sum())})") for c in order
                   if by is not None and (drawn & (labels == c)).any()]
        handles.append(Patch(color=ZERO_STD_COLOR, label=f"zero-variance group ({n_zero})"))
        legend(out, handles=handles, title=by)
        return out

    # -- 5. pass@k ---------------------------------------------------------------------------------
    def pass_at_k(
        self,
        k: int | Sequence[int] | None = None,
        *,
        correct: str = "reward",
        threshold: float = 1.0,
        ax: Axes | None = None,
    ) -> Axes:
        """The mean pass@k over prompt groups against k, from `res.pass_at_k`, on a log-2 k axis;
        returns the Axes.

        Args:
            k: the ks to plot (an int or a list, as for `res.pass_at_k`); default every k from 1
                to n, the number of samples per prompt (the smallest group's when they differ).
            correct: the column that says a sample is correct: a bool column, or a numeric one
                where value >= `threshold` counts (NaN never does).
            threshold: see `correct`.
            ax: axes to draw into.
        """
        require_matplotlib()
        from ._groups import group_keys

        df = self._res.df
        _require(df, correct)
        sizes = df.groupby(group_keys(df), sort=False).size()
        n_min, n_max = int(sizes.min()), int(sizes.max())
        ks = list(range(1, n_min + 1)) if k is None else [k] if isinstance(k, int) else list(k)
        if not ks:
            raise ValueError("k is empty: give at least one k, or None for 1..n")
        too_big = [v for v in ks if isinstance(v, int) and v > n_max]
        if too_big:
            raise ValueError(f"k = {too_big[0]} is more than the {n_max} samples per prompt")
        values = self._res.pass_at_k(ks, correct=correct, threshold=threshold).to_numpy(dtype=np.float64)
        out = new_axes(ax)
        out.plot(ks, values, marker="o", color="tab:green", linewidth=1.5)
        out.set_xscale("log", base=2)
        from matplotlib.ticker import FuncFormatter, NullLocator

        powers = [2 ** i for i in range(int(math.log2(max(ks))) + 1)]
        ticks = sorted(set(ks)) if len(set(ks)) <= 8 else powers
        out.set_xticks(ticks)
        out.xaxis.set_minor_locator(NullLocator())
        out.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
        if len(ks) > 1:
            out.set_xlim(min(ks) / 1.15, max(ks) * 1.15)
        out.set_ylim(0.0, 1.08)
        for kk, value in zip(ks, values):
            if math.isfinite(value) and (kk in ticks or kk == max(ks)):
                out.annotate(f"{value:.2f}", (kk, value), textcoords="offset points", xytext=(0, 7),
                             ha="center", fontsize="small")
        out.grid(True, axis="y", alpha=0.3)
        out.set_xlabel("k (samples per prompt)")
        out.set_ylabel("pass@k (mean over prompts)")
        rule = f"{correct} is True" if df[correct].dtype == bool else f"{correct} ≥ {threshold:g}"
        shape = f"{len(sizes)} prompts × {n_min} samples" if n_min == n_max else \
            f"{len(sizes)} prompts × {n_min}–{n_max} samples"
        unscored = int(df[correct].isna().sum())
        note = shape + (f"; {unscored} rows not scored count as wrong" if unscored else "")
        out.set_title(f"pass@k, correct: {rule}\n{note}", fontsize="medium")
        return out


# -- columns ---------------------------------------------------------------------------------------
def _require(df: pd.DataFrame, column: str) -> None:
    """A ValueError that says what to do when `column` is missing."""
    if column in df.columns:
        return
    import difflib

    from ..rewards._summary import reward_functions

    guess = difflib.get_close_matches(column, [str(c) for c in df.columns], n=1)
    if guess:
        raise ValueError(f"no column {column!r} to plot; did you mean {guess[0]!r}?")
    if not reward_functions(df) and "reward" not in df.columns:
        raise ValueError(f"no column {column!r}: these rollouts have no reward columns yet; "
                         "add rewards first: res.add_rewards(...)")
    numeric = [str(c) for c in df.select_dtypes("number").columns]
    raise ValueError(f"no column {column!r} to plot; numeric columns: {', '.join(numeric)}")


def _reward_columns(df: pd.DataFrame, funcs: str | Sequence[str] | None) -> list[str]:
    from ..rewards._summary import reward_functions

    names = reward_functions(df)
    if funcs is None:
        if not names:
            raise ValueError("these rollouts have no reward columns yet; add rewards first: res.add_rewards(...)")
        return [f"reward_{n}" for n in names]
    wanted = [funcs] if isinstance(funcs, str) else list(funcs)
    if not wanted:
        raise ValueError("funcs is empty: name at least one reward function, or pass None for all")
    columns = []
    for name in wanted:
        column = name if name == "reward" or (name.startswith("reward_") and name in df.columns) else f"reward_{name}"
        if column not in df.columns:
            import difflib

            known = [*names, "reward"] if "reward" in df.columns else names
            if not known:
                raise ValueError(f"no reward function {name!r}: these rollouts have no reward columns yet; "
                                 "add rewards first: res.add_rewards(...)")
            guess = difflib.get_close_matches(name.removeprefix("reward_"), known, n=1)
            hint = f"did you mean {guess[0]!r}? " if guess else ""
            raise ValueError(f"no reward function {name!r}; {hint}(scored: {', '.join(map(repr, known))})")
        columns.append(column)
    return columns


def _split(df: pd.DataFrame, by: str | None) -> tuple[np.ndarray, list[str], dict[str, str]]:
    """Each row's category in `by` (as text), the categories in legend order, and their colours."""
    if by is None:
        return np.full(len(df), "", dtype=object), [""], {"": _PLAIN_COLOR}
    _require(df, by)
    labels = df[by].astype(str).to_numpy(dtype=object)
    present = set(labels.tolist())
    if len(present) > _MAX_CATEGORIES:
        raise ValueError(f"{by!r} has {len(present)} distinct values; plots split by at most {_MAX_CATEGORIES} "
                         "(pass by=None, or a column with fewer values)")
    if by == "finish_reason":
        order = [r for r in FINISH_COLORS if r in present] + sorted(present - set(FINISH_COLORS))
        others = iter(_OTHER_COLORS)
        colors = {r: FINISH_COLORS[r] if r in FINISH_COLORS else next(others) for r in order}
    else:
        order = sorted(present)
        colors = dict(zip(order, _CATEGORY_COLORS))
    return labels, order, colors


def _category_handles(order: list[str], colors: dict[str, str], labels: np.ndarray) -> list[Any]:
    """Legend entries for the categories, each with its number of rows in `labels`."""
    from matplotlib.patches import Patch

    return [Patch(color=colors[c], label=f"{c} ({int((labels == c).sum())})") for c in order]


def _scored_note(df: pd.DataFrame, column: str) -> str:
    """'120 rows scored, 8 not scored (5 none, 3 error)': NaN rows, by status where known."""
    values = df[column].to_numpy(dtype=np.float64)
    missing = ~np.isfinite(values)
    note = f"{int((~missing).sum())} rows scored"
    if not missing.any():
        return note
    note += f", {int(missing.sum())} not scored"
    status = f"{column}_status"
    if status in df.columns:
        counts = df.loc[missing, status].astype(str).value_counts()
        note += " (" + ", ".join(f"{n} {s}" for s, n in counts.items()) + ")"
    return note


def _count_zero_groups(df: pd.DataFrame, zero_rows: np.ndarray) -> int:
    from ._groups import group_keys

    return len(set(group_keys(df)[zero_rows].tolist()))


# -- values and bins -------------------------------------------------------------------------------
def _discrete(values: np.ndarray) -> np.ndarray | None:
    """The distinct values when there are few and each repeats (a 0/1 or 0/0.5/1 reward), else None."""
    uniq = np.unique(values)
    if 0 < len(uniq) <= _MAX_DISCRETE and len(values) >= 2 * len(uniq):
        return uniq
    return None


def _span(uniq: np.ndarray) -> float:
    return float(uniq[-1] - uniq[0]) if len(uniq) > 1 else 0.0


def _min_gap(uniq: np.ndarray) -> float:
    if len(uniq) < 2:
        return max(1.0, abs(float(uniq[0]))) if len(uniq) else 1.0
    return float(np.diff(uniq).min())


def _edges(values: np.ndarray, bins: int | Sequence[float] | str, *, centre_zero: bool = False) -> np.ndarray:
    """Histogram bin edges (at most _MAX_BINS for a rule); with centre_zero, one bin is centred on 0."""
    if isinstance(bins, bool) or (isinstance(bins, int) and bins < 1):
        raise ValueError(f"bins must be an int >= 1, edges, or a numpy rule such as 'auto', got {bins!r}")
    if not isinstance(bins, (str, int)):
        return np.asarray(bins, dtype=np.float64)
    edges = np.histogram_bin_edges(values, bins=bins)
    if isinstance(bins, str) and len(edges) - 1 > _MAX_BINS:
        edges = np.histogram_bin_edges(values, bins=_MAX_BINS)
    if not centre_zero:
        return edges
    lo, hi = float(values.min()), float(values.max())
    width = float(edges[1] - edges[0]) if hi > lo else max(abs(lo), 1.0) * 0.1
    first, last = math.floor(lo / width + 0.5), math.floor(hi / width + 0.5)
    return (np.arange(first, last + 2, dtype=np.float64) - 0.5) * width


def _stacked_hist(ax: Axes, edges: np.ndarray, groups: list[np.ndarray], order: list[str],
                  colors: dict[str, str]) -> None:
    bottom = np.zeros(len(edges) - 1)
    for values, c in zip(groups, order):
        counts, _ = np.histogram(values, bins=edges)
        some = counts > 0  # no empty bars: they would pin the y limit to the top of the stack
        if some.any():
            ax.bar(edges[:-1][some], counts[some], width=np.diff(edges)[some], bottom=bottom[some], align="edge",
                   color=colors[c], edgecolor="white", linewidth=0.5, label=c)
        bottom = bottom + counts


def _stacked_bars(ax: Axes, uniq: np.ndarray, groups: list[np.ndarray], order: list[str],
                  colors: dict[str, str]) -> None:
    """One bar per distinct value, stacked by category."""
    width = max(0.8 * _min_gap(uniq), 0.015 * _span(uniq)) if len(uniq) > 1 else 0.5 * _min_gap(uniq)
    bottom = np.zeros(len(uniq))
    for values, c in zip(groups, order):
        counts = np.array([(values == v).sum() for v in uniq], dtype=np.float64)
        some = counts > 0
        if some.any():
            ax.bar(uniq[some], counts[some], width=width, bottom=bottom[some], color=colors[c], edgecolor="white",
                   linewidth=0.5, label=c)
        bottom = bottom + counts
    if len(uniq) == 1 or _min_gap(uniq) >= _span(uniq) / 12:
        ax.set_xticks(uniq, [f"{v:.3g}" for v in uniq])
