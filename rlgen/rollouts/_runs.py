"""Run ids and text columns: the small conventions every result's DataFrame shares.

Owns: a new run's id (`new_run_id`) and pandas' own text dtype for text columns (`text_dtype`,
`text_series`), so that concat and parquet keep text columns' dtype, and how `Rollouts.concat`
renames the runs of its inputs (`relabel_runs`). Knows nothing about rows,
tokens or rewards.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["new_run_id", "relabel_runs", "text_dtype", "text_series"]


def new_run_id() -> str:
    """A short id for a new run (8 hex digits of a random UUID: repeats about once in 10^4.5
    pairs of runs, far beyond how many runs one concat joins)."""
    return uuid.uuid4().hex[:8]


def text_dtype() -> Any:
    # pandas' own text dtype (str from pandas 3), so that concat and parquet keep text columns' dtype.
    import pandas as pd

    return "str" if int(pd.__version__.split(".")[0]) >= 3 else object


def text_series(values: list[str]) -> pd.Series:
    import pandas as pd

    return pd.Series(values, dtype=text_dtype())


def relabel_runs(items: list[tuple[pd.DataFrame, Mapping[str, dict[str, Any] | None], Mapping[str, dict[str, Any] | None]]],
                 labels: Sequence[str] | None
                 ) -> tuple[list[pd.DataFrame], dict[str, dict[str, Any] | None], dict[str, dict[str, Any] | None]]:
    """`items`: each input's (df, run -> sampling, run -> record). Each input's df with its `run` column as `Rollouts.concat` documents, and the joined
    run -> sampling and run -> record mappings. Raises ValueError when one run would get two
    different samplings."""
    dfs: list[pd.DataFrame] = []
    merged: dict[str, dict[str, Any] | None] = {}
    records: dict[str, dict[str, Any] | None] = {}
    seen: set[tuple[str, int]] = set()
    for position, (df, run_sampling, run_records) in enumerate(items):
        runs = [str(r) for r in df["run"].unique()]
        if labels is not None:
            label = str(labels[position])
            rename = {r: label if len(runs) <= 1 else f"{label}/{r}" for r in runs}
        else:
            keys = set(zip(df["run"].astype(str), df["row_id"].tolist()))
            repeats = not seen.isdisjoint(keys)
            rename = {r: f"{r}#{position}" if repeats else r for r in runs}
        if any(old != new for old, new in rename.items()):
            df = df.assign(run=text_series([rename[str(r)] for r in df["run"]]))
        seen.update(zip(df["run"].astype(str), df["row_id"].tolist()))
        sources = run_sampling if runs else {}
        for old, sampling in sources.items():
            new = rename.get(old, old)
            if new in merged and merged[new] != sampling:
                raise ValueError(f"run {new!r} would have two samplings ({merged[new]} and {sampling}): give labels "
                                 "that tell the inputs' runs apart")
            merged[new] = sampling
        for old, record in (run_records if runs else {}).items():
            records.setdefault(rename.get(old, old), record)
        dfs.append(df)
    return dfs, merged, records
