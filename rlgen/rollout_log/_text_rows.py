"""What a training framework's text-only log becomes in a rollout log: a result per step.

Owns: `TextStep` (one step's rows as a framework logged them: prompt and completion texts, reward
columns, an advantage, extra columns, token ids where the framework logged them, and each row's
GRPO group where the framework's reader could tell it) and `FrameworkLog` (a reader's steps, notes
and the run's settings it found); `text_result`, which makes a step a `Rollouts`: prompts and
completions tokenized with the tokenizer the user named (unless ids were logged), every row marked
`retokenized` where its ids were made from text (no logprobs; nothing downstream claims token
faithfulness for it), prompt groups as the reader gave them (else by prompt text, in order of first
appearance), finish reasons as far as they can be known (logged ids ending with EOS say "stop"; a
length at or above `max_completion_length` says "length"; otherwise "unknown", never a guess of
"stop"), the logged rewards as the reward columns `add_rewards` writes (`reward_<name>`, its
status, the weighted `reward`, the group columns) with the logged advantage kept as it was. What
an import checks and says before the log exists: the user's dataset in the forms accepted
(`as_dataframe`) joined on the prompt (`join_steps`: a join that matches nothing and prompts listed
twice with different values are warned of), the rows re-tokenized once and the notes on them
(`prepare_rows`: finish reasons counted, rows longer than the run could sample, the chat
template's default system message the logged prompt does not show, steps that repeat another
step's rows), schema drift and a logged step unlike the file name (`drift_note`,
`step_mismatch_note`); finding a framework's numbered files (`numbered_files`); and
`LogImportWarning`, the category of what an import warns of. Knows nothing about any framework's
layout: `_import_trl` and `_import_verl` read those.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core._columns import CLIENT_COLUMNS, COLUMNS, EPISODE_COLUMNS, GROUP_COLUMNS, LOG_COLUMNS
from ..core._errors import LogError
from ..rewards._group_stats import group_arrays
from ..rollouts._build import rollouts_from_responses

if TYPE_CHECKING:
    import pandas as pd

    from ..rollouts._rollouts import Rollouts

__all__ = ["DATASET_FORMS", "FrameworkLog", "LogImportWarning", "TextStep", "as_dataframe", "default_system_message",
           "drift_note", "join_steps", "numbered_files", "prepare_rows", "prompt_text", "repeated_steps",
           "step_mismatch_note", "text_groups", "text_result"]

_OWN = frozenset((*COLUMNS, *CLIENT_COLUMNS, *EPISODE_COLUMNS, *GROUP_COLUMNS, *LOG_COLUMNS))


@dataclass
class TextStep:
    """One step's rows as a framework logged them (one list entry per row)."""

    step: int
    prompts: list[Any]                    # a text, or chat messages (a list of {"role", "content"})
    completions: list[str]
    rewards: dict[str, list[float]]       # function name -> its logged value per row
    advantage: list[float] | None = None  # the advantage the trainer logged, kept as it was
    completion_ids: list[list[int]] | None = None  # the sampled ids, where the framework logged them
    extra: dict[str, list[Any]] = field(default_factory=dict)  # other logged columns, kept
    groups: list[int] | None = None       # each row's GRPO group where the reader knows it; else by prompt text
    tokens: list[list[int]] | None = None  # the completions re-tokenized (`prepare_rows`), where no ids were logged


@dataclass
class FrameworkLog:
    """What a framework reader found: the steps, what the import should say, and the run's own
    settings where its files hold them (None: not found; the user's arguments come first)."""

    steps: list[TextStep]
    notes: list[str]
    max_completion_length: int | None = None
    weights: dict[str, float] | None = None


class LogImportWarning(UserWarning):
    """An import found something its rows should not be read without: logged advantages its groups
    do not reproduce, a dataset join that matched nothing or matched ambiguously, rows repeated
    under several steps. Each is in the log's notes too."""


def numbered_files(where: str, pattern: re.Pattern[str], *, missing: str, empty: str) -> list[tuple[int, str]]:
    """The files in `where` whose names match `pattern` (its group 1: a step), by step.

    Raises:
        LogError: `where` is not a folder (`missing`), or holds no such file (`empty`).
    """
    if not os.path.isdir(where):
        raise LogError(missing, path=where)
    found = sorted((int(m.group(1)), os.path.join(where, f)) for f in os.listdir(where) if (m := pattern.match(f)))
    if not found:
        raise LogError(empty, path=where)
    return found


