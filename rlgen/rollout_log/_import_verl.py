"""verl's rollout dumps (`trainer.rollout_data_dir`), read as a rollout log's steps.

Owns: finding the files (`<rollout_data_dir>/{step}.jsonl`, written by verl 0.9's
`RayPPOTrainer._write_generations`), checking each line is the layout this version knows (keys
`input`, `output`, `gts`, `score`, `step`, then the reward manager's extra fields, e.g. `acc`,
`pred`, `request_id`; a file of another layout is refused, saying which keys were expected), and
making each step's rows: the decoded prompt and response texts, `score` as the logged reward
(named `score`), `gts` as the `ground_truth` column (what a verl-style reward reads again), the
extra fields kept as columns, and the prompt groups (by `uid` where the rows carry one); schema
drift between files and a `step` key unlike the file name, noted. Knows nothing about tokenizers
or parts: `_text_rows` makes results.

What verl's files do not say: token ids and logprobs (the texts were decoded with
`skip_special_tokens=True`, so the chat template's special tokens are gone from `input`: the rows
are re-tokenized from text), the finish reasons, the data source, and, unless the rows carry verl's
`uid` (a reward manager's extra field: one per GRPO group), which rows were one group: rows with
the same `input` in a step are then taken as one, so a prompt sampled twice in a step is one
group here, and the notes say how many groups are larger than the usual one.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import numpy as np

from ..core._errors import LogError
from ._text_rows import FrameworkLog, TextStep, drift_note, numbered_files, step_mismatch_note, text_groups

__all__ = ["VERL_LAYOUT", "read_verl"]

VERL_LAYOUT = "verl 0.9 rollout_data_dir ({step}.jsonl lines with input, output, gts, score, step)"
_FILE = re.compile(r"^(\d+)\.jsonl$")
_REQUIRED = ("input", "output", "gts", "score", "step")


def _files(folder: str) -> list[tuple[int, str]]:
    return numbered_files(folder, _FILE, missing=f"{folder} does not exist: give verl's trainer.rollout_data_dir",
                          empty=f"{folder} holds no {{step}}.jsonl files: is it a verl run's trainer.rollout_data_dir? "
                                f"(expected the layout of {VERL_LAYOUT})")


def _lines(path: str) -> list[dict[str, Any]]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for k, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise LogError(f"{path} line {k} is not JSON ({err}); a file cut short by a crash ends mid-line",
                               path=path) from err
            missing = [key for key in _REQUIRED if key not in row]
            if missing:
                raise LogError(f"{path} line {k} is not in the layout this rlgen reads ({VERL_LAYOUT}): it lacks "
                               f"{missing}; its keys are {sorted(row)}", path=path)
            rows.append(row)
    return rows


_JSON_TYPES = {bool: "boolean", int: "number", float: "number", str: "string", list: "array", dict: "object"}


def _key_types(rows: list[dict[str, Any]]) -> dict[str, str]:
    """Each key of a file's lines and its JSON type (of its first value that is not null)."""
    types: dict[str, str] = {}
    for row in rows:
        for key, value in row.items():
            if types.get(key, "null") == "null":
                types[key] = "null" if value is None else _JSON_TYPES.get(type(value), type(value).__name__)
    return types


def _groups(steps: list[TextStep], uids: dict[int, list[Any]]) -> str:
    """Each step's groups: by verl's `uid` where every row of the step has one, else by input text;
    what the notes say about it."""
    sizes: list[int] = []
    by_uid = 0
    for rows in steps:
        if all(u is not None for u in uids[rows.step]):
            rows.groups = text_groups([str(u) for u in uids[rows.step]])
            by_uid += 1
        else:
            rows.groups = text_groups(rows.prompts)
            sizes += np.bincount(rows.groups).tolist()
    if by_uid == len(steps):
        return "prompt groups: by verl's uid (one per GRPO group), so a prompt sampled twice in a step stays two groups"
    note = ("prompt groups: by input text where the rows carry no uid" + (f" ({len(steps) - by_uid} of {len(steps)} "
            "steps; the others by verl's uid)" if by_uid else "") + ": rows with one input in a step are taken as one "
            "group, so a prompt sampled twice in a step is one group here")
    usual = max(set(sizes), key=sizes.count) if sizes else 0
    larger = sum(size > usual for size in sizes)
    if larger:
        note += (f"; {larger} groups have more rows than the usual {usual}: likely one prompt in several groups (log "
                 "verl's uid as a reward extra field to tell them apart)")
    return note


def read_verl(folder: str | os.PathLike[str]) -> FrameworkLog:
    """Every dumped step of a verl run, with its groups, and what the import should say.

    Raises:
        LogError: no files, or a line in a layout this version does not know.
    """
    steps = []
    uids: dict[int, list[Any]] = {}
    signatures: list[tuple[int, dict[str, str]]] = []
    mismatched: dict[str, list[Any]] = {}
    for step, path in _files(os.fspath(folder)):
        rows = _lines(path)
        signatures.append((step, _key_types(rows)))
        if rows and (logged := sorted({r["step"] for r in rows}, key=str)) != [step]:
            mismatched[os.path.basename(path)] = logged
        extra_keys = [k for k in dict.fromkeys(k for r in rows for k in r) if k not in _REQUIRED]
        extra: dict[str, list[Any]] = {k: [r.get(k) for r in rows] for k in extra_keys}
        extra["ground_truth"] = [r["gts"] for r in rows]
        uids[step] = [r.get("uid") for r in rows]
        steps.append(TextStep(step=step, prompts=[str(r["input"]) for r in rows],
                              completions=[str(r["output"]) for r in rows],
                              rewards={"score": [float("nan") if r["score"] is None else float(r["score"]) for r in rows]},
                              extra=extra))
    notes = [f"imported from verl's rollout_data_dir ({VERL_LAYOUT}); the reward is verl's 'score' "
             "(token_level_scores summed)", _groups(steps, uids)]
    drift = drift_note(signatures, what="files' keys (name and JSON type)")
    mismatch = step_mismatch_note(mismatched, column="step")
    return FrameworkLog(steps=steps, notes=notes + [n for n in (drift, mismatch) if n])
