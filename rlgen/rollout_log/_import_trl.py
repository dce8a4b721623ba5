"""TRL's completion logs (`GRPOConfig(log_completions=True)`), read as a rollout log's steps.

Owns: finding the files (`<output_dir>/completions/completions_{step:05d}.parquet`, TRL 1.16's
`GRPOTrainer.log`), checking each is the layout this version knows (columns `step`, `prompt`,
`completion`, one float column per reward function, the `log_extra` columns, `advantage`; a file
of another layout is refused, saying which columns were expected), reading conversational prompts
and completions (lists of messages) and plain ones, telling reward columns from `log_extra` ones,
and a log_extra column of token ids (`completion_ids`: a list of ints per row) used as the rows'
ids. Knows nothing about tokenizers or parts: `_text_rows` makes results of what this reads.

What TRL's files do not say, and this cannot invent: the dataset's answer (join your dataset, see
`join_dataset`), the system message the chat template added (the logged prompt is the dataset's),
which completions were cut at `max_completion_length` (the completion text has special tokens
stripped: pass `max_completion_length` to mark rows whose length reaches it), the steps between
`logging_steps` (only one step in `logging_steps` is written: the log lists them as missing), and
token ids and logprobs (re-tokenized unless a `completion_ids` column was logged).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Any

from ..core._errors import LogError
from ._text_rows import TextStep, numbered_files

__all__ = ["TRL_LAYOUT", "read_trl"]

TRL_LAYOUT = "TRL 1.16 GRPOTrainer log_completions (completions/completions_{step:05d}.parquet)"
_FILE = re.compile(r"^completions_(\d{5,})\.parquet$")
_REQUIRED = ("step", "prompt", "completion", "advantage")
IDS_COLUMN = "completion_ids"


def _files(folder: str) -> list[tuple[int, str]]:
    inner = os.path.join(folder, "completions")
    where = inner if os.path.isdir(inner) else folder
    return numbered_files(where, _FILE, missing=f"{folder} does not exist: give TRL's output_dir (or its completions/ folder)",
                          empty=f"{where} holds no completions_*.parquet: is it the output_dir of a TRL run with "
                                f"log_completions=True? (expected the layout of {TRL_LAYOUT})")


def _messages(value: Any) -> Any:
    """A logged prompt or completion: a str, or a list of messages (parquet gives numpy arrays)."""
    if isinstance(value, str):
        return value
    try:
        return [{k: v for k, v in dict(m).items() if v is not None} for m in list(value)]
    except (TypeError, ValueError):
        return str(value)


def _completion_text(value: Any) -> str:
    messages = _messages(value)
    if isinstance(messages, str):
        return messages
    return "".join(str(m.get("content", "")) for m in messages if m.get("role", "assistant") == "assistant")


def read_trl(folder: str | os.PathLike[str], *, reward_columns: Sequence[str] | None = None) -> tuple[list[TextStep], list[str]]:
    """Every logged step of a TRL run, and what the import should say (which columns were taken
    as rewards). `reward_columns`: the reward functions' columns (default: the float columns
    between `completion` and `advantage`, TRL's order, less a `completion_ids` column).

    Raises:
        LogError: no files, or a file in a layout this version does not know.
    """
    import numpy as np
    import pandas as pd

    steps: list[TextStep] = []
    taken: list[str] | None = None
    for step, path in _files(os.fspath(folder)):
        try:
            df = pd.read_parquet(path)
        except (OSError, ValueError) as err:
            raise LogError(f"{path} cannot be read as parquet ({err})", path=path) from err
        missing = [c for c in _REQUIRED if c not in df.columns]
        if missing:
            raise LogError(f"{path} is not in the layout this rlgen reads ({TRL_LAYOUT}): it lacks {missing}; its "
                           f"columns are {list(df.columns)}. A TRL version that logs otherwise needs an rlgen that "
                           "knows it", path=path)
        cols = list(df.columns)
        between = cols[cols.index("completion") + 1: cols.index("advantage")]
        names = list(reward_columns) if reward_columns is not None else [
            c for c in between if c != IDS_COLUMN and pd.api.types.is_float_dtype(df[c])]
        unknown = [c for c in names if c not in cols]
        if unknown:
            raise LogError(f"{path} has no reward column {unknown}; its columns are {cols}", path=path)
        taken = names if taken is None else taken
        ids = None
        if IDS_COLUMN in cols:
            ids = [[int(t) for t in np.asarray(v).tolist()] for v in df[IDS_COLUMN]]
        extra = {c: df[c].tolist() for c in between if c not in names and c != IDS_COLUMN}
        steps.append(TextStep(step=step, prompts=[_messages(p) for p in df["prompt"]],
                              completions=[_completion_text(c) for c in df["completion"]],
                              rewards={n: df[n].astype(float).tolist() for n in names},
                              advantage=df["advantage"].astype(float).tolist(), completion_ids=ids, extra=extra))
    notes = [f"imported from TRL's log_completions files ({TRL_LAYOUT}); reward columns: {taken}"]
    return steps, notes
