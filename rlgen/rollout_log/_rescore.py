"""Re-scoring a log's rows with reward functions, appended as a new reward version.

Owns: `rescore`: which parts a call scores (the steps asked for, less those the version has
already scored), reading them in chunks of whole parts (token ids included: a TRL-style function
takes `completion_ids`), scoring each chunk through the reward layer exactly as `add_rewards`
does (`rewards._scoring.rewards_columns`: every style, the process pool, timeouts, per-row
statuses, group statistics; the reward columns the run logged are set aside first, so that a
function may keep its name), `repeats` times, and writing each part's scores as soon as its chunk
is done (a kernel that dies mid-way keeps the finished chunks; the next call goes on from there).
Knows nothing about where versions are kept (`_versions`) or what a diff is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..core._progress import ProgressLine
from ..rewards._scoring import RewardFunctions, named_functions, rewards_columns, status_totals, warn_notes
from ..rollouts._groups import group_keys, row_batch
from ._parts import PartName, read_full
from ._store import Store
from ._versions import claim_version, lineage_of, logged_columns, scored_parts, write_scores

if TYPE_CHECKING:
    import pandas as pd

    from ..rollouts._rollouts import Rollouts

__all__ = ["rescore"]

CHUNK_ROWS = 50_000  # rows read and scored at once (whole parts): bounds the memory of token ids


def rescore(store: Store, parts: Sequence[PartName], funcs: RewardFunctions, opts: Mapping[str, Any], *,
            rows_of: Callable[[PartName], int], cls: type[Rollouts]) -> tuple[str, list[PartName]]:
    """Score `parts` under a version (opts["version"], else the functions' names joined by '+').
    Returns the version's name and the parts scored by this call. `rows_of`: a part's row count."""
    named = named_functions(funcs)
    name = opts["version"] or "+".join(n for n, _ in named)
    claim_version(store, name, lineage_of(named, opts))
    done = scored_parts(store, name)
    todo = [p for p in parts if p.file not in done]
    total = sum(rows_of(p) for p in todo) * len(named) * opts["repeats"]
    options = {k: v for k, v in opts.items() if k not in ("version", "steps", "repeats")}
    with ProgressLine(f"rescore '{name}'", total=total, unit="score", show=opts["progress"]) as line:
        notes: list[str] = []
        statuses: dict[str, Any] = {}
        for chunk in _chunks(todo, rows_of):
            results = read_full(store, chunk, cls)
            res = results[0] if len(results) == 1 else cls.concat(results)
            columns, repeat = _score(res, funcs, options, opts["repeats"], notes, line.advance)
            _write(store, name, chunk, [len(r) for r in results], columns, repeat)
            for k, v in columns.items():
                if k.endswith("_status"):
                    statuses.setdefault(k, []).extend(v)
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


def _score(res: Rollouts, funcs: RewardFunctions, options: Mapping[str, Any], repeats: int, notes: list[str],
           advance: Callable[[int], None]) -> tuple[dict[str, list[Any]], list[int]]:
    """The scoring columns of `res`'s rows, `repeats` times over (repeat-major), and each row's repeat."""
    df: pd.DataFrame = res.df
    fresh = df.drop(columns=logged_columns(list(df.columns)))
    rows = row_batch(fresh, completion_ids=res.id_lists("response"), prompt_ids=res.id_lists("prompt"),
                     data_columns=[c for c in res.data_columns if c in fresh.columns])
    out: dict[str, list[Any]] = {}
    for _ in range(repeats):
        cols, call_notes = rewards_columns(rows, group_keys(df), funcs, options, on_progress=advance)
        notes.extend(call_notes)
        for k, v in cols.items():
            out.setdefault(k, []).extend(list(v))
    return out, [r for r in range(repeats) for _ in range(len(res))]


def _write(store: Store, name: str, chunk: Sequence[PartName], sizes: Sequence[int], columns: Mapping[str, list[Any]],
           repeat: list[int]) -> None:
    """Each part's slice of a chunk's columns (repeat-major within the chunk), one file per part."""
    total = sum(sizes)
    start = 0
    for part, size in zip(chunk, sizes):
        picks = [r * total + start + i for r in range(len(repeat) // max(total, 1)) for i in range(size)]
        write_scores(store, name, part, {k: [v[j] for j in picks] for k, v in columns.items()},
                     [repeat[j] for j in picks])
        start += size
