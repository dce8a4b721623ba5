"""How a result's rows group and what scoring reads of them: the rollouts side of rewards.

Owns: the prompt-group key of each row (`group_keys`: the prompt, within its run when rows of
several runs were concatenated) and the `RowBatch` that the reward layer scores (`row_batch`:
every DataFrame column, token ids, the user's data columns and the chats). Knows nothing about
how rewards are computed or shown: the reward layer takes these arrays and returns columns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..core._columns import reward_output_columns
from ..rewards._styles import RowBatch

__all__ = ["group_keys", "row_batch"]


def group_keys(df: Any) -> np.ndarray:
    """One group id per row (int64, numbered in order of first appearance): the prompt, within its
    run when the rollouts carry a `run` column. Integers, not joined strings: a key such as
    "run\x000" was read as "run" by pandas 3.0.6's groupby (every row one group), seen on the GPU
    machine's pandas."""
    import pandas as pd

    if "run" in df.columns:
        codes, _ = pd.MultiIndex.from_arrays([df["run"].astype(str), df["prompt_index"]]).factorize()
        return np.asarray(codes, dtype=np.int64)
    return np.asarray(df["prompt_index"])


def row_batch(df: Any, *, completion_ids: Sequence[Sequence[int]], prompt_ids: Sequence[Sequence[int]],
              data_columns: Sequence[str], objects: Mapping[str, Sequence[Any]] | None = None) -> RowBatch:
    """The rows as the reward layer reads them. `data_columns`: the user's own columns; the reward
    columns an earlier scoring wrote are left out (a user's `reward_model` column is kept)."""
    columns = {c: df[c].tolist() for c in df.columns}
    written = set(reward_output_columns(df.columns))
    return RowBatch(
        columns=columns,
        completion_ids=completion_ids,
        prompt_ids=prompt_ids,
        data_columns=[c for c in data_columns if c not in written],
        chats=columns.get("prompt_messages"),
        completion_messages=columns.get("completion_messages"),
        objects=dict(objects or {}),
    )