def prompt_text(prompt: Any) -> str:
    """A prompt as text: itself, or chat messages as 'role: content' lines."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, Sequence) and all(isinstance(m, Mapping) for m in prompt):
        return "\n".join(f"{m.get('role')}: {m.get('content')}" for m in prompt)
    return str(prompt)


def text_groups(keys: Sequence[Any]) -> list[int]:
    """One group per distinct key (a prompt's text, verl's uid), numbered in order of first appearance."""
    index = {k: i for i, k in enumerate(dict.fromkeys(keys))}
    return [index[k] for k in keys]


def _prompt_ids(tokenizer: Any, prompt: Any) -> list[int]:
    if isinstance(prompt, str):
        return list(tokenizer.encode(prompt, add_special_tokens=False))
    messages = [dict(m) for m in prompt]
    return list(tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=False))


def _rendered(tokenizer: Any, prompt: Any) -> str:
    """The prompt as the model saw it: chat messages through the chat template (as rlgen's own
    chat rows hold it), a text as it is."""
    if isinstance(prompt, str):
        return prompt
    text = tokenizer.apply_chat_template([dict(m) for m in prompt], tokenize=False, add_generation_prompt=True)
    return str(text)


def text_result(rows: TextStep, *, tokenizer: Any, source: str, weights: Mapping[str, float] | None = None,
                max_completion_length: int | None = None) -> Rollouts:
    """The step's rows as a Rollouts (see the module docstring); `source` names the framework."""
    n = len(rows.completions)
    texts = [prompt_text(p) for p in rows.prompts]
    group = rows.groups if rows.groups is not None else text_groups(texts)
    seen: dict[int, int] = {}
    sample = []
    for g in group:  # each row's place among its prompt's rows
        sample.append(seen.get(g, 0))
        seen[g] = sample[-1] + 1
    faithful = rows.completion_ids is not None
    ids = _completion_ids(rows, tokenizer)
    prompt_ids = {t: _prompt_ids(tokenizer, p) for t, p in zip(texts, rows.prompts)}
    rendered = {t: _rendered(tokenizer, p) for t, p in zip(texts, rows.prompts)}
    eos = getattr(tokenizer, "eos_token_id", None)
    finish = [_finish(i, faithful=faithful, eos=eos, limit=max_completion_length) for i in ids]
    entries = [{"text": c, "output_ids": i, "meta_info": {"id": f"{source}-{rows.step}-{k}", "completion_tokens": len(i),
                                                          "finish_reason": {"type": f, "matched": None}}}
               for k, (c, i, f) in enumerate(zip(rows.completions, ids, finish))]
    # A logged column named as one of rlgen's own (TRL's log_extra "completion_tokens", say) is kept
    # as "logged_<name>": rlgen's column says what rlgen knows, the logged one what the run said.
    extra: dict[str, list[Any]] = {(f"logged_{name}" if name in _OWN else name): _plain(values)
                                   for name, values in rows.extra.items()}
    chats = [p if not isinstance(p, str) else None for p in rows.prompts]
    if any(c is not None for c in chats):
        extra["prompt_messages"] = chats
    extra.update(_reward_columns(rows, group, weights or {}))
    extra["retokenized"] = [not faithful] * n
    res = rollouts_from_responses(entries, prompt_ids=[prompt_ids[t] for t in texts],
                                  prompt_texts=[rendered[t] for t in texts], n=1,
                                  pad_token_id=int(getattr(tokenizer, "pad_token_id", None) or 0), extra=extra,
                                  model=str(getattr(tokenizer, "name_or_path", "")), decode=None)
    res.df = res.df.assign(prompt_index=np.asarray(group, dtype=np.int64), sample_index=np.asarray(sample, dtype=np.int64))
    return res


def _completion_ids(rows: TextStep, tokenizer: Any) -> list[list[int]]:
    """The rows' completion ids: as logged, else re-tokenized (once: `prepare_rows` keeps them)."""
    if rows.completion_ids is not None:
        return rows.completion_ids
    if rows.tokens is None:
        rows.tokens = [list(tokenizer.encode(c, add_special_tokens=False)) for c in rows.completions]
    return rows.tokens


