"""Reading scored rollouts: per-group statistics, pass@k, and a summary that says what looks wrong.

Owns: the per-prompt table (`group_table`: n, mean, std, zero-std flag, pass@k), the pass@k
curve, and `RewardSummary`: per reward function its mean and std, the fractions of each status
with the commonest error, the p95 call time, the fraction of zero-variance groups, the
correlation with completion length and the mean by finish reason, plus plain-language flags.
Knows nothing about how the rewards were computed: it reads the columns `rewards._scoring` wrote.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core._columns import scored_reward_names
from . import _group_stats

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["RewardSummary", "correct_mask", "correlation", "group_table", "reward_functions", "summarize"]

_STATUSES = ("ok", "none", "error", "timeout", "bad_return", "skipped", "cancelled")


def reward_functions(df: pd.DataFrame) -> list[str]:
    """The names of the reward functions whose columns `df` has, in column order."""
    return scored_reward_names(df.columns)


def correct_mask(df: pd.DataFrame, correct: str, threshold: float) -> np.ndarray:
    """Which rows count as correct: a bool column as it is, a numeric one where value >= threshold
    (NaN is never correct)."""
    if correct not in df.columns:
        import difflib

        guess = difflib.get_close_matches(correct, [str(c) for c in df.columns], n=1)
        hint = f"; did you mean {guess[0]!r}?" if guess else ""
        raise ValueError(f"no column {correct!r} to judge correctness by{hint} (add rewards first: res.add_rewards(...))")
    values = df[correct]
    if values.dtype == bool:
        return np.asarray(values.to_numpy(dtype=bool))
    numbers = values.to_numpy(dtype=np.float64)
    with np.errstate(invalid="ignore"):
        return np.asarray(numbers >= threshold)


def group_table(df: pd.DataFrame, groups: np.ndarray, *, reward: str, correct: str | None, threshold: float,
                ks: Sequence[int]) -> pd.DataFrame:
    """One row per prompt group: n, mean, std, zero_std, and pass@k per k when `correct` is given."""
    import pandas as pd

    if reward not in df.columns:
        raise ValueError(f"no column {reward!r}; add rewards first: res.add_rewards(...)")
    r = df[reward].to_numpy(dtype=np.float64)
    stats = _group_stats.group_arrays(r, groups)
    frame = pd.DataFrame({"group": groups, "prompt_index": df["prompt_index"].to_numpy(), "mean": stats.mean,
                          "std": stats.std, "zero_std": stats.zero_std, "n_scored": stats.count})
    if "run" in df.columns:
        frame.insert(1, "run", df["run"].to_numpy())
    out = frame.groupby("group", sort=False).first()
    out.insert(out.columns.get_loc("mean"), "n", frame.groupby("group", sort=False).size())
    if correct is not None:
        ok = correct_mask(df, correct, threshold)
        c = pd.Series(ok, index=frame.index).groupby(frame["group"], sort=False).sum()
        out["correct"] = c.astype(int)
        for k in ks:
            out[f"pass@{k}"] = [_group_stats.pass_at_k(int(n), int(ci), int(k)) for n, ci in zip(out["n"], c)]
    return out.reset_index(drop=True)


@dataclass
class RewardSummary:
    """`res.reward_summary()`: a table per reward function and flags in plain language."""

    table: pd.DataFrame
    flags: list[str] = field(default_factory=list)

    def __repr__(self) -> str:
        """The flags first (what to act on), then the table."""
        lines = [f"⚠ {flag}" for flag in self.flags] or ["✓ no flags: nothing looks wrong"]
        return "\n".join([*lines, "", self._display_table().to_string()])

    def _repr_html_(self) -> str:
        """The flags first, as warnings (⚠, amber), then the table; inline styles only, so an
        untrusted notebook shows them the same."""
        if self.flags:
            flags = "".join(f'<div style="color:#a35200;font-weight:bold;margin:2px 0">⚠ {html.escape(f)}</div>'
                            for f in self.flags)
        else:
            flags = '<div style="color:#2a7;margin:2px 0">✓ no flags: nothing looks wrong</div>'
        return (f'<div class="rlgen-reward-summary" style="white-space:normal;line-height:1.4">'
                f'<div style="margin-bottom:6px">{flags}</div>{self._display_table().to_html(escape=True)}</div>')

    def _display_table(self) -> pd.DataFrame:
        """The table turned on its side (a column per function, so it fits a notebook's width),
        rounded, with fractions as percentages and status rows that are 0 everywhere left out."""
        table = self.table
        keep = [c for c in table.columns
                if not (c.startswith("frac_") and c != "frac_zero_std_groups" and not table[c].fillna(0).any())]
        shown = table[keep].T.astype(object)
        for name in shown.index:
            percent = str(name).startswith("frac_")
            shown.loc[name] = [_cell(v, percent=percent) for v in shown.loc[name]]
        shown = shown[(shown != "").any(axis=1)]
        shown.index = [str(i).replace("frac_", "% ").replace("_", " ") for i in shown.index]
        return shown


def _cell(value: Any, *, percent: bool) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, (int, float, np.floating)):
        return f"{100 * value:.0f}%" if percent else f"{value:.3g}"
    text = str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def summarize(df: pd.DataFrame, groups: np.ndarray) -> RewardSummary:
    """Per reward function (and the combined `reward`): what the rollouts' reward columns say."""
    import pandas as pd

    names = reward_functions(df)
    if not names:
        raise ValueError("these rollouts have no reward columns; add them first: res.add_rewards(...)")
    rows = []
    flags: list[str] = []
    lengths = df["completion_tokens"].to_numpy(dtype=np.float64)
    finish = df["finish_reason"].astype(str).to_numpy()
    for name in [*names, None]:
        col = "reward" if name is None else f"reward_{name}"
        if col not in df.columns:
            continue
        values = df[col].to_numpy(dtype=np.float64)
        label = name or "reward (combined)"
        row: dict[str, Any] = {"function": label, "mean": np.nanmean(values) if np.isfinite(values).any() else math.nan,
                               "std": np.nanstd(values, ddof=1) if np.isfinite(values).sum() > 1 else math.nan}
        if name is not None:
            status = df[f"{col}_status"].astype(str)
            for s in _STATUSES:
                row[f"frac_{s}"] = float((status == s).mean())
            errors = df.loc[status.isin(["error", "timeout", "bad_return"]), f"{col}_error"].dropna()
            row["commonest_error"] = errors.value_counts().index[0] if len(errors) else None
            seconds = df[f"{col}_seconds"].to_numpy(dtype=np.float64)
            row["p95_seconds"] = float(np.nanpercentile(seconds, 95)) if np.isfinite(seconds).any() else math.nan
            flags += _status_flags(label, row, status, df[f"{col}_error"].dropna())
        stats = _group_stats.group_arrays(values, groups)
        unique_groups = ~pd.Series(groups).duplicated().to_numpy()
        scored = unique_groups & (stats.count >= 2)
        row["frac_zero_std_groups"] = float(stats.zero_std[scored].mean()) if scored.any() else math.nan
        row["corr_length"] = correlation(values, lengths)
        by_finish = {f: float(np.nanmean(values[finish == f])) for f in ("stop", "length")
                     if np.isfinite(values[finish == f]).any()}
        row["mean_if_stop"] = by_finish.get("stop", math.nan)
        row["mean_if_length"] = by_finish.get("length", math.nan)
        flags += _value_flags(label, row, values, finish)
        rows.append(row)
    return RewardSummary(pd.DataFrame(rows).set_index("function"), flags)


def correlation(x: np.ndarray, y: np.ndarray) -> float:
    ok = np.isfinite(x) & np.isfinite(y)
    if ok.sum() < 3 or np.std(x[ok]) == 0 or np.std(y[ok]) == 0:
        return math.nan
    return float(np.corrcoef(x[ok], y[ok])[0, 1])


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%" if x >= 0.01 else f"{100 * x:.1f}%"


def _status_flags(label: str, row: dict[str, Any], status: pd.Series, errors: pd.Series) -> list[str]:
    flags = []
    for s, what in (("error", "raised {}"), ("timeout", "timed out ({})"), ("bad_return", "could not be used: {}")):
        frac = row[f"frac_{s}"]
        if frac > 0:
            common = errors[status.loc[errors.index] == s]
            example = common.value_counts().index[0] if len(common) else s
            flags.append(f"{label}: {_pct(frac)} of rows {what.format(example)}")
    if row["frac_none"] >= 0.1:
        flags.append(f"{label}: returned None for {_pct(row['frac_none'])} of rows (no answer found? those rows "
                     "get NaN, not 0)")
    if row["frac_skipped"] > 0:
        skipped = errors[status.loc[errors.index] == "skipped"]
        why = str(skipped.iloc[0]).removeprefix("Skipped: ") if len(skipped) else "stopped after repeated timeouts"
        flags.append(f"{label}: {why}; {_pct(row['frac_skipped'])} of rows were not scored ('skipped')")
    if row["frac_cancelled"] > 0:
        flags.append(f"{label}: {_pct(row['frac_cancelled'])} of rows were not scored (interrupted)")
    return flags


def _value_flags(label: str, row: dict[str, Any], values: np.ndarray, finish: np.ndarray) -> list[str]:
    flags = []
    finite = values[np.isfinite(values)]
    if finite.size >= 2 and np.all(finite == finite[0]):
        flags.append(f"{label}: every scored row got {finite[0]:g}: the reward cannot tell samples apart")
    elif row["frac_zero_std_groups"] >= 0.5:
        flags.append(f"{label}: {_pct(row['frac_zero_std_groups'])} of prompt groups give every sample the same "
                     "reward: their GRPO advantage is 0 and they teach nothing")
    if abs(row["corr_length"]) >= 0.5:
        flags.append(f"{label}: reward correlates with completion length (r = {row['corr_length']:.2f})")
    stop, length = row["mean_if_stop"], row["mean_if_length"]
    n_stop, n_length = int((finish == "stop").sum()), int((finish == "length").sum())
    if n_stop >= 3 and n_length >= 3 and np.isfinite(stop) and np.isfinite(length):
        spread = float(np.nanstd(values)) or 1.0
        if length - stop > 0.25 * spread:
            flags.append(f"{label}: truncated completions score higher than finished ones "
                         f"({length:.3g} vs {stop:.3g}, {n_length} vs {n_stop} rows)")
    return flags
