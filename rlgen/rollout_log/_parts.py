"""A rollout log's parts: one parquet file per logged call, named by its step, never modified.

Owns: a part's file name (`step-000000010.train.3f9c1a2b.parquet`: the step, the part's name
within its step, a random id) and reading it back (`PartName`); the claim of a (step, name)
(`claims/step-000000010.train.claim`, created before the part is written, by one writer only: see
`RolloutLog.append`, and what it holds: `claim_record`); the name of a part's summary
(`summaries/step-000000010.train.3f9c1a2b.json`, written before its part, read only for a part
that exists), reading many of them (`read_summaries`) and gathering many into one index file
(`write_index`: fewer GETs on an object store); the stable prompt key
(`prompt_keys`); turning a result into a part's bytes (`part_bytes`: the result's own parquet
format, `Rollouts.to_parquet`, with the log's columns `step` and `prompt_key` added); and reading
parts: the light columns of many parts into one DataFrame (`read_light`: only the columns asked
for, each file read once per column and kept, since parts never change; a part that cannot be
read is reported with its file and skipped), and the full result of some parts (`read_full`).
Knows nothing about reward versions, diffs or views, nor about where the bytes live (`_store`).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import json
import os
import re
import socket
import uuid
import warnings
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..core._errors import LogError
from ..rollouts._parquet import JSON_COLUMNS
from ._store import Store

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ..rollouts._rollouts import Rollouts

__all__ = ["CLAIMS", "PARTS", "SUMMARIES", "LightCache", "PartName", "claim_record", "part_bytes", "prompt_keys", "read_full", "read_ids", "read_light", "read_summaries", "step_prefix", "summarised", "write_index"]

PARTS = "parts"  # the folder of parts under a log's root
CLAIMS = "claims"  # the folder of claims of (step, name): one small JSON file each, never a part
SUMMARIES = "summaries"  # the folder of per-part summaries (what the trend needs), one JSON file per part
_INDEX = "index-"  # summaries/index-<id>.json: many parts' summaries in one file (write_index)
_DIRECT_READS = 1024  # read_summaries: up to this many summaries outside an index are read by name
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_FILE = re.compile(r"^step-(\d{9})\.([A-Za-z0-9_-]{1,64})\.([0-9a-f]{8})\.parquet$")
MAX_STEP = 10**9 - 1


@dataclass(frozen=True, order=True)
class PartName:
    """What a part's file name says: its step, its name within the step, its random id."""

    step: int
    name: str
    uid: str

    @property
    def file(self) -> str:
        return f"step-{self.step:09d}.{self.name}.{self.uid}.parquet"

    @property
    def claim_file(self) -> str:
        """The name of its (step, name)'s claim in `CLAIMS`: one per step and name, whatever the id."""
        return f"step-{self.step:09d}.{self.name}.claim"

    @property
    def summary_file(self) -> str:
        """The name of its summary in `SUMMARIES`."""
        return f"step-{self.step:09d}.{self.name}.{self.uid}.json"

    @classmethod
    def new(cls, step: int, name: str) -> PartName:
        """A fresh part name. Raises ValueError for a step or name a file name cannot carry."""
        if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= MAX_STEP:
            raise ValueError(f"step must be an int in [0, {MAX_STEP}], got {step!r}")
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"a part's name is 1-64 letters, digits, '_' or '-', got {name!r} (e.g. 'train', 'eval')")
        return cls(step, name, uuid.uuid4().hex[:8])

    @classmethod
    def parse(cls, file: str) -> PartName | None:
        """The part a file name names; None for a file that is not a part."""
        m = _FILE.match(file)
        return None if m is None else cls(int(m.group(1)), m.group(2), m.group(3))


def step_prefix(step: int) -> str:
    """The start of the file names of a step's parts (and summaries): `step-000000010.`."""
    return f"step-{step:09d}."


def read_summaries(store: Store, parts: Sequence[PartName]) -> dict[str, dict[str, Any]]:
    """The summaries of `parts` that exist and read whole, by part file: from the folder's indexes
    (`index-*.json`, `write_index`: many parts' summaries in one file; one prefix listing finds
    them) first, then one file per part not in one, read concurrently (on an object store each is
    a GET). Up to `_DIRECT_READS` such parts are read by name (a missing one costs a failed GET);
    more, the folder is listed once and only the files it holds are read. A part without any (a
    log written before summaries) is absent."""
    indexes = store.list(SUMMARIES, prefix=_INDEX) if parts else []
    wanted = {p.file for p in parts}
    found: dict[str, dict[str, Any]] = {}
    with ThreadPoolExecutor(max_workers=8 if store.is_local else 32) as pool:
        for index in pool.map(lambda f: store.read_json(SUMMARIES, f) or {}, indexes):
            found.update({f: v for f, v in index.get("parts", {}).items() if f in wanted and isinstance(v, dict)})
        rest = [p for p in parts if p.file not in found]
        if len(rest) > _DIRECT_READS:
            have = set(store.list(SUMMARIES))
            rest = [p for p in rest if p.summary_file in have]
        for file, summary in pool.map(lambda p: (p.file, store.read_json(SUMMARIES, p.summary_file)), rest):
            if summary is not None:
                found[file] = summary
    return found