def prepare_rows(steps: Sequence[TextStep], *, tokenizer: Any, joined: list[str] | None,
                 max_completion_length: int | None) -> list[str]:
    """The rows re-tokenized once (kept for `text_result`), and the notes on what that and the rest
    of the import can and cannot know: the token ids, the dataset join (`joined`: its notes, None
    without a dataset), the finish reasons with their counts, re-tokenized rows longer than the run
    could sample, and the system message a chat template adds that the logged prompt does not show."""
    name = getattr(tokenizer, "name_or_path", None) or type(tokenizer).__name__
    faithful = sum(len(s.completions) for s in steps if s.completion_ids is not None)
    total = sum(len(s.completions) for s in steps)
    notes = [f"token ids: {total - faithful} of {total} rows re-tokenized from text with {name} (no logprobs; "
             "column 'retokenized')" + (f"; {faithful} rows kept the completion_ids the run logged" if faithful else "")]
    notes += joined if joined is not None else [
        "no dataset joined: columns the run did not log (the answer) are absent; pass dataset="]
    notes += _finish_notes(steps, tokenizer=tokenizer, limit=max_completion_length)
    system = _system_note(steps, tokenizer=tokenizer)
    repeated = repeated_steps(steps)
    if repeated:
        warnings.warn(repeated, LogImportWarning, stacklevel=5)  # at the from_trl / from_verl call
    return notes + [n for n in (system, repeated) if n]


def _step_fingerprint(rows: TextStep) -> str:
    """A step's rows as one digest: prompt, completion, rewards, advantage and logged ids, in order."""
    digest = hashlib.sha256()
    for k in range(len(rows.completions)):
        digest.update(json.dumps([prompt_text(rows.prompts[k]), rows.completions[k],
                                  sorted((name, values[k]) for name, values in rows.rewards.items()),
                                  None if rows.advantage is None else rows.advantage[k],
                                  None if rows.completion_ids is None else rows.completion_ids[k]],
                                 default=str).encode())
    return digest.hexdigest()


def repeated_steps(steps: Sequence[TextStep]) -> str | None:
    """Which steps' rows repeat an earlier step's, all of them in order (the same batch logged
    again under another step), said as a note; None where none does."""
    first: dict[str, int] = {}
    repeats: dict[int, list[int]] = {}  # the first step -> the steps that repeat it
    for rows in sorted(steps, key=lambda r: r.step):
        if not rows.completions:
            continue
        seen = first.setdefault(_step_fingerprint(rows), rows.step)
        if seen != rows.step:
            repeats.setdefault(seen, []).append(rows.step)
    if not repeats:
        return None
    said = "; ".join(f"step{'s' if len(later) > 1 else ''} {', '.join(map(str, later))} repeat{'' if len(later) > 1 else 's'} "
                     f"step {step}'s rows" for step, later in list(repeats.items())[:10])
    kept = sorted(first.values())
    return (f"rows repeated under several steps ({sum(map(len, repeats.values()))} steps): {said}"
            f"{'; ...' if len(repeats) > 10 else ''}. The run logged one batch under several steps (TRL does with "
            "num_iterations > 1, or steps_per_generation above gradient_accumulation_steps: its log holds the last "
            "generation batch); they are kept as logged, so count each batch once, e.g. log.rows(steps="
            f"{kept[:8]}{'...' if len(kept) > 8 else ''})")


