"""Scoring rollouts with the user's reward functions: the columns `Rollouts.add_rewards` adds.

Owns: checking the reward functions and options before anything runs (names, weights, styles,
columns, timeout); running each function over every row through `rewards._exec` (process pool,
threads or inline) in the style `rewards._styles` recognised; the per-function columns (value,
status, error, traceback, seconds, a dict return's extra keys); the combined `reward`; and the
group columns (`group_mean`, `group_std`, `group_zero_std`, `advantage`) from `rewards._group_stats`.
Knows nothing about servers, tensors, display or the result object: it takes the rows as a
`RowBatch` (columns and token ids) with one group key per row, and returns the new columns.

Columns, per function `<name>`:
  reward_<name>            float, NaN unless the row's status is "ok"
  reward_<name>_status     "ok" | "none" | "error" | "timeout" | "bad_return" | "skipped" | "cancelled"
                           ("skipped": the function timed out on 3 calls in a row, none ok in
                           between, and was called no more)
  reward_<name>_error      "ExcType: message" or what came back (None when ok)
  reward_<name>_traceback  the full traceback of an error (only when some row raised)
  reward_<name>_seconds    the call's own time per row (a batch call's time split over its rows)
  reward_<name>_<key>      the other keys of a dict return (verl's `{"score": ..., "acc": ...}`)
then, for all of them together:
  reward           the weighted sum over functions whose value is finite; NaN when none is
  group_mean, group_std, group_zero_std, advantage   (see `rewards._group_stats`), per prompt group
"""

from __future__ import annotations

import math
import re
import warnings
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from ..core._columns import GROUP_COLUMNS
from . import _exec as _reward_exec
from . import _group_stats
from . import _styles as _reward_styles
from ._styles import STYLES, RowBatch, Style

__all__ = ["RewardFunctions", "count_functions", "named_functions", "rewards_columns", "status_totals", "warn_notes"]

RewardFunctions = Callable[..., Any] | Sequence[Callable[..., Any]] | Mapping[str, Callable[..., Any]]
Mode = Literal["process", "thread", "inline"]  # checked by _options.RewardOptions
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
STATUSES = ("ok", "none", "error", "timeout", "bad_return", "skipped", "cancelled")
GIVE_UP_AFTER = 3  # timeouts in a row (none ok in between) after which a function is called no more
_FAILED = ("error", "timeout", "bad_return")
# A function failing on more rows than both of these gets a warning naming it and its commonest error.
_WARN_ROWS, _WARN_FRACTION = 2, 0.05


@dataclass(frozen=True)
class _Function:
    name: str
    fn: Callable[..., Any]
    style: Style
    weight: float


def rewards_columns(rows: RowBatch, groups: np.ndarray, funcs: RewardFunctions, options: Mapping[str, Any], *,
                    on_progress: Callable[[int], None] | None = None) -> tuple[dict[str, Any], list[str]]:
    """The columns `res.add_rewards(funcs, **options)` adds to `rows`, and warnings to show (see the
    module docstring). `groups`: one prompt-group key per row. `options`: add_rewards' options,
    resolved (`core._options.RewardOptions`)."""
    weights, style, columns = options["weights"], options["style"], options["columns"]
    mode, timeout, workers = options["mode"], options["timeout"], options["workers"]
    batch_size, advantage, eps = options["batch_size"], options["advantage"], options["eps"]
    functions = _resolve(funcs, weights=weights, style=style)
    if columns is not None and not all(isinstance(k, str) and isinstance(v, str) for k, v in columns.items()):
        raise TypeError("columns must map a function's parameter name to a column name, e.g. {'ground_truth': 'answer'}")
    existing = set(rows.columns)
    taken = [f"reward_{f.name}" for f in functions if f"reward_{f.name}" in existing]
    if taken:
        raise ValueError(f"the rollouts already have {taken}; score into new names (pass a dict {{'name': fn}}) "
                         "or drop those columns first")
    # Build every function's calls before running any, so a missing column fails at once.
    plans = [(f, _reward_styles.build_calls(f.fn, f.style, rows, columns=columns or {}, batch_size=batch_size))
             for f in functions]
    out: dict[str, Any] = {}
    notes: list[str] = []
    values = []
    for f, calls in plans:
        # a function given in-memory objects (an episode's environment) runs in this process
        own_mode: Mode = "thread" if mode == "process" and any(k in rows.objects for _, _, kw in calls for k in kw) else mode
        outcomes, interrupted = _run(f, calls, mode=own_mode, timeout=timeout, workers=workers,
                                     on_progress=on_progress)
        cols = _function_columns(f.name, calls, outcomes, len(rows), batch=f.style == "trl")
        out.update(cols)
        notes.extend(_failure_notes(f.name, cols[f"reward_{f.name}_status"], cols[f"reward_{f.name}_error"]))
        values.append((f.weight, np.asarray(cols[f"reward_{f.name}"], dtype=np.float64)))
        if interrupted:
            left = sum(s == "cancelled" for s in cols[f"reward_{f.name}_status"])
            notes.append(f"scoring was interrupted: {left} of {len(rows)} rows of {f.name!r} are marked 'cancelled'")
            for g, _ in plans[len(values):]:
                out.update(_cancelled_columns(g.name, len(rows)))
                values.append((g.weight, np.full(len(rows), np.nan)))
            break
    total = _weighted_sum(values)
    stats = _group_stats.group_arrays(total, groups)
    out["reward"] = total
    out["group_mean"] = stats.mean
    out["group_std"] = stats.std
    out["group_zero_std"] = stats.zero_std
    out["advantage"] = _group_stats.advantages(total, groups, method=advantage, eps=eps)
    replaced = [c for c in GROUP_COLUMNS if c in existing]
    if replaced:
        notes.append(f"replaced {replaced}: 'reward' sums this call's functions only")
    return out, notes


