"""TRL's completion logs (`GRPOConfig(log_completions=True)`), read as a rollout log's steps.

Owns: finding the files (`<output_dir>/completions/completions_{step:05d}.parquet`, TRL 1.16's
`GRPOTrainer.log`), checking each is the layout this version knows (columns `step`, `prompt`,
`completion`, one float column per reward function, the `log_extra` columns, `advantage`; a file
of another layout is refused, saying which columns were expected), reading conversational prompts
and completions (lists of messages) and plain ones, telling reward columns from `log_extra` ones,
and a log_extra column of token ids (`completion_ids`: a list of ints per row) used as the rows'
ids. The run's settings where its output holds them (`training_args.bin`, the GRPOConfig that
`Trainer.save_model` and every checkpoint write: read as data, no class of it is imported or run).
The GRPO groups as TRL forms them: `num_generations` consecutive rows (given, from the run's
settings, or inferred from runs of one prompt and checked on the logged advantage), never by prompt
text (a prompt sampled twice in one step is two groups), with the logged `advantage` recomputed
over them and the rows where it differs counted. What the files say about themselves: the reward
columns per file, schema drift between files, a `step` column unlike the file name. Knows nothing
about tokenizers or parts: `_text_rows` makes results of what this reads and joins the dataset.

What TRL's files do not say, and this cannot invent: the dataset's answer (join your dataset, see
`_text_rows.join_steps`), the system message the chat template added (the logged prompt is the dataset's),
which completions were cut at `max_completion_length` (the completion text has special tokens
stripped: pass `max_completion_length`, or keep the run's training_args.bin, to mark rows whose
length reaches it), the steps between `logging_steps` (only one step in `logging_steps` is
written: the log lists them as missing), and token ids and logprobs (re-tokenized unless a
`completion_ids` column was logged).
"""

from __future__ import annotations

import io
import itertools
import math
import os
import pickle
import re
import warnings
import zipfile
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..core._errors import LogError
from ..rewards._group_stats import AdvantageMethod, advantages
from ._text_rows import (
    FrameworkLog,
    LogImportWarning,
    TextStep,
    drift_note,
    numbered_files,
    prompt_text,
    step_mismatch_note,
    text_groups,
)

__all__ = ["TRL_LAYOUT", "read_trl", "run_settings"]

TRL_LAYOUT = "TRL 1.16 GRPOTrainer log_completions (completions/completions_{step:05d}.parquet)"
_FILE = re.compile(r"^completions_(\d{5,})\.parquet$")
_REQUIRED = ("step", "prompt", "completion", "advantage")
IDS_COLUMN = "completion_ids"
_SETTINGS_FILE = "training_args.bin"
_SETTINGS = ("num_generations", "scale_rewards", "multi_objective_aggregation", "reward_weights",
             "max_completion_length", "num_iterations", "steps_per_generation", "gradient_accumulation_steps")
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
_SCALE_METHOD: dict[str, AdvantageMethod] = {"group": "grpo", "batch": "batch", "none": "drgrpo"}  # TRL's scale_rewards -> rlgen's advantage
_MAX_SETTINGS_BYTES = 16 << 20


def _files(folder: str) -> list[tuple[int, str]]:
    inner = os.path.join(folder, "completions")
    where = inner if os.path.isdir(inner) else folder
    return numbered_files(where, _FILE, missing=f"{folder} does not exist: give TRL's output_dir (or its completions/ folder)",
                          empty=f"{where} holds no completions_*.parquet: is it the output_dir of a TRL run with "
                                f"log_completions=True? (expected the layout of {TRL_LAYOUT})")


class _Inert:
    """What a class named in the settings pickle becomes: built from its arguments and state, never run."""

    def __new__(cls, *args: Any, **kwargs: Any) -> _Inert:
        return object.__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args
        self.state: Any = None

    def __setstate__(self, state: Any) -> None:
        self.state = state


class _DataUnpickler(pickle.Unpickler):
    """A pickle read as data: every class it names (GRPOConfig, enums, torch.device) is an `_Inert`,
    plain containers are themselves, and nothing the pickle names is imported or run."""

    _PLAIN: Mapping[tuple[str, str], Any] = {("collections", "OrderedDict"): OrderedDict, ("builtins", "set"): set,
                                             ("builtins", "frozenset"): frozenset, ("builtins", "list"): list,
                                             ("builtins", "dict"): dict, ("builtins", "tuple"): tuple}

    def find_class(self, module: str, name: str) -> Any:
        return self._PLAIN.get((module, name)) or type(name, (_Inert,), {"__module__": f"inert.{module}"})

    def persistent_load(self, pid: Any) -> None:
        return None  # a tensor's storage: not read


