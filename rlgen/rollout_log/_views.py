"""Views of a rollout log: the trend across steps, its plot, the notebook summary, SQL.

Owns: `trend_table` (one row per step from a few light columns: rows, mean reward, pass rate,
mean completion length, finish-reason shares, the share of prompt groups with zero variance),
the same from per-part summaries (`part_summary`: the sums and counts the trend needs of one
part's rows, small enough to keep beside the part; `summary_trend`: the trend from them, equal to
`trend_table` on the same rows, sums in another order aside),
`LogPlots.trend` (those as panels across steps, a step marked on request), `log_html` (what a log
holds, in a few lines, for a notebook cell: no script, so it reads the same untrusted) and
`run_sql` (DuckDB over a DataFrame, optional). Knows nothing about files or reward versions: the
log hands over the rows and values to draw.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ..rewards._group_stats import group_arrays

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

__all__ = ["SUMMARY_VERSION", "LogPlots", "LogView", "log_html", "part_summary", "run_sql", "summary_trend", "trend_table"]

SUMMARY_VERSION = 1


class LogView(Protocol):
    """What the views read of a log (`RolloutLog` has it; the views never import it)."""

    @property
    def path(self) -> str: ...
    @property
    def source(self) -> str: ...
    @property
    def notes(self) -> list[str]: ...
    @property
    def steps(self) -> list[int]: ...
    def missing_steps(self) -> list[int]: ...
    def parts(self) -> pd.DataFrame: ...
    def versions(self) -> pd.DataFrame: ...
    def trend(self, *, version: str = ..., reward: str = ..., threshold: float = ...) -> pd.DataFrame: ...
    def __len__(self) -> int: ...


def trend_table(rows: pd.DataFrame, reward: np.ndarray, *, threshold: float) -> pd.DataFrame:
    """Per step (rows with `step`, `part`, `prompt_index`, `completion_tokens`, `finish_reason`,
    aligned with `reward`): rows, reward (mean of the finite ones), pass_rate (reward >= threshold
    among them), scored (their count), completion_tokens (mean), finish_<reason> shares, and
    zero_std_share (prompt groups whose finite rewards are all equal, of groups with two or more)."""
    import pandas as pd

    if not len(rows):
        return pd.DataFrame(columns=["rows", "reward", "pass_rate", "scored", "completion_tokens", "zero_std_share"],
                            index=pd.Index([], name="step"))
    groups = pd.MultiIndex.from_arrays([rows["part"], rows["prompt_index"]]).factorize()[0]
    stats = group_arrays(reward, groups)
    finite = np.isfinite(reward)
    frame = pd.DataFrame({"step": rows["step"].to_numpy(), "reward": np.where(finite, reward, np.nan),
                          "passed": np.where(finite, reward >= threshold, np.nan), "scored": finite,
                          "completion_tokens": rows["completion_tokens"].to_numpy(dtype=float)})
    by = frame.groupby("step", sort=True)
    out = pd.DataFrame({"rows": by.size(), "reward": by["reward"].mean(), "pass_rate": by["passed"].mean(),
                        "scored": by["scored"].sum(), "completion_tokens": by["completion_tokens"].mean()})
    reasons = pd.crosstab(rows["step"].to_numpy(), rows["finish_reason"].fillna("none").to_numpy(), normalize="index")
    out = out.join(reasons.add_prefix("finish_").rename_axis(index="step", columns=None))
    first = ~pd.Series(groups).duplicated().to_numpy()
    counted = first & (stats.count >= 2)
    zero = pd.DataFrame({"step": rows["step"].to_numpy()[counted], "zero": stats.zero_std[counted]})
    out["zero_std_share"] = zero.groupby("step")["zero"].mean()
    return out


def part_summary(rows: pd.DataFrame, reward: np.ndarray | None, *, threshold: float) -> dict[str, Any]:
    """What `trend_table` needs of one part's rows (one step; `prompt_index`, `completion_tokens`,
    `finish_reason`), as JSON-ready sums and counts: rows, and of `reward` (None: the part has no
    reward column) the finite count, sum and passes (>= `threshold`), the completion-token sum and
    count (non-missing), finish-reason counts, and prompt groups of two or more scored rows and
    how many of them have zero variance. Parts add up: a step's trend is the sums of its parts'."""
    import pandas as pd

    tokens = rows["completion_tokens"].to_numpy(dtype=float)
    known = ~np.isnan(tokens)
    reasons = rows["finish_reason"].fillna("none").astype(str).value_counts()
    out: dict[str, Any] = {"summary": SUMMARY_VERSION, "rows": len(rows), "threshold": threshold,
                           "tokens_sum": float(tokens[known].sum()), "tokens_n": int(known.sum()),
                           "finish": {str(k): int(v) for k, v in reasons.items()}, "reward": None}
    if reward is not None:
        finite = np.isfinite(reward)
        groups = pd.Series(rows["prompt_index"].to_numpy()).factorize()[0]
        stats = group_arrays(reward, groups)
        first = ~pd.Series(groups).duplicated().to_numpy()
        counted = first & (stats.count >= 2)
        out["reward"] = {"scored": int(finite.sum()), "sum": float(reward[finite].sum()),
                         "passed": int((reward[finite] >= threshold).sum()), "groups": int(counted.sum()),
                         "zero_std": int(stats.zero_std[counted].sum())}
    return out


def summary_trend(summaries: list[tuple[int, dict[str, Any]]]) -> pd.DataFrame:
    """The trend (`trend_table`'s columns) from (step, `part_summary`) pairs, one per part, each with
    a reward. A step's shares are its parts' counts over its parts' rows."""
    import pandas as pd

    if not summaries:
        return trend_table(pd.DataFrame(), np.array([]), threshold=1.0)
    reasons = sorted({r for _, s in summaries for r in s["finish"]})
    flat = pd.DataFrame([{"step": step, "rows": s["rows"], "scored": s["reward"]["scored"], "sum": s["reward"]["sum"],
                          "passed": s["reward"]["passed"], "tokens_sum": s["tokens_sum"], "tokens_n": s["tokens_n"],
                          "groups": s["reward"]["groups"], "zero_std": s["reward"]["zero_std"],
                          **{f"finish_{r}": s["finish"].get(r, 0) for r in reasons}} for step, s in summaries])
    by = flat.groupby("step", sort=True).sum()
    scored = by["scored"].where(by["scored"] > 0)
    out = pd.DataFrame({"rows": by["rows"].astype(np.int64), "reward": by["sum"] / scored,
                        "pass_rate": by["passed"] / scored, "scored": by["scored"].astype(np.int64),
                        "completion_tokens": by["tokens_sum"] / by["tokens_n"].where(by["tokens_n"] > 0)})
    for r in reasons:
        out[f"finish_{r}"] = by[f"finish_{r}"] / by["rows"]
    out["zero_std_share"] = by["zero_std"] / by["groups"].where(by["groups"] > 0)
    out.index.name = "step"
    return out


class LogPlots:
    """`log.plot`: plots of a rollout log across steps (matplotlib, `pip install 'rlgen[plots]'`)."""

    def __init__(self, log: LogView) -> None:
        self._log = log

    def __repr__(self) -> str:
        return "log.plot: .trend()"

    def trend(self, *, version: str = "logged", reward: str = "reward", threshold: float = 1.0,
              mark: int | None = None) -> Figure:
        """Four panels across steps: mean reward and pass rate, mean completion length, finish-reason
        shares, the share of zero-variance prompt groups. `mark`: a step to draw a line at (e.g.
        where two reward versions part ways). Pick a step there, then `log.load(step)` for its rows."""
        from ..rollouts._figures import legend, panels, require_matplotlib

        require_matplotlib()
        table = self._log.trend(version=version, reward=reward, threshold=threshold)
        fig, axes = panels(4)
        steps = table.index.to_numpy()
        axes[0].plot(steps, table["reward"], marker=".", label=f"mean {reward}")
        passing = bool(table["pass_rate"].fillna(0).gt(0).any())
        if passing:  # a graded reward that never reaches `threshold` would draw a line at 0 that says nothing
            axes[0].plot(steps, table["pass_rate"], marker=".", linestyle="--", label=f"pass rate (>= {threshold:g})")
        axes[0].set_title(f"reward ({version})" + ("" if passing else f"; no row reaches {threshold:g}"),
                          fontsize="medium")
        legend(axes[0])
        axes[1].plot(steps, table["completion_tokens"], marker=".", color="0.3")
        axes[1].set_title("mean completion tokens", fontsize="medium")
        for column in [c for c in table.columns if c.startswith("finish_")]:
            axes[2].plot(steps, table[column], marker=".", label=column[len("finish_"):])
        axes[2].set_title("finish reasons (share)", fontsize="medium")
        legend(axes[2])
        axes[3].plot(steps, table["zero_std_share"], marker=".", color="#b35a00")
        axes[3].set_title("zero-variance groups (share)", fontsize="medium")
        for ax in axes:
            ax.set_xlabel("step")
            if mark is not None:
                ax.axvline(mark, color="#c0392b", linewidth=1, linestyle=":")
        return fig


def log_html(log: LogView) -> str:
    """A few lines on what the log holds: where, steps (and missing ones), rows, versions, notes."""
    steps = log.steps
    missing = log.missing_steps()
    versions = log.versions()
    span = f"{steps[0]}..{steps[-1]} ({len(steps)} logged)" if steps else "none yet"
    lines = [f"<b>RolloutLog</b> <code>{html.escape(log.path)}</code> · source {html.escape(log.source)}",
             f"steps {span}" + (f" · <span style='color:#b35a00'>{len(missing)} missing from the stride: "
                                f"{html.escape(_short(missing))}</span>" if missing else ""),
             f"{len(log):,} rows in {len(log.parts())} parts",
             "reward versions: " + ", ".join(html.escape(str(v)) for v in versions["version"])]
    lines += [f"<span style='color:#555'>note: {html.escape(n)}</span>" for n in log.notes]
    return "<div style='font-family:sans-serif;font-size:13px;line-height:1.5'>" + "<br>".join(lines) + "</div>"


def _short(values: list[int], limit: int = 12) -> str:
    shown = ", ".join(map(str, values[:limit]))
    return shown + (f", ... ({len(values)} in all)" if len(values) > limit else "")


def run_sql(rows: pd.DataFrame, query: str) -> pd.DataFrame:
    """`query` over `rows` as the table `rows`, by DuckDB; returns pandas."""
    try:
        import duckdb
    except ImportError as err:
        raise ImportError("SQL over a log needs DuckDB: pip install 'rlgen[sql]'") from err
    con = duckdb.connect()
    try:
        con.register("rows", rows)
        result: Any = con.execute(query).df()
        return result
    finally:
        con.close()