def named_functions(funcs: RewardFunctions) -> list[tuple[str, Callable[..., Any]]]:
    """The functions `funcs` names, with the names their columns take (checked as add_rewards checks
    them: ValueError / TypeError)."""
    return [(f.name, f.fn) for f in _resolve(funcs, weights=None, style=None)]


def count_functions(funcs: RewardFunctions) -> int:
    """How many reward functions `funcs` names (1 for a single function)."""
    return len(funcs) if isinstance(funcs, (list, tuple, Mapping)) else 1


def _resolve(funcs: RewardFunctions, *, weights: Mapping[str, float] | Sequence[float] | None,
             style: Style | Mapping[str, Style] | None) -> list[_Function]:
    if isinstance(funcs, Mapping):
        named = list(funcs.items())
    elif callable(funcs):
        named = [(_default_name(funcs), funcs)]
    elif isinstance(funcs, (list, tuple)):
        for k, f in enumerate(funcs, 1):
            if not callable(f):
                raise TypeError(f"reward #{k} is a {type(f).__name__}, not a function")
        named = [(_default_name(f), f) for f in funcs]
    else:
        raise TypeError(f"funcs must be a function, a list of functions or a dict name -> function, "
                        f"got {type(funcs).__name__}")
    if not named:
        raise ValueError("give at least one reward function")
    names = [n for n, _ in named]
    for k, (name, fn) in enumerate(named, 1):
        if not callable(fn):
            raise TypeError(f"reward #{k} ({name!r}) is a {type(fn).__name__}, not a function")
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"reward name {name!r} is not usable as a column suffix; name it with a dict "
                             "{'my_reward': fn} (letters, digits, underscores)")
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"two reward functions are named {dupes[0]!r}; pass a dict with distinct names")
    weight_of = _weights(weights, names)
    styles = _styles(style, names)
    return [_Function(name, fn, styles.get(name) or _reward_styles.detect_style(fn), weight_of[name])
            for name, fn in named]


def _default_name(fn: Callable[..., Any]) -> str:
    name = getattr(fn, "__name__", None) or getattr(getattr(fn, "func", None), "__name__", None)
    if not name or name == "<lambda>":
        raise ValueError(f"{fn!r} has no name to put in its column; pass a dict {{'my_reward': fn}}")
    return str(name)


def _weights(weights: Mapping[str, float] | Sequence[float] | None, names: list[str]) -> dict[str, float]:
    if weights is None:
        return dict.fromkeys(names, 1.0)
    if isinstance(weights, Mapping):
        unknown = sorted(set(weights) - set(names))
        if unknown:
            raise ValueError(f"weights name {unknown} but the reward functions are {names}")
        given = {n: weights.get(n, 1.0) for n in names}
    else:
        if isinstance(weights, (str, bytes)) or len(weights) != len(names):
            raise ValueError(f"give one weight per reward function ({len(names)}), or a dict name -> weight")
        given = dict(zip(names, weights))
    for name, w in given.items():
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w):
            raise ValueError(f"the weight of {name!r} must be a finite number, got {w!r}")
    return {n: float(w) for n, w in given.items()}


def _styles(style: Style | Mapping[str, Style] | None, names: list[str]) -> dict[str, Style]:
    if style is None:
        return {}
    forced = dict(style) if isinstance(style, Mapping) else dict.fromkeys(names, style)
    unknown = sorted(set(forced) - set(names))
    if unknown:
        raise ValueError(f"style names {unknown} but the reward functions are {names}")
    for name, s in forced.items():
        if s not in STYLES:
            raise ValueError(f"unknown style {s!r} for {name!r}; styles are {', '.join(map(repr, STYLES))}")
    return forced


def _run(f: _Function, calls: list[tuple[list[int], tuple[Any, ...], dict[str, Any]]], *, mode: Mode,
         timeout: float | None, workers: int | None,
         on_progress: Callable[[int], None] | None) -> tuple[list[_reward_exec.Outcome], bool]:
    """Run one function's calls; (outcomes, whether Ctrl-C stopped it: the rest are 'cancelled')."""
    exec_calls = [_reward_exec.Call(args=args, kwargs=kwargs) for _, args, kwargs in calls]
    sizes = [len(idx) for idx, _, _ in calls]

    def progress(k: int) -> None:
        if on_progress is not None:
            on_progress(k)

    advance = progress if f.style != "trl" else _batch_progress(sizes, progress)
    try:
        return _reward_exec.run_calls(f.fn, exec_calls, mode=mode, timeout=timeout, workers=workers,
                                      on_progress=advance, give_up_after=GIVE_UP_AFTER), False
    except _reward_exec.RunInterrupted as stop:
        return list(stop.outcomes), True