def _finish_notes(steps: Sequence[TextStep], *, tokenizer: Any, limit: int | None) -> list[str]:
    """The finish reasons as `text_result` sets them, each with its rule and count; rows longer than
    `limit` (re-tokenized text gives other ids than were sampled; logged ids, another limit)."""
    eos = getattr(tokenizer, "eos_token_id", None)
    counts = {"stop": 0, "length": 0, "unknown": 0}
    over: dict[bool, list[tuple[int, int]]] = {True: [], False: []}  # logged ids? -> (step, length)
    for rows in steps:
        faithful = rows.completion_ids is not None
        for ids in _completion_ids(rows, tokenizer):
            counts[_finish(ids, faithful=faithful, eos=eos, limit=limit)] += 1
            if limit is not None and len(ids) > limit:
                over[faithful].append((rows.step, len(ids)))
    rules = []
    if any(rows.completion_ids is not None for rows in steps):
        rules.append(f"'stop' where the logged completion_ids end with EOS ({counts['stop']} rows)")
    if limit is not None:
        rules.append(f"'length' where a completion has >= {limit} tokens ({counts['length']} rows)")
    rules.append(f"'unknown' {'otherwise ' if rules else ''}({counts['unknown']} rows)")
    notes = ["finish reasons: " + ", ".join(rules) + ("" if limit is not None else
             "; the log does not say which completions were cut: pass max_completion_length=")]
    for logged, rows_over in over.items():
        if not rows_over:
            continue
        longest, where = max(n for _, n in rows_over), sorted({s for s, _ in rows_over})
        notes.append(f"{len(rows_over)} rows have more tokens than max_completion_length={limit} (up to {longest} > "
                     f"{limit}; steps {where[:10]}{' ...' if len(where) > 10 else ''}): " + (
                         "their logged completion_ids are longer than the run could sample: is "
                         "max_completion_length the run's?" if logged else
                         "the run cannot have sampled that many: re-tokenizing the decoded text gave other ids than "
                         "were sampled, so their ids, lengths and 'length' finish are approximate"))
    return notes


_SENTINEL = "rlgen-system-message-sentinel"


def default_system_message(tokenizer: Any, messages: Sequence[Mapping[str, Any]]) -> str | None:
    """The system message the chat template adds to `messages` (which have none), told by rendering
    them with and without a system message of our own; None where it adds none (or renders none)."""
    try:
        bare = _rendered(tokenizer, [dict(m) for m in messages])
        marked = _rendered(tokenizer, [{"role": "system", "content": _SENTINEL}, *[dict(m) for m in messages]])
    except Exception:  # a template that refuses a system role, or a tokenizer without one: nothing to tell
        return None
    head, found, tail = marked.partition(_SENTINEL)
    if not found or not bare.startswith(head):
        return None
    k = 0  # the rendering after the system message is the same in both: their common end, within tail
    while k < min(len(tail), len(bare) - len(head)) and bare[-1 - k] == tail[-1 - k]:
        k += 1
    return bare[len(head):len(bare) - k].strip() or None


def _system_note(steps: Sequence[TextStep], *, tokenizer: Any) -> str | None:
    """What the rows' prompts hold that the log does not show: the template's default system message."""
    bare = [p for rows in steps for p in rows.prompts
            if not isinstance(p, str) and not any(m.get("role") == "system" for m in p)]
    added = default_system_message(tokenizer, bare[0]) if bare else None
    if added is None:
        return None
    total = sum(len(rows.prompts) for rows in steps)
    name = getattr(tokenizer, "name_or_path", None) or type(tokenizer).__name__
    return (f"system message: {len(bare)} of {total} rows are chats without one in the log; {name}'s chat template "
            f"adds its default one when rendering them ({added[:120]!r}), as it did for the trainer if the run used "
            "this template: the rows' prompt text and ids hold it, the logged prompt does not show it")


def drift_note(signatures: Sequence[tuple[int, Mapping[str, str]]], *, what: str) -> str | None:
    """Schema drift between files: for each file (by step) whose columns (name -> type) differ from
    the file before it, what it adds, drops or retypes; None where every file has the same."""
    changes = []
    for (_, before), (step, after) in itertools.pairwise(signatures):
        parts = [f"adds {[c for c in after if c not in before]}" if any(c not in before for c in after) else "",
                 f"drops {[c for c in before if c not in after]}" if any(c not in after for c in before) else "",
                 ", ".join(f"{c} {before[c]} -> {after[c]}" for c in after if c in before and before[c] != after[c])]
        if any(parts):
            changes.append(f"step {step} " + ", ".join(p for p in parts if p))
    if not changes:
        return None
    return (f"schema drift: the {what} differ between files ({len(changes)} changes): " + "; ".join(changes[:8])
            + ("; ..." if len(changes) > 8 else "") + "; a column a step lacks is empty in its rows, and reward "
            "columns are read per file")


def step_mismatch_note(mismatched: Mapping[str, list[Any]], *, column: str) -> str | None:
    """Files whose logged step (`column`) is not the step in their name (file -> the values logged)."""
    if not mismatched:
        return None
    shown = "; ".join(f"{f} says {v}" for f, v in list(mismatched.items())[:5])
    return (f"step {column!r} disagrees with the file name in {len(mismatched)} files ({shown}"
            f"{'; ...' if len(mismatched) > 5 else ''}): the file name's step is used (renamed or edited files?)")


