"""The parquet file format of `Rollouts`: one file per result, readable as a plain table too.

Owns: the file layout and its version check. The df's own columns are stored as they are (except
`matched_stop`, which mixes token ids and stop strings, and the chat messages, whose keys vary by
role: JSON text, listed in the header); ragged token
data are list columns named `_rlgen_<name>` beside them (`[T, k]` fields as lists of fixed-size
lists); `meta_info` is one JSON text per row; pad id, model, sampling, run_sampling (run ->
sampling) and the name of the result class that wrote the file (`result_class`: "Rollouts",
"Episodes") are JSON in the file's metadata under the key `rlgen`; the registry of those classes
(`register_result_class`, `result_class`), so that a file reads back as the class that wrote it. Knows nothing about `Rollouts` itself, torch or tensors:
`Rollouts.to_parquet` / `from_parquet` (`rollouts/_rollouts.py`) hand over and take back the flat arrays.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["JSON_COLUMNS", "StoredRollouts", "read_parquet", "register_result_class", "result_class", "write_parquet"]

_PARQUET_KEY = b"rlgen"
_PARQUET_VERSION = 1
# Columns stored as one JSON text per row (see write_parquet).
JSON_COLUMNS = ("matched_stop", "prompt_messages", "completion_messages")

Ragged = tuple[np.ndarray, np.ndarray]  # flat values, row offsets (see core/_ragged.py)

# The result classes a file may name, by class name: `Rollouts` and each subclass, registered as it
# is defined (`Rollouts.__init_subclass__`). Why a registry: a file written by `Episodes` must read
# back as `Episodes`, but rollouts/ sits below episodes/ and never imports it (not even inside a
# function); the higher layer makes itself known here when its module is imported (`import rlgen`
# imports it), so the arrow still points down. The first class registered under a name keeps it
# (rlgen's own, registered at import, before any user subclass of the same name).
_RESULT_CLASSES: dict[str, type] = {}


def register_result_class(cls: type) -> None:
    """Let files that name `cls` (by its class name) read back as `cls`."""
    _RESULT_CLASSES.setdefault(cls.__qualname__, cls)


def result_class(name: str | None) -> type | None:
    """The registered class a file's `result_class` names; None for a file without one (written
    before the key) or a class not registered (its module not imported)."""
    return None if name is None else _RESULT_CLASSES.get(name)


@dataclass
class StoredRollouts:
    """What `read_parquet` returns (offsets rebased to start at 0)."""

    df: pd.DataFrame
    prompt: Ragged
    response: Ragged
    meta_info: list[dict[str, Any]]
    fields: dict[str, np.ndarray | None]  # optional flat fields, None where the file has none
    header: dict[str, Any]  # pad_token_id, model, sampling, run_sampling (and the format version)


def write_parquet(
    path: str | os.PathLike[str] | BinaryIO,
    df: pd.DataFrame,
    *,
    prompt: Ragged,
    response: Ragged,
    meta_info: list[dict[str, Any]],
    fields: dict[str, Ragged],
    header: dict[str, Any],
) -> None:
    """Write one file: df columns, then prompt and response ids, meta_info and `fields` in order.

    Raises:
        ValueError: a df column name starts with `_rlgen_`.
        TypeError: a df column parquet cannot hold.
    """
    import orjson
    import pyarrow as pa
    import pyarrow.parquet as pq

    clash = [c for c in df.columns if str(c).startswith("_rlgen_")]
    if clash:
        raise ValueError(f"column names starting with '_rlgen_' are reserved: {clash}")
    # matched_stop mixes token ids and stop strings, which parquet cannot hold in one column; chat
    # messages have keys that vary by role, which a struct column would fill with nulls on read.
    as_json = [c for c in JSON_COLUMNS if c in df]
    df = df.assign(**{c: [json.dumps(m) for m in df[c]] for c in as_json})
    try:
        table = pa.Table.from_pandas(df, preserve_index=False)
    except (pa.ArrowException, TypeError, ValueError) as err:
        raise TypeError(f"a df column cannot be written to parquet ({err}); convert it to a plain type") from err

    def ragged(values: np.ndarray, offsets: np.ndarray) -> pa.Array:
        if values.ndim == 2:  # [T, k] -> list<fixed_size_list<k>>
            inner = pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), values.shape[1])
        else:
            inner = pa.array(values, type=pa.string()) if values.dtype == object else pa.array(values)
        return pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), inner)

    arrays = {
        "prompt_ids": ragged(*prompt),
        "response_ids": ragged(*response),
        # keys that start with "_" hold in-memory objects (an episode's environment): not written
        "meta_info": pa.array([orjson.dumps({k: v for k, v in m.items() if not k.startswith("_")}).decode()
                               for m in meta_info], pa.string()),
    }
    for name, (values, offsets) in fields.items():
        arrays[name] = ragged(values, offsets)
    for name, arr in arrays.items():
        table = table.append_column(f"_rlgen_{name}", arr)
    meta = {"version": _PARQUET_VERSION, **header, "json_columns": as_json}
    schema_meta = {**(table.schema.metadata or {}), _PARQUET_KEY: json.dumps(meta).encode()}
    table = table.replace_schema_metadata(schema_meta)
    pq.write_table(table, os.fspath(path) if isinstance(path, (str, os.PathLike)) else path)


def read_parquet(path: str | os.PathLike[str] | BinaryIO, field_names: Iterable[str]) -> StoredRollouts:
    """Read a file written by `write_parquet`, looking for the optional fields `field_names`.

    Raises:
        ValueError: the file was not written by rlgen, or by another version of the format.
    """
    import orjson
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(os.fspath(path) if isinstance(path, (str, os.PathLike)) else path)
    raw = (table.schema.metadata or {}).get(_PARQUET_KEY)
    if raw is None:
        raise ValueError(f"{path} was not written by Rollouts.to_parquet (no rlgen metadata)")
    meta = json.loads(raw)
    if meta.get("version") != _PARQUET_VERSION:
        raise ValueError(f"{path} has rlgen parquet version {meta.get('version')}, expected {_PARQUET_VERSION}")

    def ragged(name: str) -> Ragged | None:
        if f"_rlgen_{name}" not in table.column_names:
            return None
        arr = table.column(f"_rlgen_{name}").combine_chunks()
        offsets = arr.offsets.to_numpy().astype(np.int64)
        values = arr.flatten()
        if pa.types.is_fixed_size_list(values.type):  # [T, k]
            k = values.type.list_size
            values = values.flatten().to_numpy(zero_copy_only=False).reshape(-1, k)
        else:
            values = values.to_numpy(zero_copy_only=False)
        return values, offsets - offsets[0]

    p_ids, p_off = ragged("prompt_ids")  # type: ignore[misc]
    r_ids, r_off = ragged("response_ids")  # type: ignore[misc]
    fields = {name: ragged(name) for name in field_names}
    metas = [orjson.loads(s) for s in table.column("_rlgen_meta_info").to_pylist()]
    df = table.drop_columns([c for c in table.column_names if c.startswith("_rlgen_")]).to_pandas()
    # Files from before "json_columns" stored matched_stop alone as JSON text.
    for c in meta.pop("json_columns", ["matched_stop"]):
        if c in df:
            # An object Series: a plain list of strings and None would become pandas' str dtype.
            df[c] = pd.Series([json.loads(m) for m in df[c]], dtype=object, index=df.index)
    return StoredRollouts(
        df=df,
        prompt=(p_ids, p_off),
        response=(r_ids, r_off),
        meta_info=metas,
        fields={name: None if f is None else f[0] for name, f in fields.items()},
        header=meta,
    )
