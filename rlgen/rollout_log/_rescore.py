"""Re-scoring a log's rows with reward functions, appended as a new reward version.

Owns: `rescore`: which parts a call scores (the steps asked for, less those the version has
already scored), reading them in chunks of whole parts, scoring each chunk through the reward
layer exactly as `add_rewards` does (`rewards._scoring.rewards_columns`: every style, the process
pool, timeouts, per-row statuses, group statistics; the reward columns the run logged are set
aside first, so that a function may keep its name), `repeats` times, and writing each part's
scores as soon as its chunk is done (a kernel that dies mid-way keeps the finished chunks; the next
call goes on from there). A chunk is read as its light columns (kept by the log's cache, as
`rows()` reads them); token ids are read only if a function asks for them (`LazyIds`: a TRL-style
function takes `completion_ids`, most functions never do). Rows of parts already scored whose
status may change on another try (`_versions.RETRY_STATUSES`: timeout, skipped, cancelled) are
scored again, by every function, in each repeat they failed in (`_retry`); the part's group
columns are recomputed over all its rows and the whole table written as the part's next retry
file. Rows still failed at the end of a call are counted in one warning saying how to retry them.
Knows nothing about where versions are kept (`_versions`) or what a diff is.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..core._columns import CLIENT_COLUMNS, COLUMNS, EPISODE_COLUMNS
from ..core._errors import LogError
from ..core._progress import ProgressLine
from ..rewards._group_stats import advantages, group_arrays
from ..rewards._scoring import RewardFunctions, named_functions, rewards_columns, status_totals, warn_notes
from ..rollouts._groups import group_keys, row_batch
from ._parts import PARTS, LightCache, PartName, read_ids, read_light
from ._store import Store
from ._versions import (
    RETRY_STATUSES,
    claim_version,
    failed_counts,
    failed_rows,
    lineage_of,
    logged_columns,
    read_scores,
    score_files,
    write_scores,
)

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd
    import pyarrow as pa

__all__ = ["LazyIds", "rescore"]

_REGROUPED = ("group_mean", "group_std", "group_zero_std", "advantage")  # over a part's rows, not a retry's
CHUNK_ROWS = 50_000  # rows read and scored at once (whole parts): bounds the memory of a chunk


class LazyIds(Sequence[list[int]]):
    """Each row's token ids of some parts, read from the files on first use (one column per part),
    as lists of ints; its length is known without reading."""

    def __init__(self, store: Store, parts: Sequence[PartName], which: str, rows: int) -> None:
        self._args = (store, parts, which)
        self._rows = rows
        self._data: tuple[Any, Any] | None = None

    def __len__(self) -> int:
        return self._rows

    def __getitem__(self, i: Any) -> Any:
        if self._data is None:
            self._data = read_ids(*self._args)
        values, offsets = self._data
        if isinstance(i, slice):
            return [values[offsets[k]:offsets[k + 1]].tolist() for k in range(*i.indices(self._rows))]
        return values[offsets[i]:offsets[i + 1]].tolist()

    def __iter__(self) -> Iterator[list[int]]:
        return (self[k] for k in range(self._rows))


def rescore(store: Store, cache: LightCache, parts: Sequence[PartName], funcs: RewardFunctions,
            opts: Mapping[str, Any]) -> tuple[str, list[PartName]]:
    """Score `parts` under a version (opts["version"], else the functions' names joined by '+'):
    those it has not scored, and the failed rows of those it has. Returns the version's name and
    the parts this call wrote scores of.

    Raises:
        LogError: the version's name is bound to other functions, a part cannot be read, or another
            process is scoring the version (a file of it appeared while this call scored).
    """
    named = named_functions(funcs)
    name = opts["version"] or "+".join(n for n, _ in named)
    claim_version(store, name, lineage_of(named, opts))
    files = score_files(store, name)
    todo = [p for p in parts if p.file not in files]
    failed = failed_counts(store, name, [files[p.file][0] for p in parts if p.file in files])
    retry = [p for p in parts if failed.get(files.get(p.file, ("", 0))[0])]
    total = (sum(cache.num_rows(store, p.file) for p in todo) * opts["repeats"]
             + sum(failed[files[p.file][0]] for p in retry)) * len(named)
    options = {k: v for k, v in opts.items() if k not in ("version", "steps", "repeats")}
    notes: list[str] = []
    statuses: dict[str, Any] = {}
    with ProgressLine(f"rescore '{name}'", total=total, unit="score", show=opts["progress"]) as line:
        for chunk in _chunks(todo, lambda p: cache.num_rows(store, p.file)):
            table = _score(store, chunk, _read_rows(store, cache, chunk), funcs, options, opts["repeats"], notes,
                           line.advance)
            _write(store, name, chunk, [cache.num_rows(store, p.file) for p in chunk], table)
            _count(statuses, table)
        for part in retry:
            _count(statuses, _retry(store, cache, name, part, files[part.file], funcs, options, notes, line.advance))
        totals, bad = status_totals(statuses) if statuses else ("nothing to score", False)
        line.close(totals=totals, warn=bad)
    warn_notes(notes)
    _say_still_failed(name, statuses)
    return name, [*todo, *retry]


def _count(statuses: dict[str, Any], table: pa.Table) -> None:
    for k in [c for c in table.column_names if c.endswith("_status")]:
        statuses.setdefault(k, []).extend(table.column(k).to_pylist())


def _say_still_failed(name: str, statuses: Mapping[str, Any]) -> None:
    """One warning where rows this call wrote stay failed (a status another try may change)."""
    rows = [s for s in zip(*statuses.values()) if any(x in RETRY_STATUSES for x in s)] if statuses else []
    if rows:
        kinds = Counter(x for s in rows for x in set(s) if x in RETRY_STATUSES)
        warnings.warn(f"{len(rows)} rows of reward version {name!r} stay failed ("
                      + ", ".join(f"{kinds[k]} {k}" for k in RETRY_STATUSES if kinds[k]) + "): call rescore again "
                      "with the same functions and version to retry them (a longer timeout= keeps the version)",
                      stacklevel=4)


def _retry(store: Store, cache: LightCache, name: str, part: PartName, newest: tuple[str, int], funcs: RewardFunctions,
           options: Mapping[str, Any], notes: list[str], advance: Callable[[int], None]) -> pa.Table:
    """A scored part's table with its failed rows scored again (every function; in each repeat, the
    rows that failed in it) and the group columns recomputed over the part, written as the part's
    next retry file (which supersedes `newest`, the file its scores are in now)."""
    import numpy as np
    import pyarrow as pa

    scores = read_scores(store, name, newest[0])
    df = _read_rows(store, cache, [part])
    n, keys = len(df), group_keys(df)
    fresh = df.drop(columns=[*logged_columns(list(df.columns)), "part", "row"])
    ids = {w: LazyIds(store, [part], w, n) for w in ("response", "prompt")}
    failed = failed_rows(scores)
    for r in range(len(scores) // max(n, 1)):
        where = np.flatnonzero(failed[r * n:(r + 1) * n])
        if not where.size:
            continue
        rows = row_batch(fresh.iloc[where].reset_index(drop=True), completion_ids=_Picked(ids["response"], where),
                         prompt_ids=_Picked(ids["prompt"], where), data_columns=_data_columns(fresh))
        cols, call_notes = rewards_columns(rows, keys[where], funcs, options, on_progress=advance)
        notes.extend(call_notes)
        _merge(scores, r * n + where, {k: v for k, v in cols.items() if k not in _REGROUPED})
        _regroup(scores, r * n, keys, options)
    table = pa.Table.from_pandas(scores, preserve_index=False)
    write_scores(store, name, part, table, retry=newest[1] + 1)
    return table


def _read_rows(store: Store, cache: LightCache, chunk: Sequence[PartName]) -> pd.DataFrame:
    """The light columns of a chunk of whole parts. Raises LogError for a part that cannot be read."""
    df = read_light(store, cache, chunk, None)
    broken = [p.file for p in chunk if p.file in cache.broken]
    if broken:
        path = store.path(PARTS, broken[0])
        raise LogError(f"rollout log part {path} cannot be read ({cache.broken[broken[0]]}): re-score the "
                       "steps without it (steps=...), or move the file away", path=path)
    return df


def _merge(scores: pd.DataFrame, positions: np.ndarray, cols: Mapping[str, Any]) -> None:
    """Put a retry's columns at `positions` of `scores` (a column the earlier file lacked, e.g. a
    traceback, is added: null elsewhere)."""
    import numpy as np
    import pandas as pd

    for key, values in cols.items():
        values = list(values)
        if key not in scores.columns:
            numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
            scores[key] = np.full(len(scores), np.nan) if numeric else pd.Series([None] * len(scores), dtype=object)
        elif scores[key].dtype != object and not pd.api.types.is_numeric_dtype(scores[key]):
            scores[key] = scores[key].astype(object)
        scores.iloc[positions, scores.columns.get_loc(key)] = values


def _regroup(scores: pd.DataFrame, start: int, keys: np.ndarray, options: Mapping[str, Any]) -> None:
    """The group columns of one repeat's rows (`start`, then as many as `keys`) from their rewards,
    as `rewards_columns` computes them."""
    total = scores["reward"].to_numpy(dtype=float)[start:start + len(keys)]
    stats = group_arrays(total, keys)
    block = slice(start, start + len(keys))
    values_of = {"group_mean": stats.mean, "group_std": stats.std, "group_zero_std": stats.zero_std,
                 "advantage": advantages(total, keys, method=options["advantage"], eps=options["eps"])}
    for column, values in ((c, values_of[c]) for c in _REGROUPED):
        scores.iloc[block, scores.columns.get_loc(column)] = values


class _Picked(Sequence[list[int]]):
    """Some rows of a `LazyIds`, by position."""

    def __init__(self, ids: LazyIds, where: np.ndarray) -> None:
        self._ids, self._where = ids, [int(i) for i in where]

    def __len__(self) -> int:
        return len(self._where)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self._ids[k] for k in self._where[i]]
        return self._ids[self._where[i]]


def _chunks(parts: Sequence[PartName], rows_of: Callable[[PartName], int]) -> list[list[PartName]]:
    chunks: list[list[PartName]] = [[]]
    size = 0
    for part in parts:
        if chunks[-1] and size + rows_of(part) > CHUNK_ROWS:
            chunks.append([])
            size = 0
        chunks[-1].append(part)
        size += rows_of(part)
    return [c for c in chunks if c]


def _score(store: Store, chunk: Sequence[PartName], df: pd.DataFrame, funcs: RewardFunctions,
           options: Mapping[str, Any], repeats: int, notes: list[str], advance: Callable[[int], None]) -> pa.Table:
    """The scoring columns of a chunk's rows (`df`: their light columns), `repeats` times over
    (repeat-major), with a `repeat` column, as one table."""
    import pyarrow as pa

    fresh = df.drop(columns=[*logged_columns(list(df.columns)), "part", "row"])
    rows = row_batch(fresh, completion_ids=LazyIds(store, chunk, "response", len(df)),
                     prompt_ids=LazyIds(store, chunk, "prompt", len(df)), data_columns=_data_columns(fresh))
    tables = []
    for r in range(repeats):
        cols, call_notes = rewards_columns(rows, group_keys(df), funcs, options, on_progress=advance)
        notes.extend(call_notes)
        tables.append(pa.table({"repeat": [r] * len(df), **{k: list(v) for k, v in cols.items()}}))
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables, promote_options="permissive")


def _data_columns(fresh: pd.DataFrame) -> list[str]:
    """The user's own columns among a part's (not rlgen's, the client's or an episode's)."""
    own = {*COLUMNS, *CLIENT_COLUMNS, *EPISODE_COLUMNS}
    return [c for c in fresh.columns if c not in own]


def _write(store: Store, name: str, chunk: Sequence[PartName], sizes: Sequence[int], table: pa.Table) -> None:
    """Each part's slice of a chunk's table (repeat-major within the chunk), one file per part."""
    import pyarrow as pa

    total = sum(sizes)
    repeats = table.num_rows // max(total, 1)
    start = 0
    for part, size in zip(chunk, sizes):
        pieces = [table.slice(r * total + start, size) for r in range(repeats)]
        write_scores(store, name, part, pieces[0] if repeats == 1 else pa.concat_tables(pieces))
        start += size