def _batch_progress(sizes: list[int], progress: Callable[[int], None]) -> Callable[[int], None]:
    """Turn "k calls finished" into rows finished, for batch-style functions."""
    done = [0]

    def advance(k: int) -> None:
        rows = sum(sizes[done[0]:done[0] + k])
        done[0] += k
        progress(rows)

    return advance


def _function_columns(name: str, calls: list[tuple[list[int], tuple[Any, ...], dict[str, Any]]],
                      outcomes: Sequence[_reward_exec.Outcome], n_rows: int, *, batch: bool) -> dict[str, Any]:
    value = np.full(n_rows, np.nan)
    status: list[str] = ["cancelled"] * n_rows
    error: list[str | None] = [None] * n_rows
    trace: list[str | None] = [None] * n_rows
    seconds = np.full(n_rows, np.nan)
    extra: dict[str, list[Any]] = {}
    for (idx, _, _), outcome in zip(calls, outcomes):
        per_row = outcome.seconds / len(idx) if idx else 0.0
        if outcome.status != "ok":
            for i in idx:
                status[i], error[i], trace[i], seconds[i] = outcome.status, outcome.error, outcome.traceback, per_row
            continue
        checked = _reward_styles.check_values(outcome.value, len(idx)) if batch else [
            _reward_styles.check_value(outcome.value)]
        for i, c in zip(idx, checked):
            value[i], status[i], error[i], seconds[i] = c.value, c.status, c.error, per_row
            for key, v in c.extra.items():
                extra.setdefault(key, [None] * n_rows)[i] = v
    cols: dict[str, Any] = {
        f"reward_{name}": value,
        f"reward_{name}_status": status,
        f"reward_{name}_error": error,
    }
    if any(t is not None for t in trace):
        cols[f"reward_{name}_traceback"] = trace
    cols[f"reward_{name}_seconds"] = seconds
    cols.update({f"reward_{name}_{_column_suffix(key)}": v for key, v in extra.items()})
    return cols


def _cancelled_columns(name: str, n_rows: int) -> dict[str, Any]:
    return {f"reward_{name}": np.full(n_rows, np.nan), f"reward_{name}_status": ["cancelled"] * n_rows,
            f"reward_{name}_error": [None] * n_rows, f"reward_{name}_seconds": np.full(n_rows, np.nan)}


def _column_suffix(key: str) -> str:
    return re.sub(r"\W", "_", key)


def _weighted_sum(values: list[tuple[float, np.ndarray]]) -> np.ndarray:
    stacked = np.stack([w * v for w, v in values])
    finite = np.isfinite(stacked)
    total = np.where(finite, stacked, 0.0).sum(axis=0)
    return np.where(finite.any(axis=0), total, np.nan)


def _failure_notes(name: str, status: Sequence[str], error: Sequence[str | None]) -> list[str]:
    """A warning when `name` failed (error / timeout / bad_return) on more than a few rows."""
    failed = [i for i, s in enumerate(status) if s in _FAILED]
    if len(failed) <= _WARN_ROWS or len(failed) <= _WARN_FRACTION * len(status):
        return []
    kinds = Counter(status[i] for i in failed)
    breakdown = ", ".join(f"{kinds[k]} {k}" for k in _FAILED if kinds[k])
    (commonest, count), = Counter(error[i] or status[i] for i in failed).most_common(1)
    skipped = sum(s == "skipped" for s in status)
    stop = (f"; stopped after {GIVE_UP_AFTER} timeouts in a row: {skipped} rows not scored ('skipped')"
            if skipped else "")
    return [f"{name} failed on {len(failed)} of {len(status)} rows ({breakdown}); commonest: {commonest!r} "
            f"({count} row{'' if count == 1 else 's'}){stop}; see reward_{name}_error and res.reward_summary()"]


def status_totals(cols: Mapping[str, Any]) -> tuple[str, bool]:
    """The totals of `rewards_columns`' status columns, e.g. "119 ok · 9 timeout", and whether any
    row of any function did not score ok or none."""
    counts: Counter[str] = Counter()
    stopped = []
    for key, column in cols.items():
        if key.startswith("reward_") and key.endswith("_status") and key[:-len("_status")] in cols:
            counts.update(column)
            if "skipped" in column:
                stopped.append(f"{key[len('reward_'):-len('_status')]} stopped after {GIVE_UP_AFTER} timeouts in a row")
    order = [s for s in STATUSES if counts[s]] + sorted(s for s in counts if s not in STATUSES)
    text = " · ".join([f"{counts[s]:,} {s}" for s in order] + stopped)
    return text, any(counts[s] for s in counts if s not in ("ok", "none"))


def warn_notes(notes: list[str]) -> None:
    for note in notes:
        warnings.warn(note, stacklevel=3)