def write_index(store: Store, parts: Sequence[PartName]) -> int:
    """One index file (`summaries/index-<id>.json`, create-only) holding the summaries of `parts`
    that no index holds yet, so a reader GETs one file for them, not one each; returns how many
    it holds (0: nothing written). Readers take the union of the indexes and the single files."""
    indexed = _indexed(store, store.list(SUMMARIES, prefix=_INDEX) if parts else [])
    found = read_summaries(store, [p for p in parts if p.file not in indexed])
    if found:
        store.write_new(json.dumps({"parts": found}).encode(), SUMMARIES, f"{_INDEX}{uuid.uuid4().hex[:8]}.json")
    return len(found)


def summarised(store: Store) -> set[str]:
    """The part files that have a summary: a file of their own, or a place in an index."""
    listed = store.list(SUMMARIES)
    singles = {f[: -len(".json")] + ".parquet" for f in listed if not f.startswith(_INDEX)}
    return singles | _indexed(store, listed)


def _indexed(store: Store, listed: Sequence[str]) -> set[str]:
    """The part files the indexes among `listed` (names in SUMMARIES) hold."""
    out: set[str] = set()
    for f in [f for f in listed if f.startswith(_INDEX)]:
        out.update((store.read_json(SUMMARIES, f) or {}).get("parts", {}))
    return out


def claim_record(part: PartName) -> dict[str, Any]:
    """What a claim says: the part it is for, who claimed it (pid, host) and when (UTC)."""
    return {"part": part.file, "pid": os.getpid(), "host": socket.gethostname(),
            "claimed": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}


def prompt_keys(df: pd.DataFrame) -> list[str]:
    """A 16-hex-digit key per row, the same for the same prompt in any step: a hash of the chat
    messages (role and content, in order) where the row has them, else of the prompt text."""
    messages = df["prompt_messages"].tolist() if "prompt_messages" in df.columns else [None] * len(df)
    keys = []
    for text, chat in zip(df["prompt"].tolist(), messages):
        if isinstance(chat, (list, tuple)) and chat:
            body = json.dumps([[m.get("role"), m.get("content")] for m in chat], ensure_ascii=False)
        else:
            body = str(text)
        keys.append(hashlib.blake2b(body.encode(), digest_size=8).hexdigest())
    return keys


def part_bytes(res: Rollouts, step: int) -> bytes:
    """The bytes of a part: `res` in its own parquet format with `step` and `prompt_key` columns.

    Raises:
        LogError: `res` has a `step` column that says another step.
    """
    import numpy as np

    df = res.df
    if "step" in df.columns and not (df["step"] == step).all():
        raise LogError(f"these rows have a 'step' column that is not {step} everywhere: rename that column "
                       "(the log writes each row's step itself)")
    columns: dict[str, Any] = {"step": np.full(len(df), step, dtype=np.int64), "prompt_key": prompt_keys(df)}
    buffer = io.BytesIO()
    res.with_columns(columns).to_parquet(buffer)
    return buffer.getvalue()


class LightCache:
    """Light columns of parts, kept per file and column: parts are never modified, so a column read
    once stays right. A file that cannot be read is remembered with its error."""

    def __init__(self) -> None:
        self.columns: dict[str, dict[str, pa.ChunkedArray]] = {}
        self.footers: dict[str, pq.FileMetaData] = {}
        self.broken: dict[str, str] = {}

    def footer(self, store: Store, file: str) -> pq.FileMetaData:
        """A part's parquet footer (schema, row count), read once."""
        if file not in self.footers:
            import pyarrow.parquet as pq

            self.footers[file] = pq.read_metadata(store.path(PARTS, file), filesystem=store.arrow_filesystem())
        return self.footers[file]

    def names(self, store: Store, parts: Sequence[PartName]) -> list[str]:
        """The light column names of `parts` (every one that some part has), in order of first
        appearance; parts that cannot be read are skipped (remembered in `broken`)."""
        import pyarrow as pa

        names: dict[str, None] = {}
        for part in parts:
            try:
                schema = self.footer(store, part.file).schema.to_arrow_schema()
            except (OSError, pa.ArrowException) as err:
                self.broken.setdefault(part.file, f"{type(err).__name__}: {err}")
                continue
            names.update(dict.fromkeys(n for n in schema.names if not n.startswith("_rlgen_")))
        return list(names)

    def num_rows(self, store: Store, file: str) -> int:
        """A part's row count; 0 for a part that cannot be read (remembered in `broken`)."""
        import pyarrow as pa

        try:
            return int(self.footer(store, file).num_rows)
        except (OSError, pa.ArrowException) as err:
            self.broken.setdefault(file, f"{type(err).__name__}: {err}")
            return 0