def _finish(ids: list[int], *, faithful: bool, eos: int | None, limit: int | None) -> str:
    """What can be known of how a sample ended: "stop" where the logged (sampled) ids end with EOS;
    "length" where they reach `limit`; else "unknown" (re-tokenized text has no EOS to see)."""
    if faithful and eos is not None and ids and ids[-1] == eos:
        return "stop"
    if limit is not None and len(ids) >= limit:
        return "length"
    return "unknown"


def _plain(values: list[Any]) -> list[Any]:
    """A logged column as parquet holds it: nested values (lists, dicts) as JSON text."""
    if any(isinstance(v, (dict, list, tuple, np.ndarray)) for v in values):
        return [None if v is None else json.dumps(v.tolist() if isinstance(v, np.ndarray) else v) for v in values]
    return values


def _reward_columns(rows: TextStep, group: list[int], weights: Mapping[str, float]) -> dict[str, list[Any]]:
    """The logged rewards as add_rewards' columns: per function its value and status ("ok", or
    "none" where the framework logged NaN), `reward` (the weighted sum of the finite values, NaN
    where none is), the group columns, and the logged advantage where there is one."""
    n = len(rows.completions)
    out: dict[str, list[Any]] = {}
    total = np.zeros(n)
    finite_any = np.zeros(n, dtype=bool)
    for name, values in rows.rewards.items():
        v = np.asarray(values, dtype=np.float64)
        ok = np.isfinite(v)
        out[f"reward_{name}"] = v.tolist()
        out[f"reward_{name}_status"] = ["ok" if k else "none" for k in ok]
        total += np.where(ok, v, 0.0) * float(weights.get(name, 1.0))
        finite_any |= ok
    reward = np.where(finite_any, total, np.nan)
    stats = group_arrays(reward, np.asarray(group))
    out.update({"reward": reward.tolist(), "group_mean": stats.mean.tolist(), "group_std": stats.std.tolist(),
                "group_zero_std": stats.zero_std.tolist()})
    if rows.advantage is not None:
        out["advantage"] = [float(a) for a in rows.advantage]
    return out


DATASET_FORMS = ("a pandas DataFrame, a datasets.Dataset, a list of dicts (one per row), or the path of a .json, "
                 ".jsonl or .parquet file")


def as_dataframe(dataset: Any) -> pd.DataFrame:
    """`dataset=` as a DataFrame: a DataFrame, a `datasets.Dataset` (told by its module, not imported),
    a list of dicts, or a .json (records, or JSON lines as `Dataset.to_json` writes), .jsonl or
    .parquet file; JSON values are kept as written (no type guessing).

    Raises:
        TypeError: another kind of object (the message names the accepted ones).
        ValueError: a file of another suffix, or one that holds no records.
        FileNotFoundError: a path that is not a file.
    """
    import pandas as pd

    if isinstance(dataset, pd.DataFrame):
        return dataset
    if isinstance(dataset, (str, os.PathLike)):
        return pd.DataFrame(_dataset_records(os.fspath(dataset)))
    if isinstance(dataset, list) and dataset and all(isinstance(r, Mapping) for r in dataset):
        return pd.DataFrame([dict(r) for r in dataset])
    if type(dataset).__module__.split(".")[0] == "datasets":
        if callable(getattr(dataset, "to_pandas", None)):
            table = dataset.to_pandas()
            if isinstance(table, pd.DataFrame):
                return table
        if callable(getattr(dataset, "keys", None)):
            raise TypeError(f"dataset= is a {type(dataset).__name__} of splits {list(dataset.keys())}: pass the "
                            "split the run trained on, e.g. dataset=ds['train']")
    what = "an empty list" if isinstance(dataset, list) and not dataset else type(dataset).__name__
    raise TypeError(f"dataset= takes {DATASET_FORMS}; got {what}")


