"""How users write reward functions: the call styles rlgen runs unchanged, and what they may return.

Owns: recognising a reward function's style from its signature (or taking a forced one), turning
rows into the calls that style expects (which arguments, one row or a batch per call), and reading
what a call returned into one value and one status per row, never broadcasting a wrong shape.
Knows nothing about processes, timeouts, Rollouts or group statistics: rows come in as plain
columns (`RowBatch`), calls go out as `(args, kwargs)`.

The styles (the names `style=` takes):

- "trl": TRL's batch functions, `f(prompts, completions, completion_ids, **columns) -> list`; for
  chat prompts `prompts` are message lists and `completions` are
  `[{"role": "assistant", "content": ...}]`, as TRL passes them; for multi-turn episodes
  `completions` are every message after the prompt (TRL's multi-turn convention). Recognised by a parameter named
  `prompts`, or `completions` without `prompt`, or `**kwargs` with named parameters all among
  TRL's batch keywords (prompts, completions, completion_ids, trainer_state, log_extra,
  log_metric, environments), as TRL's own `f(completion_ids, **kwargs)`. `environments` is each
  episode's environment object, for episodes of a TRL environment class (`rlgen.envs.from_trl`).
- "verl": `compute_score(data_source, solution_str, ground_truth, extra_info) -> float | dict`, one
  row per call; a dict gives `"score"` and its other keys become columns. Recognised by
  `solution_str` and `ground_truth`.
- "areal": AReaL's per-sample `f(prompt, completions, prompt_ids, completion_ids, **data)` (the
  completion is one string despite the plural name). Recognised by `completions` with `prompt`.
- "row": `f(row) -> float`, the row as a dict of its columns. Recognised by a single parameter
  named `row`.
- "columns": `f(completion, answer, ...)`, one row per call, each parameter filled from the column
  of that name (or the column `columns=` maps it to). Any other signature.

A call's value per row: a number (bool, numpy scalars and 0-d or 1-element numpy arrays and torch
tensors too) is "ok"; None is "none"; NaN,
infinity, a string or anything else is "bad_return" with a message saying what came back.
"""

from __future__ import annotations

import difflib
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "STYLES",
    "Checked",
    "RowBatch",
    "Style",
    "build_calls",
    "check_value",
    "check_values",
    "detect_style",
]

Style = Literal["trl", "verl", "areal", "row", "columns"]
STYLES: tuple[str, ...] = ("trl", "verl", "areal", "row", "columns")
# Per-row values a function can ask for by name besides the DataFrame's columns.
_PER_ROW_EXTRAS = ("completion_ids", "prompt_ids")
# The keyword arguments TRL's trainers pass every reward function: the batch and the training hooks.
_TRL_BATCH_NAMES = frozenset({"prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric",
                              "environments"})
_TRL_HOOKS = ("trainer_state", "log_extra", "log_metric")


@dataclass(frozen=True)
class RowBatch:
    """The rows to score, as columns: every DataFrame column, plus token ids and the chats."""

    columns: Mapping[str, Sequence[Any]]        # DataFrame columns, each one value per row
    completion_ids: Sequence[Sequence[int]]
    prompt_ids: Sequence[Sequence[int]]
    data_columns: Sequence[str] = ()             # the user's own columns (per-prompt data, added columns)
    chats: Sequence[Any] | None = None           # each row's prompt messages, for chat prompts
    completion_messages: Sequence[Any] | None = None  # each row's messages after the prompt (episodes)
    # per-row Python objects a function may ask for by name that are no columns (an episode's
    # framework environment as `environments`, TRL's name): they live in this process only
    objects: Mapping[str, Sequence[Any]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.completion_ids)

    def value(self, name: str, i: int) -> Any:
        if name == "completion_ids":
            return list(self.completion_ids[i])
        if name == "prompt_ids":
            return list(self.prompt_ids[i])
        if name in self.objects:
            return self.objects[name][i]
        return self.columns[name][i]

    def available(self) -> list[str]:
        return [*self.columns, *_PER_ROW_EXTRAS, *self.objects]


@dataclass(frozen=True)
class Checked:
    """One row's reading of what its call returned."""

    value: float                # NaN unless status is "ok"
    status: str                 # "ok", "none" or "bad_return"
    error: str | None = None    # what came back, for "bad_return"
    extra: dict[str, Any] = field(default_factory=dict)  # a dict return's keys besides "score"


