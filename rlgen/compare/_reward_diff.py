"""`reward_diff`: two versions of a reward over the rows of a training run's log, side by side; `RewardDiff`.

Owns: the comparison of two scorings of the same rows (a reward as logged during training and the
same rows re-scored by a stricter or fixed function, or any two versions): the rows whose score
changed, the GRPO prompt groups that start or stop carrying a gradient, each row's advantage under
both (GRPO, Dr.GRPO, RLOO), per step the means, pass rates and their paired difference with an
interval over prompt groups, the first step where the two part ways, and `RewardDiff` with its text,
HTML and plot. Knows nothing about the log's files, its versions, how the rows were sampled or how
the rewards were computed: it reads one DataFrame of rows and two DataFrames of scores aligned with
it. The group arithmetic is `rewards._group_stats`', the intervals `compare._intervals`', the HTML
styles `rollouts._display`'s and the figures `rollouts._figures`'.

Conventions:
- A prompt group is the rows of one part (one logged call) with one prompt_index: the key is
  (part, prompt_index), as the trainer formed its GRPO groups. A part belongs to one step.
- A NaN reward is a row not scored (or whose reward failed). NaN under both versions is no change;
  NaN under one and a number under the other is a change (its delta is NaN). A caller that knows
  which rows a version never scored (a log: the parts a re-score has not reached) leaves them out
  of `rows`, `a` and `b` and says so in `notes`, which the result carries and shows.
- A score changed when it is not exactly equal (no tolerance: a change of 1e-7 is a change).
- The unit of the per-step interval is the prompt group, not the row: a group's samples share a
  prompt and are not independent. Each group is reduced to the difference of its means (B's mean
  minus A's, each over the group's finite rewards: the mean GRPO centres on), and the interval is
  over those differences. Groups with no finite reward under a version are left out.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..rewards._group_stats import AdvantageMethod, group_arrays
from ..rewards._group_stats import advantages as group_advantages
from ._intervals import BOOTSTRAP_RESAMPLES, bootstrap_interval, t_interval

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes

    from ..rollouts._browser import RolloutBrowser
    from ..rollouts._rollouts import Rollouts

__all__ = ["RewardDiff", "reward_diff"]

STARTS = "starts carrying gradient"
STOPS = "stops carrying gradient"
_ROW_COLUMNS = ("step", "part", "row", "prompt_index", "prompt_key")
_CONTEXT_COLUMNS = ("prompt", "completion", "finish_reason", "completion_tokens")  # copied into `changed` when present
_METHODS: tuple[AdvantageMethod, ...] = ("grpo", "drgrpo", "rloo")
_INTERVALS = ("t", "bootstrap")
_RESERVED = (*_ROW_COLUMNS, *_CONTEXT_COLUMNS, "delta")  # `changed`'s other columns: no version may be named so
_TOP_ROWS = 10       # changed rows shown in the HTML view
_CLIP_COMPLETION = 160
_CLIP_PROMPT = 60


def reward_diff(
    rows: pd.DataFrame,
    a: pd.DataFrame,
    b: pd.DataFrame,
    *,
    names: Sequence[str] = ("logged", "strict"),
    reward: str = "reward",
    threshold: float = 1.0,
    confidence: float = 0.9,
    interval: str = "t",
    min_prompts: int = 2,
    seed: int = 0,
    loader: Callable[[pd.DataFrame], Rollouts] | None = None,
    notes: Sequence[str] = (),
) -> RewardDiff:
    """Two versions of a reward over the same rows, side by side.

    Args:
        rows: one row per sample, with columns `step` (int), `part` (str: the logged call the row
            came from), `row` (its position in that part), `prompt_index` (rows of one part with
            one prompt_index are a GRPO prompt group), `prompt_key` (str); and where present
            `prompt`, `completion`, `finish_reason`, `completion_tokens` (shown with changed rows).
        a, b: the scores under versions A and B, aligned with `rows` (same length, same index),
            each with the column `reward` (float; NaN: not scored, or the reward failed).
        names: what to call A and B: column names in the tables, labels in the views. Two
            different strings, none of `changed`'s other column names.
        reward: the column of a and b to compare.
        threshold: a row passes when its reward >= threshold (NaN never passes).
        confidence: the interval's nominal coverage (0.9: a 90% interval).
        interval: "t": a paired t interval over the per-group mean differences of a step (mean ±
            Student's t quantile × standard error). "bootstrap": a percentile bootstrap over the
            step's prompt groups (2000 resamples, seeded by `seed` and the step, so reproducible).
            "t" is the default because `compare._ab`'s simulation found the percentile bootstrap
            too narrow at ~10 prompts (84-85% coverage for a nominal 90%, the t interval 88-90%).
        min_prompts: steps with fewer prompt groups scored under both versions get no interval
            (NaN) and never count as diverged; at least 2.
        seed: the bootstrap's seed (an int >= 0); unused by "t".
        loader: reads rows named by `part` and `row` back as a result, for `RewardDiff.browse`
            (a log passes its `load_rows`).
        notes: what the caller left out of the comparison (a log: the steps a version has not
            scored), one line each; kept as `RewardDiff.notes` and shown with the summary.

    Returns:
        A `RewardDiff` (see there): `changed`, `groups` and `flips`, `advantages`, `per_step`,
        `diverged_at`, `sustained_from`, `summary()`, `plot()`, and an HTML view.

    Raises:
        TypeError: rows, a or b is not a DataFrame.
        ValueError: a or b not aligned with rows, a missing column, a non-numeric reward, equal or
            reserved names, or an option out of range; the message says what to pass.
    """
    _check_frames(rows, a, b, reward=reward)
    pair = _check_options(names, threshold=threshold, confidence=confidence, interval=interval,
                          min_prompts=min_prompts, seed=seed)
    ra, rb = _scores(a, reward, "a"), _scores(b, reward, "b")
    keys = _group_keys(rows)
    groups = _group_table(rows, keys, ra, rb, pair)
    per_step = _per_step(rows, groups, ra, rb, pair, threshold=float(threshold), confidence=float(confidence),
                         interval=interval, min_prompts=min_prompts, seed=seed)
    diverged_at, sustained_from = _divergence(per_step)
    return RewardDiff(names=pair, reward=reward, rows=len(rows), changed=_changed(rows, ra, rb, pair), groups=groups,
                      advantages=_advantage_table(rows, keys, ra, rb, pair), per_step=per_step,
                      diverged_at=diverged_at, sustained_from=sustained_from, threshold=float(threshold),
                      confidence=float(confidence), interval=interval, min_prompts=min_prompts, seed=seed,
                      loader=loader, notes=tuple(str(n) for n in notes))


@dataclass(frozen=True, repr=False, eq=False)
class RewardDiff:
    """What `reward_diff` found; A and B stand for `names` in every column name.

    - `changed`: the rows whose score changed (NaN against a number counts, NaN against NaN does
      not): step, part, row, prompt_index, prompt_key, then prompt, completion, finish_reason,
      completion_tokens where rows has them, `<A>`, `<B>` (the two scores) and delta (B - A);
      sorted by |delta|, largest first, NaN deltas last; index 0..k-1.
    - `groups`: one row per prompt group (part, prompt_index), in step order: step, part,
      prompt_index, prompt_key, n (rows), and under each version n_<A> (finite rewards),
      mean_<A> (their mean) and zero_std_<A> (`rewards._group_stats.group_arrays`' flag: two or
      more finite rewards, all equal); then flip. A group carries a GRPO gradient when it has two
      or more finite rewards and is not zero_std; flip is "starts carrying gradient" when it does
      under B and not under A, "stops carrying gradient" the reverse, "" otherwise. For groups
      scored in full under both versions, "starts" is exactly zero_std under A and not under B.
      `flips`: only the flipped groups.
    - `advantages`: one row per row of rows (its index): step, part, row, prompt_index, then
      grpo_<A>, grpo_<B>, drgrpo_<A>, drgrpo_<B>, rloo_<A>, rloo_<B>, each
      `rewards._group_stats.advantages` over the groups (part, prompt_index).
    - `per_step`: one row per step: step, rows, groups (prompt groups with a finite mean under both
      versions: the interval's units), mean_<A>, mean_<B> (mean finite reward), pass_<A>, pass_<B>
      (share of finite rewards >= threshold), diff (the mean over groups of B's group mean minus
      A's: the interval's centre), low, high (its interval; NaN below `min_prompts` groups) and
      diverged (the interval excludes 0).
    - `diverged_at`: the first step whose interval excludes 0; `sustained_from`: the first step
      from which every step's interval, to the last, excludes 0 on the same side; None if none.
    - `names`, `reward`, `rows` (rows compared), `threshold`, `confidence`, `interval`,
      `min_prompts`, `seed`: the call's; `notes`: what the caller left out of the comparison
      (a log's diff: the steps and rows one version has not scored), one line each.
    """

    names: tuple[str, str]
    reward: str
    rows: int
    changed: pd.DataFrame
    groups: pd.DataFrame
    advantages: pd.DataFrame
    per_step: pd.DataFrame
    diverged_at: int | None
    sustained_from: int | None
    threshold: float
    confidence: float
    interval: str
    min_prompts: int
    seed: int
    # Reads rows named by part and row back as a result (the log's `load_rows`), for `browse`;
    # None where the diff was made from frames alone.
    loader: Callable[[pd.DataFrame], Rollouts] | None = None
    notes: tuple[str, ...] = ()

    def browse(self, *, top: int = 50, widgets: bool | None = None) -> RolloutBrowser:
        """The `top` changed rows (largest |delta| first) in the rollout browser, with both scores as
        columns (filter and slide on the newer one, `names[1]`) and `delta`. Needs a diff made by a
        log (`log.diff(...)`), which knows where the rows are."""
        from ..rollouts._browser import RolloutBrowser

        if self.loader is None:
            raise ValueError("this diff was made from frames, not by a log: browse a log's diff (log.diff(a, b).browse())")
        if not len(self.changed):
            raise ValueError(f"no row's score changed between {self.names[0]!r} and {self.names[1]!r}: nothing to browse")
        picked = self.changed.head(top)[["part", "row", *self.names, "delta"]]
        return RolloutBrowser(self.loader(picked), reward=self.names[1], widgets=widgets)

    @property
    def flips(self) -> pd.DataFrame:
        """The prompt groups that start or stop carrying a gradient (`groups` where flip is set)."""
        return self.groups[self.groups["flip"] != ""]

    @property
    def interval_note(self) -> str:
        """What the per-step interval is, in one line."""
        how = ("paired t interval" if self.interval == "t"
               else f"percentile bootstrap ({BOOTSTRAP_RESAMPLES} resamples, seed {self.seed})")
        return (f"{self.confidence * 100:g}% {how} of {self.names[1]} − {self.names[0]} over prompt groups; "
                f"none for steps with fewer than {self.min_prompts} groups")

    def summary(self) -> dict[str, Any]:
        """The headline facts, one per key: names, rows, changed, groups, starts_gradient,
        stops_gradient, steps, diverged_steps, diverged_at, sustained_from, interval, notes (what
        was left out of the comparison)."""
        flips = self.groups["flip"]
        return {"names": self.names, "rows": self.rows, "changed": len(self.changed), "groups": len(self.groups),
                "starts_gradient": int((flips == STARTS).sum()), "stops_gradient": int((flips == STOPS).sum()),
                "steps": len(self.per_step), "diverged_steps": int(self.per_step["diverged"].sum()),
                "diverged_at": self.diverged_at, "sustained_from": self.sustained_from, "interval": self.interval_note,
                "notes": list(self.notes)}

    def __repr__(self) -> str:
        s = self.summary()
        la, lb = self.names
        return (f"<RewardDiff {la} → {lb} ({self.reward}): {s['rows']} rows, {s['changed']} changed; "
                f"{s['groups']} prompt groups, {s['starts_gradient']} start and {s['stops_gradient']} stop carrying "
                f"gradient; {_divergence_text(self.diverged_at, self.sustained_from)} over {s['steps']} steps"
                + "".join(f"; {note}" for note in self.notes) + ">")

    def _repr_html_(self) -> str:
        """A summary table and the top changed rows; every text escaped, no scripts."""
        from ..rollouts._display import VIEW_STYLE

        s = self.summary()
        la, lb = (html.escape(x) for x in self.names)
        share = f" ({s['changed'] / s['rows']:.1%})" if s["rows"] else ""
        facts = [("rows compared", str(s["rows"])), ("rows changed", f"{s['changed']}{share}"),
                 ("prompt groups", str(s["groups"])),
                 ("start carrying gradient", str(s["starts_gradient"])),
                 ("stop carrying gradient", str(s["stops_gradient"])),
                 ("steps diverged", f"{s['diverged_steps']} of {s['steps']}"),
                 ("diverged at", "—" if self.diverged_at is None else f"step {self.diverged_at}"),
                 ("sustained from", "—" if self.sustained_from is None else f"step {self.sustained_from}")]
        table = "".join(f"<tr><th style='text-align:left'>{k}</th><td>{html.escape(v)}</td></tr>" for k, v in facts)
        top = _top_rows_html(self.changed.head(_TOP_ROWS), self.names)
        return (f'<div class="rlgen-rollouts" style="max-width:1000px">{VIEW_STYLE}'
                f'<div style="font-family:monospace;margin-bottom:4px">reward diff: {la} → {lb} '
                f"({html.escape(self.reward)})</div><table><tbody>{table}</tbody></table>"
                + "".join(f'<div style="color:#a60;margin-top:4px">{html.escape(n)}</div>' for n in self.notes)
                + f"{top}"
                f'<div style="color:#666;font-size:90%;margin-top:4px">{html.escape(self.interval_note)}</div></div>')

    def plot(self, ax: Axes | None = None) -> Axes:
        """Mean reward per step under A and B (two lines on the returned Axes, left y axis) and the
        difference B − A with its interval (a dashed line in a shaded band on a twin y axis at the
        right, with a dotted line at 0), a vertical red line at `diverged_at`. Returns the Axes of
        the two mean lines; its twin is `ax.figure.axes[-1]`. matplotlib is imported now (`pip
        install 'rlgen[plots]'`); `ax=` draws into axes of yours."""
        from ..rollouts._figures import new_axes, require_matplotlib

        require_matplotlib()
        from matplotlib.ticker import MaxNLocator

        out = new_axes(ax)
        table, (la, lb) = self.per_step, self.names
        steps = table["step"].to_numpy(dtype=np.float64)
        for name, color in ((la, "tab:blue"), (lb, "tab:orange")):
            out.plot(steps, table[f"mean_{name}"].to_numpy(dtype=np.float64), marker=".", color=color,
                     label=f"{name}: mean {self.reward}")
        twin = out.twinx()
        low, high = (table[c].to_numpy(dtype=np.float64) for c in ("low", "high"))
        twin.fill_between(steps, low, high, where=np.isfinite(low) & np.isfinite(high), color="tab:green",
                          alpha=0.2, linewidth=0, label=f"{self.confidence * 100:g}% interval")
        twin.plot(steps, table["diff"].to_numpy(dtype=np.float64), color="tab:green", linestyle="--", linewidth=1,
                  label=f"{lb} − {la} (right axis)")
        twin.axhline(0.0, color="0.5", linestyle=":", linewidth=0.8)
        if self.diverged_at is not None:
            twin.axvline(float(self.diverged_at), color="tab:red", linewidth=1.2,
                         label=f"diverged at step {self.diverged_at}")
        out.set_zorder(twin.get_zorder() + 1)  # the mean lines over the band; the twin's patch stays behind
        out.patch.set_visible(False)
        out.xaxis.set_major_locator(MaxNLocator(integer=True))
        out.set_xlabel("step")
        out.set_ylabel(f"mean {self.reward}")
        twin.set_ylabel(f"{lb} − {la}", color="tab:green")
        out.set_title(f"{self.reward} per step: {la} vs {lb}\n"
                      f"{_divergence_text(self.diverged_at, self.sustained_from)}", fontsize="medium")
        handles = out.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
        if ax is None:  # our own figure, constrained layout: the legend goes right of both y axes
            out.figure.legend(handles=handles, loc="outside right upper", fontsize="small", frameon=False)
        else:
            out.legend(handles=handles, loc="best", fontsize="small", framealpha=0.8)
        return out


# -- checks ----------------------------------------------------------------------------------------
def _check_frames(rows: pd.DataFrame, a: pd.DataFrame, b: pd.DataFrame, *, reward: str) -> None:
    """TypeError unless all three are DataFrames; ValueError unless rows has the row columns and
    rows, and a and b are aligned with it and hold `reward`."""
    import pandas as pd

    for name, frame in (("rows", rows), ("a", a), ("b", b)):
        if not isinstance(frame, pd.DataFrame):
            raise TypeError(f"{name} must be a pandas DataFrame, got {type(frame).__name__}")
    missing = [c for c in _ROW_COLUMNS if c not in rows.columns]
    if missing:
        raise ValueError(f"rows has no column {', '.join(map(repr, missing))}: pass the log's rows with "
                         f"{', '.join(_ROW_COLUMNS)} (columns now: {', '.join(map(str, rows.columns))})")
    if not len(rows):
        raise ValueError("rows is empty: nothing to compare; pass the rows of steps that hold samples")
    for side, frame in (("a", a), ("b", b)):
        if len(frame) != len(rows):
            raise ValueError(f"{side} has {len(frame)} rows and rows has {len(rows)}: pass one score per row of "
                             "rows, in its order")
        if not frame.index.equals(rows.index):
            raise ValueError(f"{side}'s index differs from rows' index: pass scores aligned with rows, e.g. "
                             f"{side}.set_axis(rows.index) when they are in rows' order")
        if not isinstance(reward, str) or reward not in frame.columns:
            raise ValueError(f"{side} has no column {reward!r}: pass reward= one of its columns "
                             f"({', '.join(map(str, frame.columns)) or 'none'})")


def _check_options(names: Sequence[str], *, threshold: float, confidence: float, interval: str, min_prompts: int,
                   seed: int) -> tuple[str, str]:
    """The two names; ValueError, saying what to pass, for any option out of range."""
    if isinstance(names, str) or not isinstance(names, Sequence) or len(names) != 2 \
            or not all(isinstance(x, str) and x for x in names):
        raise ValueError(f"names must be two non-empty strings, e.g. ('logged', 'strict'), got {names!r}")
    if names[0] == names[1]:
        raise ValueError(f"names must differ (they name columns), got {names!r}; e.g. ('{names[0]}', "
                         f"'{names[1]}_2')")
    clash = [x for x in names if x in _RESERVED]
    if clash:
        raise ValueError(f"names may not be {', '.join(map(repr, clash))}: the tables already have such a column; "
                         "pick another name")
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not math.isfinite(threshold):
        raise ValueError(f"threshold must be a number (a row passes when reward >= threshold), got {threshold!r}")
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not 0 < confidence < 1:
        raise ValueError(f"confidence must be a number between 0 and 1, e.g. 0.9, got {confidence!r}")
    if interval not in _INTERVALS:
        raise ValueError(f"interval must be 't' (a paired t interval, the default) or 'bootstrap', got {interval!r}")
    if isinstance(min_prompts, bool) or not isinstance(min_prompts, int) or min_prompts < 2:
        raise ValueError(f"min_prompts must be an int >= 2 (an interval needs two groups), got {min_prompts!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be an int >= 0, got {seed!r}")
    return str(names[0]), str(names[1])


def _scores(frame: pd.DataFrame, reward: str, side: str) -> np.ndarray:
    """The `reward` column as float64, missing values (None, pd.NA) as NaN; ValueError when it
    holds something that is not a number."""
    import pandas as pd

    try:
        values = pd.to_numeric(frame[reward], errors="raise")
    except (TypeError, ValueError) as e:
        raise ValueError(f"{side}[{reward!r}] holds values that are not numbers ({e}); pass one float per row, "
                         "NaN where not scored") from None
    return np.asarray(values.to_numpy(dtype=np.float64, na_value=np.nan))


# -- the tables ------------------------------------------------------------------------------------
def _group_keys(rows: pd.DataFrame) -> np.ndarray:
    """One int per row naming its prompt group (part, prompt_index), numbered in order of first row."""
    return np.asarray(rows.groupby(["part", "prompt_index"], sort=False, dropna=False).ngroup().to_numpy(),
                      dtype=np.int64)


def _changed(rows: pd.DataFrame, ra: np.ndarray, rb: np.ndarray, names: tuple[str, str]) -> pd.DataFrame:
    same = (ra == rb) | (np.isnan(ra) & np.isnan(rb))
    where = np.flatnonzero(~same)
    keep = [c for c in (*_ROW_COLUMNS, *_CONTEXT_COLUMNS) if c in rows.columns]
    out = rows.iloc[where][keep].reset_index(drop=True)
    delta = rb[where] - ra[where]
    out[names[0]], out[names[1]], out["delta"] = ra[where], rb[where], delta
    # argsort puts NaN last; stable, so equal |delta| keep rows' order
    order = np.argsort(-np.abs(delta), kind="stable")
    return out.iloc[order].reset_index(drop=True)


def _group_table(rows: pd.DataFrame, keys: np.ndarray, ra: np.ndarray, rb: np.ndarray,
                 names: tuple[str, str]) -> pd.DataFrame:
    import pandas as pd

    first = np.unique(keys, return_index=True)[1]  # the first row of group 0, 1, ...
    out = pd.DataFrame({c: rows[c].to_numpy()[first] for c in ("step", "part", "prompt_index", "prompt_key")})
    out["n"] = np.bincount(keys)
    carries = []
    for name, r in zip(names, (ra, rb)):
        stats = group_arrays(r, keys)
        out[f"n_{name}"] = stats.count[first]
        out[f"mean_{name}"] = stats.mean[first]
        out[f"zero_std_{name}"] = stats.zero_std[first]
        # a gradient needs two finite rewards that differ: under one, or all equal, every advantage is 0
        carries.append((stats.count[first] >= 2) & ~stats.zero_std[first])
    out["flip"] = np.where(carries[1] & ~carries[0], STARTS, np.where(carries[0] & ~carries[1], STOPS, ""))
    return out.sort_values(["step", "part", "prompt_index"], kind="stable").reset_index(drop=True)


def _advantage_table(rows: pd.DataFrame, keys: np.ndarray, ra: np.ndarray, rb: np.ndarray,
                     names: tuple[str, str]) -> pd.DataFrame:
    out = rows[["step", "part", "row", "prompt_index"]].copy()
    for method in _METHODS:
        for name, r in zip(names, (ra, rb)):
            out[f"{method}_{name}"] = group_advantages(r, keys, method=method)
    return out


def _per_step(rows: pd.DataFrame, groups: pd.DataFrame, ra: np.ndarray, rb: np.ndarray, names: tuple[str, str], *,
              threshold: float, confidence: float, interval: str, min_prompts: int, seed: int) -> pd.DataFrame:
    import pandas as pd

    la, lb = names
    frame = pd.DataFrame({"step": rows["step"].to_numpy()})
    for name, r in ((la, ra), (lb, rb)):
        finite = np.isfinite(r)
        frame[f"mean_{name}"] = np.where(finite, r, np.nan)
        with np.errstate(invalid="ignore"):
            frame[f"pass_{name}"] = np.where(finite, r >= threshold, np.nan)
    by = frame.groupby("step", sort=True)
    out = by.mean()
    out.insert(0, "rows", by.size())
    # the units of the interval: each group's mean under B minus its mean under A
    paired = groups[groups[f"mean_{la}"].notna() & groups[f"mean_{lb}"].notna()]
    diffs = (paired[f"mean_{lb}"] - paired[f"mean_{la}"]).groupby(paired["step"].to_numpy())
    by_step = {step: values.to_numpy(dtype=np.float64) for step, values in diffs}
    stats = [_step_interval(by_step.get(step, np.empty(0)), step=int(step), confidence=confidence,
                            interval=interval, min_prompts=min_prompts, seed=seed) for step in out.index]
    out.insert(1, "groups", [s[0] for s in stats])
    for i, column in enumerate(("diff", "low", "high", "diverged"), start=1):
        out[column] = [s[i] for s in stats]
    out["diverged"] = out["diverged"].astype(bool)
    order = ["rows", "groups", f"mean_{la}", f"mean_{lb}", f"pass_{la}", f"pass_{lb}", "diff", "low", "high", "diverged"]
    return out[order].rename_axis("step").reset_index()


def _step_interval(diff: np.ndarray, *, step: int, confidence: float, interval: str, min_prompts: int,
                   seed: int) -> tuple[int, float, float, float, bool]:
    """(groups, mean difference, low, high, diverged) of one step's per-group differences."""
    m = int(diff.size)
    centre = float(diff.mean()) if m else math.nan
    if m < min_prompts:
        return m, centre, math.nan, math.nan, False
    if interval == "t":
        low, high = t_interval(diff, confidence=confidence)
    else:  # seeded by (seed, step): steps of as many groups draw different resamples, each step reproducibly
        low, high = bootstrap_interval(diff, confidence=confidence, seed=[seed, step % 2**63])
    return m, centre, low, high, bool(low > 0 or high < 0)


def _divergence(per_step: pd.DataFrame) -> tuple[int | None, int | None]:
    """The first diverged step, and the first step of the last run of diverged steps on one side
    that reaches the last step (None when the last step has not diverged)."""
    steps = per_step["step"].tolist()
    side = np.where(per_step["diverged"].to_numpy(dtype=bool), np.sign(per_step["diff"].to_numpy(dtype=np.float64)), 0)
    hits = np.flatnonzero(side != 0)
    first = int(steps[hits[0]]) if hits.size else None
    if not side.size or side[-1] == 0:
        return first, None
    start = len(side) - 1
    while start > 0 and side[start - 1] == side[-1]:
        start -= 1
    return first, int(steps[start])


# -- views -----------------------------------------------------------------------------------------
def _divergence_text(diverged_at: int | None, sustained_from: int | None) -> str:
    if diverged_at is None:
        return "no step's interval excludes 0"
    sustained = f", sustained from step {sustained_from}" if sustained_from is not None else ", not sustained"
    return f"diverged at step {diverged_at}{sustained}"


def _top_rows_html(top: pd.DataFrame, names: tuple[str, str]) -> str:
    """The largest changes as a table; every text is escaped and clipped."""
    from ..rollouts._display import clip_text

    if not len(top):
        return "<div style='margin-top:6px'>no row's score changed</div>"
    la, lb = names
    texts = [c for c in ("prompt", "completion") if c in top.columns]
    limits = {"prompt": _CLIP_PROMPT, "completion": _CLIP_COMPLETION}
    # Step and row, not the part's file name (in `changed`); an empty text says so rather than
    # showing a blank cell (a policy that learned to say nothing is what a diff should show).
    head = "".join(f"<th>{html.escape(c)}</th>" for c in ["step", "row", la, lb, "delta", *texts])
    body = []
    for r in top.to_dict("records"):
        cells = [html.escape(str(r[c])) for c in ("step", "row")]
        cells += [_num(r[la]), _num(r[lb]), _num(r["delta"], signed=True)]
        cells += [html.escape(clip_text(r[c], limits[c])) if str(r[c] or "").strip()
                  else "<i style='color:#888'>(empty)</i>" for c in texts]
        body.append("<tr>" + "".join(f"<td class='rlgen-num'>{c}</td>" for c in cells[:5])
                    + "".join(f"<td>{c}</td>" for c in cells[5:]) + "</tr>")
    return (f"<div style='margin-top:6px'>largest changes (top {len(top)})</div>"
            f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>")


def _num(value: Any, *, signed: bool = False) -> str:
    number = float(value)
    if math.isnan(number):
        return "NaN"
    return f"{number:+.4g}" if signed else f"{number:.4g}"
