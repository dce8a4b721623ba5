"""Re-scoring a log's rows with reward functions, appended as a new reward version.

Owns: `rescore`: which parts a call scores (the steps asked for, less those the version has
already scored), reading them in chunks of whole parts, scoring each chunk through the reward
layer exactly as `add_rewards` does (`rewards._scoring.rewards_columns`: every style, the process
pool, timeouts, per-row statuses, group statistics; the reward columns the run logged are set
aside first, so that a function may keep its name), `repeats` times, and writing each part's
scores as soon as its chunk is done (a kernel that dies mid-way keeps the finished chunks; the next
call goes on from there). A chunk is read as its light columns (kept by the log's cache, as
`rows()` reads them); token ids are read only if a function asks for them (`LazyIds`: a TRL-style
function takes `completion_ids`, most functions never do). Knows nothing about where versions are
kept (`_versions`) or what a diff is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..core._columns import CLIENT_COLUMNS, COLUMNS, EPISODE_COLUMNS
from ..core._errors import LogError
from ..core._progress import ProgressLine
from ..rewards._scoring import RewardFunctions, named_functions, rewards_columns, status_totals, warn_notes
from ..rollouts._groups import group_keys, row_batch
from ._parts import PARTS, LightCache, PartName, read_ids, read_light
from ._store import Store
from ._versions import claim_version, lineage_of, logged_columns, scored_parts, write_scores

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

__all__ = ["LazyIds", "rescore"]

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
    """Score `parts` under a version (opts["version"], else the functions' names joined by '+').
    Returns the version's name and the parts scored by this call.

    Raises:
        LogError: the version's name is bound to other functions, or a part cannot be read.
    """
    named = named_functions(funcs)
    name = opts["version"] or "+".join(n for n, _ in named)
    claim_version(store, name, lineage_of(named, opts))
    done = scored_parts(store, name)
    todo = [p for p in parts if p.file not in done]
    total = sum(cache.num_rows(store, p.file) for p in todo) * len(named) * opts["repeats"]
    options = {k: v for k, v in opts.items() if k not in ("version", "steps", "repeats")}
    with ProgressLine(f"rescore '{name}'", total=total, unit="score", show=opts["progress"]) as line:
        notes: list[str] = []
        statuses: dict[str, Any] = {}
        for chunk in _chunks(todo, lambda p: cache.num_rows(store, p.file)):
            df = read_light(store, cache, chunk, None)
            broken = [p.file for p in chunk if p.file in cache.broken]
            if broken:
                path = store.path(PARTS, broken[0])
                raise LogError(f"rollout log part {path} cannot be read ({cache.broken[broken[0]]}): re-score the "
                               "steps without it (steps=...), or move the file away", path=path)
            table = _score(store, chunk, df, funcs, options, opts["repeats"], notes, line.advance)
            _write(store, name, chunk, [cache.num_rows(store, p.file) for p in chunk], table)
            for k in [c for c in table.column_names if c.endswith("_status")]:
                statuses.setdefault(k, []).extend(table.column(k).to_pylist())
        totals, failed = status_totals(statuses) if statuses else ("nothing to score", False)
        line.close(totals=totals, warn=failed)
    warn_notes(notes)
    return name, todo


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
    own = {*COLUMNS, *CLIENT_COLUMNS, *EPISODE_COLUMNS}
    rows = row_batch(fresh, completion_ids=LazyIds(store, chunk, "response", len(df)),
                     prompt_ids=LazyIds(store, chunk, "prompt", len(df)),
                     data_columns=[c for c in fresh.columns if c not in own])
    tables = []
    for r in range(repeats):
        cols, call_notes = rewards_columns(rows, group_keys(df), funcs, options, on_progress=advance)
        notes.extend(call_notes)
        tables.append(pa.table({"repeat": [r] * len(df), **{k: list(v) for k, v in cols.items()}}))
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables, promote_options="permissive")


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