def _params(fn: Callable[..., Any]) -> tuple[list[inspect.Parameter], bool]:
    """`fn`'s named parameters and whether it takes **kwargs (read before any call: `detect_style`,
    `build_calls`). An async generator function is refused here: it would give an async generator,
    never a reward, and fail every row at run time."""
    if inspect.isasyncgenfunction(fn) or inspect.isasyncgenfunction(type(fn).__call__):
        raise TypeError(f"reward function {_name(fn)} is an async generator function (async def with yield): "
                        "return the reward (`return ...`, in a plain or an async def) instead of yielding it")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as err:
        raise TypeError(f"cannot read the signature of {fn!r} ({err}); pass style= explicitly") from None
    params = [p for p in signature.parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
    return params, takes_kwargs


def detect_style(fn: Callable[..., Any]) -> Style:
    """The call style of `fn`, read from its parameter names (see the module docstring)."""
    params, takes_kwargs = _params(fn)
    names = {p.name for p in params}
    if "prompts" in names or (takes_kwargs and names and names <= _TRL_BATCH_NAMES):
        return "trl"  # e.g. TRL's own `f(completion_ids, **kwargs)`
    if {"solution_str", "ground_truth"} <= names:
        return "verl"
    if "completions" in names:
        return "areal" if "prompt" in names else "trl"
    if names == {"row"}:
        return "row"
    return "columns"


def build_calls(
    fn: Callable[..., Any],
    style: Style,
    rows: RowBatch,
    *,
    columns: Mapping[str, str],
    batch_size: int,
) -> list[tuple[list[int], tuple[Any, ...], dict[str, Any]]]:
    """The calls that score every row: `(row indices, args, kwargs)` each.

    `columns` maps a parameter name to the column that fills it. Raises ValueError before
    anything runs when a parameter has no column to come from (with the closest column name).
    """
    params, takes_kwargs = _params(fn)
    source = {p.name: columns.get(p.name, p.name) for p in params}
    available = rows.available()

    def need(param: str, *, fallback: Sequence[str] = ()) -> str:
        for name in (source.get(param, param), *fallback):
            if name in available:
                return name
        guess = difflib.get_close_matches(source.get(param, param), available, n=1)
        hint = f"; did you mean {guess[0]!r}? (pass columns={{{param!r}: {guess[0]!r}}})" if guess else ""
        raise ValueError(
            f"{_name(fn)} takes {param!r} but the rollouts have no column {source.get(param, param)!r}{hint}; "
            f"pass per-prompt data with generate(..., data=...) or map it with columns={{{param!r}: '<column>'}}"
        )

    def optional(param: str) -> bool:
        p = next((q for q in params if q.name == param), None)
        return p is None or p.default is not inspect.Parameter.empty

    n = len(rows)
    if style == "trl":
        return [(idx, (), _trl_kwargs(rows, idx, params, takes_kwargs, source, need))
                for idx in _batches(n, batch_size)]
    calls: list[tuple[list[int], tuple[Any, ...], dict[str, Any]]] = []
    if style == "verl":
        truth = need("ground_truth", fallback=("answer",))
        wanted_kind = source.get("data_source", "data_source")
        kind = wanted_kind if wanted_kind in available else ("task" if "task" in available else None)
        for i in range(n):
            kwargs: dict[str, Any] = {
                "data_source": rows.value(kind, i) if kind else "rlgen",
                "solution_str": rows.value("completion", i),
                "ground_truth": rows.value(truth, i),
            }
            if not optional("extra_info") or "extra_info" in source:
                kwargs["extra_info"] = {c: rows.value(c, i) for c in rows.data_columns}
            calls.append(([i], (), kwargs))
        return calls
    if style == "areal":
        fixed = {"prompt": "prompt", "completions": "completion", "prompt_ids": "prompt_ids",
                 "completion_ids": "completion_ids"}
        wanted = {p.name: fixed.get(p.name) or need(p.name) for p in params
                  if p.name in fixed or not optional(p.name) or source[p.name] in available}
        extra = [c for c in rows.data_columns if c not in wanted] if takes_kwargs else []
        for i in range(n):
            kwargs = {param: rows.value(col, i) for param, col in wanted.items()}
            kwargs.update({c: rows.value(c, i) for c in extra})
            calls.append(([i], (), kwargs))
        return calls
    if style == "row":
        names = list(rows.columns)
        return [([i], ({c: rows.value(c, i) for c in names},), {}) for i in range(n)]
    # "columns": each parameter from its column; optional ones only when the column exists
    wanted = {p.name: need(p.name) for p in params if not optional(p.name) or source[p.name] in available}
    if takes_kwargs:
        wanted.update({c: c for c in rows.data_columns if c not in wanted})
    return [([i], (), {param: rows.value(col, i) for param, col in wanted.items()}) for i in range(n)]


def _trl_kwargs(rows: RowBatch, idx: list[int], params: list[inspect.Parameter], takes_kwargs: bool,
                source: Mapping[str, str], need: Callable[[str], str]) -> dict[str, Any]:
    """TRL's keyword arguments for the rows `idx`: prompts, completions, completion_ids, columns."""
    chat = rows.chats is not None
    kwargs: dict[str, Any] = {
        "prompts": [rows.chats[i] if rows.chats is not None else rows.value("prompt", i) for i in idx],
        # TRL's multi-turn convention: an episode's completion is every message after the prompt.
        "completions": [list(rows.completion_messages[i]) if rows.completion_messages is not None
                        else [{"role": "assistant", "content": rows.value("completion", i)}] if chat
                        else rows.value("completion", i) for i in idx],
        "completion_ids": [rows.value("completion_ids", i) for i in idx],
    }
    names = {p.name for p in params}
    for p in params:
        if p.name in kwargs:
            continue
        if p.name in _TRL_HOOKS:
            kwargs[p.name] = None  # TRL's training hooks: nothing to report to here
        elif p.default is inspect.Parameter.empty or source[p.name] in rows.available():
            col = need(p.name)
            kwargs[p.name] = [rows.value(col, i) for i in idx]
    if not takes_kwargs:
        return {k: v for k, v in kwargs.items() if k in names}
    for c in rows.data_columns:
        kwargs.setdefault(c, [rows.value(c, i) for i in idx])
    return kwargs


def _batches(n: int, size: int) -> list[list[int]]:
    return [list(range(a, min(a + size, n))) for a in range(0, n, size)]


def _name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


def check_value(value: Any) -> Checked:
    """One row's value: a finite number is ok, None is none, anything else is a bad return."""
    if value is None:
        return Checked(math.nan, "none")
    if isinstance(value, Mapping):
        if "score" not in value:
            return Checked(math.nan, "bad_return", f"returned a dict without a 'score' key (keys: {sorted(value)[:5]})")
        inner = check_value(value["score"])
        extra = {str(k): v for k, v in value.items() if k != "score"}
        return Checked(inner.value, inner.status, inner.error, extra)
    number: Any = value
    if hasattr(value, "item") and _elements(value) == 1:  # numpy / torch scalars, 0-d or 1-element
        number = value.item()
    if isinstance(number, bool):
        return Checked(float(number), "ok")
    if isinstance(number, (int, float)):
        as_float = float(number)
        if math.isfinite(as_float):
            return Checked(as_float, "ok")
        return Checked(math.nan, "bad_return", f"returned {as_float}; return a finite float, or None to skip the row")
    text = repr(value)
    text = text if len(text) <= 40 else text[:37] + "..."
    return Checked(math.nan, "bad_return", f"returned a {type(value).__name__} ({text}); return a float or None")


def _elements(value: Any) -> int | None:
    """How many elements an array-like holds: torch's `numel()` (its `size` is a method), numpy's
    `size`; None when it says neither."""
    numel = getattr(value, "numel", None)
    if callable(numel):
        try:
            return int(numel())
        except Exception:  # an unknown type's method: not a scalar we can read
            return None
    size = getattr(value, "size", 1)
    return size if isinstance(size, int) else None


def check_values(value: Any, n_rows: int) -> list[Checked]:
    """A batch call's value: one entry per row, or every row of the call marked bad_return."""
    if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__len__") or not hasattr(value, "__iter__"):
        why = f"returned a {type(value).__name__}, not a list of {n_rows} values (one per completion)"
        return [Checked(math.nan, "bad_return", why)] * n_rows
    items = list(value)
    if len(items) != n_rows:
        why = f"returned {len(items)} values for {n_rows} completions; return one value (or None) per completion"
        return [Checked(math.nan, "bad_return", why)] * n_rows
    return [check_value(v) for v in items]