def _read_file(store: Store, cache: LightCache, file: str, columns: Sequence[str] | None) -> pa.Table | None:
    """One part's light columns (those it has among `columns`, or all of its non-token columns)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if file in cache.broken:
        return None
    try:
        names = [c for c in cache.footer(store, file).schema.to_arrow_schema().names if not c.startswith("_rlgen_")]
        wanted = names if columns is None else [c for c in columns if c in names]
        kept = cache.columns.setdefault(file, {})
        missing = [c for c in wanted if c not in kept]
        if missing:
            table = pq.read_table(store.path(PARTS, file), columns=missing, filesystem=store.arrow_filesystem())
            kept.update({c: table.column(c) for c in missing})
    except (OSError, pa.ArrowException) as err:
        cache.broken[file] = f"{type(err).__name__}: {err}"
        return None
    return pa.table({c: kept[c] for c in wanted})


def read_light(store: Store, cache: LightCache, parts: Sequence[PartName], columns: Sequence[str] | None) -> pd.DataFrame:
    """The rows of `parts` (in order) as one DataFrame of `columns` (None: every light column),
    with `part` (the file name) and `row` (the row's position in its part). A column a part lacks
    (a reward added halfway through a run) is null there. Parts that cannot be read are left out,
    with a warning naming each file."""
    import numpy as np
    import pandas as pd
    import pyarrow as pa

    before = set(cache.broken)
    with ThreadPoolExecutor(max_workers=8) as pool:
        tables = list(pool.map(lambda p: _read_file(store, cache, p.file, columns), parts))
    newly = [f for f in cache.broken if f not in before and any(p.file == f for p in parts)]
    for file in newly:
        warnings.warn(f"rollout log part {store.path(PARTS, file)} cannot be read ({cache.broken[file]}): "
                      "its rows are left out; the other parts are read", stacklevel=3)
    kept = [(p, t) for p, t in zip(parts, tables) if t is not None]
    if not kept:
        return pd.DataFrame({"part": pd.Series([], dtype=object), "row": np.array([], dtype=np.int64),
                             **{c: [] for c in (columns or [])}})
    table = pa.concat_tables([t for _, t in kept], promote_options="permissive")
    df = table.to_pandas()
    for c in [c for c in JSON_COLUMNS if c in df.columns]:  # as Rollouts.df holds them (_parquet)
        df[c] = pd.Series([json.loads(v) if isinstance(v, str) else v for v in df[c]], dtype=object, index=df.index)
    df.insert(0, "part", np.repeat([p.file for p, _ in kept], [t.num_rows for _, t in kept]))
    df.insert(1, "row", np.concatenate([np.arange(t.num_rows, dtype=np.int64) for _, t in kept]))
    return df


def read_ids(store: Store, parts: Sequence[PartName], which: str) -> tuple[Any, Any]:
    """The token ids of `parts` (in order), "prompt" or "response", as one flat array and row
    offsets (ragged, `core._ragged`), reading that one column of each part.

    Raises:
        LogError: a part cannot be read.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    values, lengths = [], []
    for part in parts:
        path = store.path(PARTS, part.file)
        try:
            column = pq.read_table(path, columns=[f"_rlgen_{which}_ids"], filesystem=store.arrow_filesystem()).column(0)
        except (OSError, pa.ArrowException) as err:
            raise LogError(f"rollout log part {path} cannot be read ({type(err).__name__}: {err})", path=path) from err
        array = column.combine_chunks()
        values.append(array.flatten().to_numpy(zero_copy_only=False))
        lengths.append(np.diff(array.offsets.to_numpy()))
    flat = np.concatenate(values) if values else np.array([], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(np.concatenate(lengths) if lengths else [])]).astype(np.int64)
    return flat, offsets


def read_full(store: Store, parts: Iterable[PartName], cls: type[Rollouts], *, tokenizer: Any = None) -> list[Rollouts]:
    """Each part as the result class that wrote it (a subclass of `cls`: `Episodes` stay episodes).

    Raises:
        LogError: a part cannot be read (its file named).
    """
    import pyarrow as pa

    out = []
    for part in parts:
        path = store.path(PARTS, part.file)
        try:
            out.append(cls.from_parquet(io.BytesIO(store.read_bytes(PARTS, part.file)), tokenizer=tokenizer))
        except (OSError, ValueError, pa.ArrowException) as err:
            raise LogError(f"rollout log part {path} cannot be read ({type(err).__name__}: {err}); the other "
                           "parts can: pick steps without it, or move the file away", path=path) from err
    return out
