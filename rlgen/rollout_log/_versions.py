"""Reward versions: the scores of a log's rows under one set of reward functions, with lineage.

Owns: the version `logged` (the reward columns the training loop wrote into its parts) and the
versions `rescore` appends, each a folder `rewards/<version>/` holding `lineage.json` (the
functions, by name, source hash, source and parameters; the options that change a score; the
repeats; when; rlgen's version) and one parquet file per scored part, named as the part, holding
that part's rows in order (`repeat`-major when a row was scored more than once). A part whose rows
failed (`RETRY_STATUSES`: timeout, skipped, cancelled) and were scored again gets a retry file
beside it (`<part stem>.retry-0001.parquet`, then 0002, ...): the part's whole table again, the
retried rows' new scores and the group columns recomputed; the newest file of a part is its scores
(`score_files`), the older ones stay. A version's name is bound to its lineage: scoring again with
the same functions adds only the parts not yet scored and retries failed rows; with edited
functions, options or repeats it is refused (pick a new name). Every file is created, never
replaced: a process that finds its file made meanwhile is told another process is scoring that
version (`concurrent_scoring`). Reading a version (`read_version`) gives one row per log row: the
mean over repeats, and `reward_std` / `reward_min` / `reward_max` across them. Knows nothing about
how scores are computed (`_rescore`) or compared (`compare/`).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import json
import re
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from .._version import __version__
from ..core._columns import GROUP_COLUMNS, reward_output_columns
from ..core._errors import LogError
from ..rewards._lineage import function_lineage
from ._parts import PartName
from ._store import Store

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd
    import pyarrow as pa

__all__ = ["LOGGED", "RETRY_STATUSES", "REWARDS", "claim_version", "concurrent_scoring", "failed_counts", "failed_rows",
           "lineage_of", "logged_columns", "read_scores", "read_version", "score_files", "scored_parts", "version_names",
           "write_scores"]

REWARDS = "rewards"
LOGGED = "logged"
_LINEAGE = "lineage.json"
# A row's statuses that another try may change (a slow call, a call never made); "error",
# "bad_return" and "none" are what the function answered, and stay.
RETRY_STATUSES = ("timeout", "skipped", "cancelled")
_RETRY = re.compile(r"^(step-\d{9}\.[A-Za-z0-9_-]{1,64}\.[0-9a-f]{8})\.retry-(\d{4,})\.parquet$")
# The options that change a score (the rest, mode, timeout, workers, progress, change how it runs).
_SCORE_OPTIONS = ("weights", "style", "columns", "batch_size", "advantage", "eps")


def lineage_of(named: Sequence[tuple[str, Callable[..., Any]]], options: Mapping[str, Any]) -> dict[str, Any]:
    """The lineage of a re-score: each function's (`rewards._lineage`), the options that change a
    score, the repeats, and the key (`sha256`) that tells two lineages apart."""
    functions = [function_lineage(name, fn) for name, fn in named]
    score_options = {k: _jsonable(options.get(k)) for k in _SCORE_OPTIONS}
    body = json.dumps({"functions": [(f["name"], f["source_sha256"]) for f in functions], "options": score_options,
                       "repeats": options.get("repeats", 1)}, sort_keys=True)
    return {"functions": functions, "options": score_options, "repeats": options.get("repeats", 1),
            "sha256": hashlib.sha256(body.encode()).hexdigest()}


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def version_names(store: Store) -> list[str]:
    """The re-scored versions, oldest first (by their lineage's time)."""
    names = [n for n in store.list(REWARDS) if store.exists(REWARDS, n, _LINEAGE)]
    return sorted(names, key=lambda n: (read_lineage(store, n).get("created", ""), n))


def read_lineage(store: Store, name: str) -> dict[str, Any]:
    """A version's lineage.json. Raises LogError for a version that does not exist."""
    if not store.exists(REWARDS, name, _LINEAGE):
        raise LogError(f"no reward version {name!r} in this log; its versions: {[LOGGED, *version_names(store)]}")
    loaded: dict[str, Any] = json.loads(store.read_bytes(REWARDS, name, _LINEAGE))
    return loaded


def claim_version(store: Store, name: str, lineage: dict[str, Any]) -> bool:
    """Bind `name` to `lineage`: True where it is new (lineage.json written), False where it has this
    lineage already (scoring goes on where it stopped).

    Raises:
        LogError: `name` is bound to other functions or options (the error says which differ).
    """
    if store.exists(REWARDS, name, _LINEAGE):
        old = read_lineage(store, name)
        if old["sha256"] == lineage["sha256"]:
            return False
        raise LogError(f"reward version {name!r} exists with other functions or options ({_differences(old, lineage)}): "
                       f"nothing is overwritten, so pick a new name, e.g. version={name + '_2'!r}",
                       path=store.path(REWARDS, name))
    record = {"version": name, **lineage, "created": dt.datetime.now(dt.timezone.utc).isoformat(),
              "rlgen": __version__}
    if not store.create(json.dumps(record, indent=1).encode(), REWARDS, name, _LINEAGE):
        if read_lineage(store, name)["sha256"] == lineage["sha256"]:  # made by a call that started with this one
            raise concurrent_scoring(store, name, store.path(REWARDS, name, _LINEAGE))
        return claim_version(store, name, lineage)  # made meanwhile with other functions: say what differs
    return True


def concurrent_scoring(store: Store, name: str, path: str) -> LogError:
    """The error of a call that finds a file of its version made meanwhile by another process."""
    return LogError(f"reward version {name!r} is being scored by another process: it wrote {path} while this call "
                    "was scoring it. Nothing is lost or doubled (a log never replaces a file); let that call finish, "
                    "then call rescore again with the same functions and version: it scores only what is left",
                    path=path)


def _differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    """What tells two lineages apart, in words: "'strict': its source changed; repeats 1 -> 3"."""
    was = {f["name"]: f for f in old["functions"]}
    now = {f["name"]: f for f in new["functions"]}
    said = [f"{k!r}: its {'parameters' if was[k]['params'] != now[k]['params'] else 'source'} changed"
            for k in was if k in now and was[k]["source_sha256"] != now[k]["source_sha256"]]
    said += [f"{k!r} is not in it" for k in now if k not in was] + [f"it also has {k!r}" for k in was if k not in now]
    said += [f"{k} {old['options'][k]!r} -> {new['options'][k]!r}" for k in new["options"]
             if old["options"].get(k) != new["options"][k]]
    if old["repeats"] != new["repeats"]:
        said.append(f"repeats {old['repeats']} -> {new['repeats']}")
    return "; ".join(said)


def score_files(store: Store, name: str) -> dict[str, tuple[str, int]]:
    """Each part file a version has scored -> (the file holding its scores now: the part's name,
    or its newest retry file; how many retries it has had)."""
    out: dict[str, tuple[str, int]] = {}
    for f in store.list(REWARDS, name):
        if PartName.parse(f) is not None:
            part, retry = f, 0
        elif (m := _RETRY.match(f)) is not None:
            part, retry = f"{m.group(1)}.parquet", int(m.group(2))
        else:
            continue
        if part not in out or out[part][1] < retry:
            out[part] = (f, retry)
    return out


def scored_parts(store: Store, name: str) -> set[str]:
    """The part files a version has scored."""
    return set(score_files(store, name))


def write_scores(store: Store, name: str, part: PartName, table: pa.Table, *, retry: int = 0) -> None:
    """One part's scores under a version (a `repeat` column, then the scoring columns; rows in the
    part's order, repeat-major): its first file, or with `retry` its retry file of that number.

    Raises:
        LogError: another process wrote that file meanwhile (`concurrent_scoring`).
    """
    import pyarrow.parquet as pq

    file = part.file if retry == 0 else f"{part.file[:-len('.parquet')]}.retry-{retry:04d}.parquet"
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    if not store.create(buffer.getvalue(), REWARDS, name, file):
        raise concurrent_scoring(store, name, store.path(REWARDS, name, file))


def read_scores(store: Store, name: str, file: str) -> pd.DataFrame:
    """One file of a version's scores, as written (repeat-major rows)."""
    import pandas as pd

    return pd.read_parquet(io.BytesIO(store.read_bytes(REWARDS, name, file)))


def failed_rows(scores: pd.DataFrame) -> np.ndarray:
    """Which rows of a scores table have a function whose status is one of `RETRY_STATUSES`."""
    import numpy as np

    failed = np.zeros(len(scores), dtype=bool)
    for c in [c for c in scores.columns if c.startswith("reward_") and c.endswith("_status")]:
        failed |= scores[c].isin(RETRY_STATUSES).to_numpy(dtype=bool)
    return failed


def failed_counts(store: Store, name: str, files: Sequence[str]) -> dict[str, int]:
    """How many rows of each of a version's score `files` failed (see `failed_rows`)."""
    with ThreadPoolExecutor(max_workers=8) as pool:
        counts = list(pool.map(lambda f: int(failed_rows(read_scores(store, name, f)).sum()), files))
    return dict(zip(files, counts))


def logged_columns(columns: Sequence[str]) -> list[str]:
    """The columns of the version `logged` among a part's columns: what scoring wrote, and a
    `reward` / `advantage` imported from a framework's log."""
    return [c for c in columns if c in reward_output_columns(columns) or c in GROUP_COLUMNS]


def read_version(store: Store, name: str, parts: Sequence[PartName], rows: pd.DataFrame) -> pd.DataFrame:
    """The version's scores for `rows` (a frame with `part` and `row`), aligned with them, from each
    part's newest file; NaN and status None where a part has not been scored under it."""
    import numpy as np
    import pandas as pd

    frames = []
    files = score_files(store, name)
    for part in parts:
        if part.file not in files:
            continue
        df = read_scores(store, name, files[part.file][0])
        n = int((df["repeat"] == 0).sum())
        df.insert(0, "row", np.tile(np.arange(n, dtype=np.int64), len(df) // max(n, 1)))
        df.insert(0, "part", part.file)
        frames.append(df)
    if not frames:
        return pd.DataFrame(index=rows.index, columns=["reward"], dtype=float)
    every = pd.concat(frames, ignore_index=True)
    numeric = [c for c in every.columns if c not in ("part", "row", "repeat") and pd.api.types.is_numeric_dtype(every[c])
               and not pd.api.types.is_bool_dtype(every[c])]
    grouped = every.groupby(["part", "row"], sort=False)
    out = grouped[numeric].mean()
    if int(every["repeat"].max()) > 0:
        out["reward_std"] = grouped["reward"].std(ddof=1)
        out["reward_min"] = grouped["reward"].min()
        out["reward_max"] = grouped["reward"].max()
    rest = [c for c in every.columns if c not in numeric and c not in ("part", "row", "repeat")]
    first = every[every["repeat"] == 0].set_index(["part", "row"])[rest]
    out = out.join(first)
    keys = pd.MultiIndex.from_frame(rows[["part", "row"]])
    return out.reindex(keys).set_axis(rows.index)