def _dataset_records(path: str) -> list[dict[str, Any]]:
    """A dataset file's rows as dicts (see `as_dataframe`)."""
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in (".json", ".jsonl", ".parquet"):
        raise ValueError(f"dataset={path!r}: a file's suffix must be .json, .jsonl or .parquet (dataset= takes "
                         f"{DATASET_FORMS})")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"dataset={path!r} is not a file: give the dataset the run trained on ({DATASET_FORMS})")
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        rows: list[Any] = pq.read_table(path).to_pylist()
    else:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        lines = suffix == ".jsonl" or not text.lstrip().startswith("[")
        rows = [json.loads(line) for line in text.splitlines() if line.strip()] if lines else json.loads(text)
    if not rows or not all(isinstance(r, dict) for r in rows):
        raise ValueError(f"dataset={path!r} holds no records (rows as objects with the prompt column)")
    return rows


def join_steps(steps: Sequence[TextStep], dataset: Any, *, on: str) -> list[str]:
    """The dataset's other columns added to each step's rows (where a row has no column of that
    name), matched on the prompt: its text, chat prompts by their last user message (a framework's
    logged prompt may omit the system message its chat template adds). A prompt listed more than
    once with different values is ambiguous: its rows are left unjoined (None), never given one of
    them. Returns the notes; warns (`LogImportWarning`) where no row matched or prompts were ambiguous.

    Raises:
        TypeError, ValueError, FileNotFoundError: `dataset` is not one of the forms accepted
            (`as_dataframe`), or has no column `on`.
    """
    table = as_dataframe(dataset)
    if on not in table.columns:
        raise ValueError(f"the dataset has no column {on!r} to join on (dataset_prompt=); its columns: "
                         f"{list(table.columns)}")
    others = [c for c in table.columns if c != on]
    first: dict[str, int] = {}
    values: dict[str, set[str]] = {}
    for k, key in enumerate(_join_key(p) for p in table[on].tolist()):
        first.setdefault(key, k)
        values.setdefault(key, set()).add(json.dumps([_plain_value(table[c].iat[k]) for c in others], default=str))
    unclear = {key for key, seen in values.items() if len(seen) > 1}
    matched = ambiguous = total = 0
    for rows in steps:
        keys = [_join_key(p) for p in rows.prompts]
        positions = [None if key in unclear else first.get(key) for key in keys]
        rows.extra.update({c: [None if k is None else table[c].iat[k] for k in positions]
                           for c in others if c not in rows.extra})
        matched += sum(k is not None for k in positions)
        ambiguous += sum(key in unclear for key in keys)
        total += len(keys)
    notes = [f"dataset joined on {on!r}: {matched} of {total} rows matched a dataset row (by the prompt's last user "
             "message)"]
    if unclear:
        example = sorted(unclear)[0]
        notes.append(f"dataset join ambiguous: {len(unclear)} prompts are listed more than once with different "
                     f"values (e.g. {example[:80]!r}: {len(values[example])} versions); the {ambiguous} logged rows "
                     "with such a prompt were left unjoined (None): which row the run trained on cannot be told. "
                     "Deduplicate the dataset, or join on a column that tells them apart")
    if matched == 0 and total:
        logged = next((_join_key(p) for rows in steps for p in rows.prompts), "")
        listed = next(iter(first), "")
        notes.append(f"dataset join matched none of the {total} rows: no logged prompt is in column {on!r} (logged: "
                     f"{logged[:60]!r}; dataset: {listed[:60]!r}); check that dataset_prompt= names the column of the "
                     "prompts the run trained on, and that this is the run's dataset")
    for note in notes[1:]:
        warnings.warn(note, LogImportWarning, stacklevel=4)
    return notes


def _plain_value(value: Any) -> Any:
    """A dataset value as JSON-able data (numpy arrays as lists), to tell two rows' values apart."""
    if isinstance(value, np.ndarray):
        return [_plain_value(v) for v in value.tolist()]
    if isinstance(value, (list, tuple)):
        return [_plain_value(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain_value(v) for k, v in value.items()}
    if isinstance(value, np.generic):
        return value.item()
    return value


def _join_key(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt.strip()
    if isinstance(prompt, np.ndarray):  # a chat as parquet and datasets give it back
        prompt = prompt.tolist()
    if isinstance(prompt, Sequence) and prompt and all(isinstance(m, Mapping) for m in prompt):
        users = [m for m in prompt if m.get("role") == "user"]
        return str((users[-1] if users else prompt[-1]).get("content", "")).strip()
    return str(prompt).strip()