def _plain(value: Any) -> Any:
    """A setting as plain data (an enum's value for the `_Inert` built from it)."""
    if isinstance(value, _Inert):
        return value.args[0] if len(value.args) == 1 and isinstance(value.args[0], (str, int, float)) else None
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _settings_file(folder: str) -> str | None:
    """The run's training_args.bin: in the output_dir (`Trainer.save_model`), else in its last checkpoint."""
    roots = [folder]
    if os.path.basename(os.path.normpath(folder)) == "completions":
        roots.append(os.path.dirname(os.path.normpath(folder)))
    for root in roots:
        if os.path.isfile(path := os.path.join(root, _SETTINGS_FILE)):
            return path
        checkpoints = sorted((int(m.group(1)), f) for f in (os.listdir(root) if os.path.isdir(root) else [])
                             if (m := _CHECKPOINT.match(f)))
        for _, name in reversed(checkpoints):
            if os.path.isfile(path := os.path.join(root, name, _SETTINGS_FILE)):
                return path
    return None


def run_settings(folder: str | os.PathLike[str]) -> tuple[dict[str, Any], str | None, str | None]:
    """The GRPO settings a TRL run saved (`training_args.bin`: its GRPOConfig, torch.save'd), the
    file they came from (None: no file), and why a file found could not be read (None: it was)."""
    path = _settings_file(os.fspath(folder))
    if path is None:
        return {}, None, None
    try:
        with zipfile.ZipFile(path) as z:
            info = next(i for i in z.infolist() if i.filename.endswith("data.pkl"))
            if info.file_size > _MAX_SETTINGS_BYTES:
                raise ValueError(f"its pickle has {info.file_size} bytes, not a config's few thousand")
            root = _DataUnpickler(io.BytesIO(z.read(info))).load()
    except Exception as err:  # a damaged or foreign file is a note, never a failed import: nothing of it ran
        return {}, path, f"{path} cannot be read as a torch.save'd GRPOConfig ({type(err).__name__}: {err})"
    state = root.state if isinstance(root, _Inert) else root
    state = state[0] if isinstance(state, tuple) and state else state
    if not isinstance(state, dict) or "num_generations" not in state:
        return {}, path, f"{path} holds no GRPOConfig (no num_generations): not the settings of a GRPO run"
    return {k: _plain(state.get(k)) for k in _SETTINGS}, path, None


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


def _runs(texts: Sequence[str]) -> list[int]:
    """The lengths of the runs of one prompt in consecutive rows."""
    lengths: list[int] = []
    for k, text in enumerate(texts):
        if k and text == texts[k - 1]:
            lengths[-1] += 1
        else:
            lengths.append(1)
    return lengths


def _weights(names: Sequence[str], given: Mapping[str, float] | None, settings: Mapping[str, Any]) -> dict[str, float]:
    """Each reward column's weight: as given, else the run's `reward_weights` (in reward_funcs
    order, the columns' order), else 1."""
    if given is not None:
        return {n: float(given.get(n, 1.0)) for n in names}
    saved = settings.get("reward_weights")
    if isinstance(saved, list) and len(saved) == len(names):
        return {n: float(w) for n, w in zip(names, saved)}
    return dict.fromkeys(names, 1.0)


