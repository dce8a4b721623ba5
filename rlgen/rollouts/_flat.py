"""A result as flat arrays, and joining several of them: what `Rollouts.concat` does to the data.

Owns: `FlatRollouts` (everything a `Rollouts` holds, as plain values: the df, prompt and response
ids with their row offsets, meta_info, the optional per-token fields of `_fields.FIELDS`, pad id,
model, per-run sampling and records, the token-text decoder) and `concat_flat`, which stacks them
row-wise: runs relabelled so prompt groups never mix (`_runs.relabel_runs`), prompt indices
optionally renumbered, a field missing from some inputs filled as `_fields` says. Knows nothing
about tensors, files or the `Rollouts` class: `Rollouts.flat()` makes one and `Rollouts(**...)`
takes one back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core._ragged import row_offsets
from ._fields import FIELDS
from ._runs import relabel_runs

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["FlatRollouts", "concat_flat"]


@dataclass
class FlatRollouts:
    """A result's contents as flat arrays (offsets as in `core/_ragged`); `kwargs()` gives the
    keyword arguments of `Rollouts(...)`."""

    df: pd.DataFrame
    prompt_ids: np.ndarray
    prompt_offsets: np.ndarray
    response_ids: np.ndarray
    response_offsets: np.ndarray
    meta_info: list[dict[str, Any]]
    pad_token_id: int
    fields: dict[str, np.ndarray | None] = field(default_factory=dict)
    model: str = ""
    run_sampling: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    run_records: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    decode: Callable[[list[int]], list[str]] | None = None

    def kwargs(self) -> dict[str, Any]:
        return {
            "df": self.df, "prompt_ids": self.prompt_ids, "prompt_offsets": self.prompt_offsets,
            "response_ids": self.response_ids, "response_offsets": self.response_offsets,
            "meta_info": self.meta_info, "pad_token_id": self.pad_token_id, "model": self.model,
            "run_sampling": self.run_sampling, "run_records": self.run_records, "decode": self.decode,
            **{name: self.fields.get(name) for name in FIELDS},
        }  # fmt: skip


def concat_flat(items: Sequence[FlatRollouts], *, labels: Sequence[str] | None, renumber: bool) -> FlatRollouts:
    """Stack `items` row-wise (see `Rollouts.concat` for the rules).

    Raises:
        ValueError: different pad ids or top-k sizes; `labels` of the wrong length, or leaving two
            rows with the same (`run`, `row_id`), or one run with two samplings.
    """
    import pandas as pd

    if labels is not None and (isinstance(labels, str) or len(labels) != len(items)):
        raise ValueError(f"labels must be a list of {len(items)} strings, one per input, got {labels!r}")
    if len({r.pad_token_id for r in items}) != 1:
        raise ValueError(f"cannot concat results with different pad_token_id: {sorted({r.pad_token_id for r in items})}")
    ks = {a.shape[1] for r in items if (a := r.fields.get("top_logprobs")) is not None}
    if len(ks) > 1:
        raise ValueError(f"cannot concat results with different top-k sizes: {sorted(ks)}")
    dfs, run_sampling, run_records = relabel_runs([(r.df, r.run_sampling, r.run_records) for r in items], labels)
    if renumber:
        shifted, start = [], 0
        for d in dfs:
            d = d.copy()
            d["prompt_index"] = d["prompt_index"] + start
            start = int(d["prompt_index"].max()) + 1 if len(d) else start
            shifted.append(d)
        dfs = shifted
    k, pad = (ks.pop() if ks else 0), items[0].pad_token_id
    fields: dict[str, np.ndarray | None] = {}
    for name, spec in FIELDS.items():
        own = [r.fields.get(name) for r in items]
        if all(a is None for a in own):
            fields[name] = None
            continue
        sizes = [len(r.prompt_ids) if spec.side == "prompt" else len(r.response_ids) for r in items]
        fields[name] = np.concatenate([a if a is not None else spec.fill(s, k, pad) for a, s in zip(own, sizes)])
    df = pd.concat(dfs, ignore_index=True)
    repeated = df.duplicated(["run", "row_id"])
    if repeated.any():
        run, row_id = df.loc[repeated.idxmax(), ["run", "row_id"]]
        raise ValueError(f"two rows would be run {run!r} row_id {row_id}: give labels that tell the inputs' runs "
                         "apart, e.g. Rollouts.concat(items, labels=['a', 'b'])")
    return FlatRollouts(
        df=df,
        prompt_ids=np.concatenate([r.prompt_ids for r in items]),
        prompt_offsets=row_offsets(np.concatenate([np.diff(r.prompt_offsets) for r in items])),
        response_ids=np.concatenate([r.response_ids for r in items]),
        response_offsets=row_offsets(np.concatenate([np.diff(r.response_offsets) for r in items])),
        meta_info=[m for r in items for m in r.meta_info],
        pad_token_id=pad,
        fields=fields,
        model=", ".join(dict.fromkeys(r.model for r in items if r.model)),
        run_sampling=run_sampling,
        run_records=run_records,
        decode=next((r.decode for r in items if r.decode is not None), None),
    )