def _recomputed(rows: TextStep, size: int, weights: Mapping[str, float], scale: str) -> np.ndarray:
    """TRL's advantage (sum_then_normalize) over groups of `size` consecutive rows; NaN made 0 as TRL does."""
    n = len(rows.completions)
    values = np.array([rows.rewards.get(name, [math.nan] * n) for name in weights], dtype=np.float64).reshape(-1, n)
    reward = np.nansum(values * np.array(list(weights.values()))[:, None], axis=0)
    reward[np.isnan(values).all(axis=0)] = np.nan
    out: np.ndarray = np.nan_to_num(advantages(reward, np.arange(n) // size, method=_SCALE_METHOD.get(scale, "grpo")))
    return out


def _differing(steps: Sequence[TextStep], size: int, weights: Mapping[str, float], scale: str) -> dict[int, tuple[int, int]]:
    """Per step: the rows whose logged advantage is not the one recomputed over groups of `size`,
    and the rows (steps whose rows do not divide into such groups are left out)."""
    out: dict[int, tuple[int, int]] = {}
    for rows in steps:
        n = len(rows.completions)
        if rows.advantage is None or not weights or n % size:
            continue
        logged = np.asarray(rows.advantage, dtype=np.float64)
        same = np.isclose(logged, _recomputed(rows, size, weights, scale), rtol=1e-3, atol=1e-3)
        out[rows.step] = (int((~same).sum()), n)
    return out


def _group_size(steps: Sequence[TextStep], *, given: int | None, settings: Mapping[str, Any], source: str | None,
                weights: Mapping[str, float], scale: str) -> tuple[int | None, str]:
    """TRL's `num_generations` and where it came from: as given, the run's settings, else inferred
    (the largest size dividing every run of one prompt whose groups reproduce the logged advantage;
    else that runs' common divisor). None where no row run says it (a prompt alone in a step)."""
    if given is not None:
        if isinstance(given, bool) or not isinstance(given, int) or given < 1:
            raise ValueError(f"num_generations must be a whole number >= 1 (GRPOConfig's), got {given!r}")
        return given, "num_generations as given"
    if isinstance(settings.get("num_generations"), int):
        return int(settings["num_generations"]), f"num_generations from {source}"
    runs = [r for rows in steps for r in _runs([prompt_text(p) for p in rows.prompts])]
    common = math.gcd(*runs) if runs else 1
    for size in (d for d in range(common, 1, -1) if common % d == 0):
        if not any(bad for bad, _ in _differing(steps, size, weights, scale).values()):
            return size, "inferred: the size whose groups reproduce the logged advantage (no training_args.bin)"
    if common > 1:
        return common, "inferred from the runs of one prompt (no training_args.bin)"
    return None, "not known (no training_args.bin, and a prompt stands alone in a step)"


def _position_groups(rows: TextStep, size: int, how: str) -> list[int]:
    """Each row's group: `size` consecutive rows, checked to share one prompt.

    Raises:
        LogError: the rows do not divide into groups of one prompt each (the size is not the run's).
    """
    n = len(rows.completions)
    texts = [prompt_text(p) for p in rows.prompts]
    if n % size:
        raise LogError(f"step {rows.step} has {n} rows, not a multiple of num_generations={size} ({how}): TRL logs "
                       "whole groups of num_generations consecutive rows; pass the run's num_generations=")
    for start in range(0, n, size):
        if len(set(texts[start:start + size])) > 1:
            raise LogError(f"num_generations={size} ({how}) puts rows of different prompts in one group at step "
                           f"{rows.step} (rows {start}..{start + size - 1}): a TRL group is num_generations consecutive "
                           "rows of one prompt; pass the run's num_generations=")
    return [k // size for k in range(n)]


def _group_notes(steps: Sequence[TextStep], *, size: int | None, how: str, weights: Mapping[str, float],
                 settings: Mapping[str, Any]) -> list[str]:
    """Each step's groups set (by position where the size is known, else by prompt text), and the
    notes: how they were formed, prompts in several groups of a step, the logged advantage checked."""
    if size is None:
        for rows in steps:
            rows.groups = text_groups([prompt_text(p) for p in rows.prompts])
        return [f"GRPO groups: by prompt text, since TRL's num_generations is {how}: a prompt sampled twice in one "
                "step is one group here but was two in the run; pass num_generations="]
    split = 0
    for rows in steps:
        rows.groups = _position_groups(rows, size, how)
        firsts = [prompt_text(rows.prompts[k]) for k in range(0, len(rows.prompts), size)]
        split += len(firsts) - len(set(firsts))
    notes = [f"GRPO groups: {size} consecutive rows each ({how}), as TRL forms them, not by prompt text"
             + (f"; {split} groups repeat a prompt another group of their step has (kept apart, as TRL trained them)"
                if split else "")]
    if settings.get("multi_objective_aggregation") == "normalize_then_sum":
        return [*notes, "logged advantage: not checked (multi_objective_aggregation='normalize_then_sum' "
                        "normalises over the batch)"]
    scale = str(settings.get("scale_rewards") or "group")
    differing = _differing(steps, size, weights, scale)
    bad = {step: count for step, (count, _) in differing.items() if count}
    total = sum(n for _, n in differing.values())
    how_computed = f"GRPO's over these groups (scale_rewards={scale!r}, reward weights {dict(weights)})"
    if not bad:
        return [*notes, f"logged advantage: {how_computed} reproduces it on all {total} rows"]
    note = (f"logged advantage: differs from {how_computed} on {sum(bad.values())} of {total} rows (steps "
            f"{sorted(bad)[:10]}): the run's groups, reward weights or scale_rewards were not these; pass "
            "num_generations= and reward_weights= as the run had them")
    warnings.warn(note, LogImportWarning, stacklevel=4)
    return [*notes, note]


def read_trl(folder: str | os.PathLike[str], *, reward_columns: Sequence[str] | None = None,
             reward_weights: Mapping[str, float] | None = None, num_generations: int | None = None) -> FrameworkLog:
    """Every logged step of a TRL run, with its GRPO groups, the run's settings found and what the
    import should say. `reward_columns`: the reward functions' columns (default: the float columns
    between `completion` and `advantage`, TRL's order, less a `completion_ids` column);
    `reward_weights` and `num_generations`: GRPOConfig's (default: the run's training_args.bin
    where the output holds one; else weights 1 and the group size inferred).

    Raises:
        LogError: no files, a file in a layout this version does not know, or groups of
            `num_generations` rows that do not share a prompt.
    """
    steps, taken, notes = _read_steps(os.fspath(folder), reward_columns)
    settings, source, unread = run_settings(folder)
    if source is not None and unread is None:
        notes.append(f"run settings from {source}: " + ", ".join(f"{k}={v!r}" for k, v in settings.items()))
    elif unread is not None:
        notes.append(f"run settings not read: {unread}")
    weights = _weights(taken, reward_weights, settings)
    scale = str(settings.get("scale_rewards") or "group")
    size, how = _group_size(steps, given=num_generations, settings=settings, source=source, weights=weights, scale=scale)
    notes += _group_notes(steps, size=size, how=how, weights=weights, settings=settings)
    limit = settings.get("max_completion_length")
    return FrameworkLog(steps=steps, notes=notes, max_completion_length=limit if isinstance(limit, int) else None,
                        weights=None if reward_weights is None and not settings.get("reward_weights") else weights)


def _read_steps(folder: str, reward_columns: Sequence[str] | None) -> tuple[list[TextStep], list[str], list[str]]:
    """Each file's rows as a step, every reward column taken (in order of first appearance), and
    the notes on the files: the reward columns, schema drift, a `step` column unlike the file name.

    Raises:
        LogError: no files, or a file in a layout this version does not know.
    """
    import pandas as pd

    steps: list[TextStep] = []
    taken: dict[int, list[str]] = {}
    signatures: list[tuple[int, dict[str, str]]] = []
    mismatched: dict[str, list[Any]] = {}
    for step, path in _files(folder):
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
        taken[step] = names
        signatures.append((step, {c: str(df[c].dtype) for c in cols}))
        if len(df) and (logged := sorted(set(df["step"].tolist()))) != [step]:
            mismatched[os.path.basename(path)] = logged
        ids = None
        if IDS_COLUMN in cols:
            ids = [[int(t) for t in np.asarray(v).tolist()] for v in df[IDS_COLUMN]]
        extra = {c: df[c].tolist() for c in between if c not in names and c != IDS_COLUMN}
        steps.append(TextStep(step=step, prompts=[_messages(p) for p in df["prompt"]],
                              completions=[_completion_text(c) for c in df["completion"]],
                              rewards={n: df[n].astype(float).tolist() for n in names},
                              advantage=df["advantage"].astype(float).tolist(), completion_ids=ids, extra=extra))
    return steps, list(dict.fromkeys(n for names in taken.values() for n in names)), _file_notes(taken, signatures,
                                                                                               mismatched)


def _file_notes(taken: Mapping[int, list[str]], signatures: list[tuple[int, dict[str, str]]],
                mismatched: Mapping[str, list[Any]]) -> list[str]:
    """What the files say about themselves: the reward columns (per file where they change), schema
    drift, a `step` column unlike the file's name."""
    kinds = list(dict.fromkeys(tuple(names) for names in taken.values()))
    if len(kinds) == 1:
        notes = [f"imported from TRL's log_completions files ({TRL_LAYOUT}); reward columns: {list(kinds[0])}"]
    else:
        changes = [f"from step {step}: {names}" for (_, before), (step, names) in itertools.pairwise(taken.items())
                   if names != before]
        notes = [f"imported from TRL's log_completions files ({TRL_LAYOUT}); reward columns differ between files: "
                 f"{next(iter(taken.values()))}, then " + "; ".join(changes)]
    drift = drift_note(signatures, what="files' columns (name and dtype)")
    step = step_mismatch_note(mismatched, column="step")
    return notes + [n for n in (drift, step) if n]
