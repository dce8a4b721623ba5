"""`Episodes`: multi-turn episodes as a `Rollouts`, so everything a result does, an episode does.

Owns: the `Episodes` class (a `Rollouts` whose row is one episode: the prompt is the first
request's ids, the response is everything after it, assistant-sampled and environment tokens
alike, with `loss_mask` 1 on sampled tokens only, a per-token `turn_ids` and `versions`), building one from the
runner's `EpisodeRecord`s (`episodes_from_records`), reading records back (`records`, `episode`),
the turns frame (`turns`), per-turn rewards (`add_turn_rewards`), the drift inspector over its rows (`check_drift`, `drift`,
`drift_summary`), and the `roles` tensor. Selection, concat, parquet, the view, rewards, group
statistics, `Engine.score` and `rlgen.compare` / `ab` are `Rollouts`' own and work unchanged.

Knows nothing about servers, sampling, environments or the Engine: it reads records and flat arrays.

Where the columns come from (COLUMNS, then EPISODE_COLUMNS, then the prompt's data):
`completion` is the last assistant turn's text (the episode's answer, what reward functions that
take a `completion` read); `completion_messages` is every message after the prompt (TRL's
multi-turn `completions`); `prompt_messages` the prompt's chat (with what the environment's reset
added); `finish_reason` / `matched_stop` / `weight_version` / `rid` are the last assistant turn's;
`cached_tokens` and `request_latency_s` sum over turns; `logprob_sum` / `logprob_mean` are over
the sampled tokens.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from itertools import chain
from typing import TYPE_CHECKING, Any

import numpy as np
from typing_extensions import Unpack

from ..client._continuation import kv_staleness
from ..core._columns import COLUMNS, EPISODE_COLUMNS
from ..core._options import RewardOptions, takes_options
from ..core._ragged import row_offsets
from ..rollouts._flat import FlatRollouts
from ..rollouts._rollouts import Rollouts
from ..rollouts._runs import new_run_id, text_series
from ..rollouts._token_text import TokenText
from ._drift import Drift, drift, drift_summary
from ._result import TURN_COLUMNS, EpisodeRecord, data_columns

if TYPE_CHECKING:
    import pandas as pd
    import torch

    from ..rewards._scoring import RewardFunctions

__all__ = ["ENV_KEY", "ROLE_CODES", "Episodes", "episodes_from_records"]

# The meta_info key of an episode's framework environment object (in memory only: a key that
# starts with "_" is not written to parquet).
ENV_KEY = "_env"

# The `roles` tensor's codes: 0 padding, 1 a token the model sampled, 2 a token it did not
# (the environment's and tools' messages, a closing EOS the environment appended).
ROLE_CODES = {"pad": 0, "assistant": 1, "env": 2}


_SCALARS = (str, int, float, bool, type(None))


def _json_safe(value: Any) -> Any:
    """`value` as JSON would hold it: dicts with str keys, lists, str, int, float, bool and None;
    anything else (a tuple, an object a tool returned, a key of another type) becomes what
    `json.loads(json.dumps(value, default=repr))` makes of it. A value that is plain already is
    kept as it is, not copied (the records it comes from are the runner's, dropped after the call)."""
    try:
        if _plain(value):
            return value
    except RecursionError:
        pass
    return json.loads(json.dumps(value, default=repr))


def _plain(value: Any) -> bool:
    """Whether `value` holds nothing but what JSON holds as it is (leaves checked inline: the turns
    of every episode pass through here)."""
    kind = type(value)
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str or (type(item) not in _SCALARS and not _plain(item)):
                return False
        return True
    if kind is list:  # a loop, not all(...): a generator per list costs more than the check itself
        for item in value:  # noqa: SIM110
            if type(item) not in _SCALARS and not _plain(item):
                return False
        return True
    return kind in _SCALARS


def _turns_safe(turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """An episode's turns, JSON-safe (`_json_safe`): an assistant turn's are already (its text and
    numbers, and what the server's decoded JSON said: `sample_turn`), so only the environment's
    replies, which hold what a user's environment and tools returned, are checked."""
    out = turns
    for i, turn in enumerate(turns):
        if turn.get("role") != "assistant":
            safe = _json_safe(turn)
            if safe is not turn:
                out = list(turns) if out is turns else out
                out[i] = safe
    return out


def _flat(records: Sequence[EpisodeRecord], field: str, dtype: Any, count: int) -> np.ndarray:
    """One record field's lists (ids, logprobs, ...), end to end, as one array."""
    return np.fromiter(chain.from_iterable(getattr(r, field) for r in records), dtype=dtype, count=count)


def episodes_from_records(records: Sequence[EpisodeRecord], *, pad_token_id: int, tokenizer: Any = None,
                          model: str = "", sampling: dict[str, Any] | None = None,
                          run_record: dict[str, Any] | None = None,
                          tools: Sequence[Mapping[str, Any]] | None = None,
                          framework: bool = False, current_version: int | None = None) -> Episodes:
    """An `Episodes` of `records` (prompt-major, as the runner fills them), one new run.
    `framework`: the episodes ran another framework's environment, so each row keeps its
    environment object (None where none was made) for reward functions that take `environments`.
    When some token's weight version index is known (the records' `versions`; a record whose
    `versions` do not line up with its ids counts as not known, -1), `versions` and the columns
    `version_min` / `version_max` (over each row's sampled tokens; -1 for a row without one),
    `staleness` (`current_version`, the Engine's version index now, minus `version_min`; -1 for a
    row without one; only given `current_version`), and, as a `GenerationJob`'s rows, `n_segments`
    (its assistant turns' requests), `kv_staleness` (the worst of its turns') and `num_retractions`."""
    import pandas as pd

    n, run = len(records), new_run_id()
    p_len = np.array([r.prompt_len for r in records], dtype=np.int64)
    total = np.array([len(r.ids) for r in records], dtype=np.int64)
    r_len = total - p_len
    count = int(total.sum())
    # Each record's ids end to end; a token is its row's response from the row's prompt_len on.
    row = np.repeat(np.arange(n, dtype=np.int64), total)
    response = np.arange(count, dtype=np.int64) - np.repeat(row_offsets(total)[:-1], total) >= p_len[row]
    ids = _flat(records, "ids", np.int64, count)
    logprobs = _flat(records, "logprobs", np.float64, count)[response]
    mask = _flat(records, "loss_mask", np.bool_, count)[response]
    rows_of = row[response]
    versions = _versions(records, count, response)
    # Summed in order in float64, as sum() over each row's sampled logprobs would.
    sums = np.bincount(rows_of, weights=np.where(mask, logprobs, 0.0), minlength=n)
    sampled = np.bincount(rows_of, weights=mask, minlength=n)
    prompts: dict[tuple[int, ...], str] = {}  # the n episodes of a prompt start from the same ids
    rows: list[dict[str, Any]] = []
    for i, r in enumerate(records):
        assistant = r.assistant_turns
        last = assistant[-1] if assistant else {}
        k = r.n_prompt_messages if r.n_prompt_messages >= 0 else len(r.messages)
        prompt = None
        if tokenizer is not None:
            key = tuple(r.ids[:r.prompt_len])
            prompt = prompts.get(key)
            if prompt is None:
                prompt = prompts[key] = tokenizer.decode(list(key))
        rows.append({
            "prompt_index": r.prompt_index, "sample_index": r.sample_index, "prompt": prompt,
            "completion": last.get("text") or "", "finish_reason": last.get("finish_reason") or "unknown",
            "matched_stop": last.get("matched_stop"), "prompt_tokens": r.prompt_len,
            "completion_tokens": len(r.ids) - r.prompt_len,
            "cached_tokens": sum(int(t.get("cached_tokens") or 0) for t in assistant),
            "logprob_sum": float(sums[i]) if sampled[i] else math.nan,
            "logprob_mean": float(sums[i] / sampled[i]) if sampled[i] else math.nan,
            "request_latency_s": float(sum(float(t.get("latency_s") or 0.0) for t in assistant)),
            "weight_version": last.get("weight_version"), "rid": last.get("rid"), "error": r.error, "run": run,
            "row_id": len(rows),
            "status": r.status, "turns": len(assistant), "sampled_tokens": int(sampled[i]),
            "tool_calls": sum(int(t.get("tool_calls") or 0) for t in r.turns),
            "tool_calls_failed": sum(int(t.get("tool_calls_failed") or 0) for t in r.turns),
            "env_seconds": r.env_seconds, "cached_share": _cached_share(r),
            "prompt_messages": _json_safe(r.messages[:k]), "completion_messages": _json_safe(r.messages[k:]),
        })
    own = [c for c in (*COLUMNS, *EPISODE_COLUMNS, "prompt_messages") if rows and c in rows[0]]
    df = pd.DataFrame(rows, columns=own)
    df["prompt"] = text_series(df["prompt"].tolist())
    df["completion"] = text_series(df["completion"].tolist())
    df["run"] = text_series([run] * n)
    df["row_id"] = np.arange(n, dtype=np.int64)
    steps = [r.step_rewards for r in records]
    if any(s is not None for s in steps):
        df["step_rewards"] = [s or [] for s in steps]
    columns = {**_version_columns(records, versions, rows_of, current_version), **data_columns([r.data for r in records])}
    for name, values in columns.items():
        df[name] = values
    schemas = _json_safe(list(tools or [])) or None  # the same tools for every episode of the call
    meta = [{"turns": _turns_safe(r.turns), "traceback": r.traceback, "tools": schemas,
             **({ENV_KEY: r.env} if framework or r.env is not None else {})} for r in records]
    return Episodes(**FlatRollouts(
        df=df, prompt_ids=ids[~response], prompt_offsets=row_offsets(p_len),
        response_ids=ids[response], response_offsets=row_offsets(r_len), meta_info=meta,
        pad_token_id=int(pad_token_id),
        fields={
            "logprobs": logprobs.astype(np.float32),
            "loss_mask": mask,
            "turn_ids": _flat(records, "turn_ids", np.int32, count)[response],
            "versions": versions,
        },
        model=model, run_sampling={run: sampling}, run_records={run: run_record},
        decode=TokenText(tokenizer) if tokenizer is not None else None,
    ).kwargs())


def _versions(records: Sequence[EpisodeRecord], count: int, response: np.ndarray) -> np.ndarray | None:
    """The response tokens' version indices (int32; -1 where not known: a record whose `versions`
    do not line up with its ids), from every record's end to end; None when no token's is known."""
    if not any(len(r.versions) == len(r.ids) and r.versions and max(r.versions) >= 0 for r in records):
        return None
    parts = [r.versions if len(r.versions) == len(r.ids) else [-1] * len(r.ids) for r in records]
    kept: np.ndarray = np.fromiter(chain.from_iterable(parts), dtype=np.int32, count=count)[response]
    return kept


def _version_columns(records: Sequence[EpisodeRecord], versions: np.ndarray | None, rows: np.ndarray,
                     current: int | None) -> dict[str, Any]:
    """`core._columns.VERSION_COLUMNS` of each record's row (none without versions; `staleness`
    only given the `current` version index)."""
    if versions is None:
        return {}
    columns: dict[str, Any] = _version_range(versions, rows, len(records))
    low = columns["version_min"]
    if current is not None:
        columns["staleness"] = np.where(low < 0, -1, current - low)
    turns = [r.assistant_turns for r in records]
    columns["n_segments"] = [sum(int(t.get("n_segments") or 1) for t in ts) for ts in turns]
    columns["kv_staleness"] = [kv_staleness(str(t.get("kv_staleness") or "fresh") for t in ts) for ts in turns]
    columns["num_retractions"] = [sum(int(t.get("num_retractions") or 0) for t in ts) for ts in turns]
    return columns


def _version_range(versions: np.ndarray, rows: np.ndarray, n: int) -> dict[str, np.ndarray]:
    """`version_min` / `version_max`: each of `n` rows' oldest and newest known version (`versions`
    >= 0 of the tokens whose row is `rows`), int64, -1 for a row without one."""
    known = versions >= 0
    values, of = versions[known].astype(np.int64), rows[known]
    low, high = np.full(n, np.iinfo(np.int64).max), np.full(n, -1, np.int64)
    np.minimum.at(low, of, values)
    np.maximum.at(high, of, values)
    return {"version_min": np.where(high < 0, -1, low), "version_max": high}


def _cached_share(record: EpisodeRecord) -> float:
    """Cached tokens over prompt tokens sent, for the requests after the first (NaN: no such request)."""
    later = record.assistant_turns[1:]
    sent = sum(int(t.get("prompt_tokens") or 0) for t in later)
    if not later or sent == 0:
        return math.nan
    return sum(int(t.get("cached_tokens") or 0) for t in later) / sent


class Episodes(Rollouts):
    """Multi-turn episodes: a `Rollouts` with a row per episode (what `Engine.episodes` returns).

    Everything a `Rollouts` does works on it: `res[...]`, `where`, `concat`, `to_parquet` /
    `Episodes.from_parquet`, the view and `browse()`, `add_rewards` (TRL-style functions get each
    episode's messages after the prompt as its completion), `group_stats`, `Engine.score`,
    `rlgen.compare` and `rlgen.ab`.

    Tensors are `Rollouts`' (see its table): `prompt_ids` is the first request's ids, `response_ids`
    everything after it (the model's turns and the environment's messages, as sent and sampled,
    never re-tokenized), `logprobs` the sampled logprobs (0.0 on environment tokens), `loss_mask`
    1 on the tokens the model sampled (EOS included) only, `turn_ids` the assistant turn of each
    token, `versions` the weight version index that sampled each token (-1 on the environment's
    tokens and padding; None for episodes made without versions), and `roles` [N, R] int64 (`ROLE_CODES`: 1 sampled, 2 environment, 0 padding). A policy-
    gradient loss is the single-turn one::

        t = res.add_rewards(reward).tensors()
        P = t["prompt_ids"].shape[1]
        logits = model(t["input_ids"], attention_mask=t["attention_mask"]).logits[:, P - 1:-1]
        lp = logits.log_softmax(-1).gather(-1, t["response_ids"][..., None])[..., 0]
        loss = -(t["token_advantages"] * lp).sum() / t["loss_mask"].sum()

    DataFrame columns: `Rollouts`' (see `rlgen.episodes._episodes` for what each means for an
    episode), then `status` (see below), `turns` (assistant turns), `sampled_tokens`, `tool_calls`,
    `tool_calls_failed`, `env_seconds`, `cached_share` (cached / prompt tokens of the requests
    after the first: the prefix cache serving the history), `version_min` / `version_max` (over
    the sampled tokens' `versions`, where known; -1 for a row without one), `prompt_messages`,
    `completion_messages`, after `check_drift` `drift` / `drift_turn` / `drift_position`, then the
    prompts' data.

    Statuses: "done" (the environment ended it), "max_turns", "context_limit", "env_error",
    "env_timeout", "bad_env_return", "bad_tool_call", a tool's status ("tool_error",
    "tool_timeout", "bad_arguments", "not_serialisable"), "template_error", "request_error",
    "error" (an unexpected failure, with its traceback), "cancelled" (Ctrl-C).
    """

    # -- records and turns -----------------------------------------------------------------------
    def episode(self, i: int) -> EpisodeRecord:
        """Row i as an `EpisodeRecord`: the whole conversation, ids, masks and turns."""
        i = int(self._index(i)[0])
        row = self.df.iloc[i]
        (prompt,) = self.id_lists("prompt", rows=[i])
        tok = self.tokens(i)
        n_p, ids = len(prompt), [*prompt, *(int(x) for x in tok["ids"])]
        mask = [0] * n_p + [int(m) for m in (tok["loss_mask"] if tok["loss_mask"] is not None else [1] * len(tok["ids"]))]
        lps = tok["logprobs"] if tok["logprobs"] is not None else np.zeros(len(tok["ids"]), np.float32)
        turns = tok["turn_ids"] if tok["turn_ids"] is not None else np.zeros(len(tok["ids"]), np.int32)
        versions = tok["versions"] if tok["versions"] is not None else np.full(len(tok["ids"]), -1, np.int32)
        meta = self.meta_info[i]
        data = {c: row[c] for c in self.data_columns}
        record = EpisodeRecord(
            prompt_index=int(row["prompt_index"]), sample_index=int(row["sample_index"]),
            messages=[*row["prompt_messages"], *row["completion_messages"]], ids=ids, prompt_len=n_p, loss_mask=mask,
            logprobs=[0.0] * n_p + [0.0 if math.isnan(x) else float(x) for x in lps],
            turn_ids=[0] * n_p + [int(t) for t in turns],
            roles=["prompt"] * n_p + ["assistant" if m else "env" for m in mask[n_p:]],
            versions=[-1] * n_p + [int(v) for v in versions],
            status=str(row["status"]), error=row["error"] if isinstance(row["error"], str) else None,
            traceback=meta.get("traceback"),
            turns=list(meta.get("turns") or []), env_seconds=float(row["env_seconds"]),
            data=data.get("data") if list(data) == ["data"] else (data or None), env=meta.get(ENV_KEY),
        )
        record.n_prompt_messages = len(row["prompt_messages"])
        return record

    def _row_objects(self) -> dict[str, list[Any]]:
        """`environments`: each episode's framework environment object (TRL's reward functions take
        them), when the episodes ran one; kept in memory only (a parquet file drops them)."""
        if not any(ENV_KEY in m for m in self.meta_info):
            return {}
        return {"environments": [m.get(ENV_KEY) for m in self.meta_info]}

    @property
    def records(self) -> list[EpisodeRecord]:
        """Every row as an `EpisodeRecord` (built on each access)."""
        return [self.episode(i) for i in range(len(self))]

    @property
    def turns(self) -> pd.DataFrame:
        """A row per turn (assistant turns and the environment's replies): `run`, `row_id`,
        prompt_index, sample_index, turn, role, text, tokens, logprob_mean, tool_calls,
        tool_calls_failed, finish_reason, cached_tokens, prompt_tokens, latency_s, status (an environment reply's), calls (an
        environment reply's tool calls: name, arguments, status, error), reward (an environment
        reply's step reward, when it gives one; an assistant turn's after `add_turn_rewards`) and
        info (what an environment said about a step, when it said anything)."""
        import pandas as pd

        df = self._checked_df()
        keys = df[["run", "row_id", "prompt_index", "sample_index"]].to_dict("records")
        turns = [t for m in self.meta_info for t in m.get("turns") or []]
        rewarded = any(t.get("reward") is not None for t in turns)
        said = any(t.get("info") for t in turns)
        columns = ["run", "row_id", "prompt_index", "sample_index", *TURN_COLUMNS[2:], "status", "calls",
                   *(["reward"] if rewarded else []), *(["info"] if said else [])]
        rows = [{**key, **{c: t.get(c) for c in columns[4:]}}
                for key, meta in zip(keys, self.meta_info) for t in meta.get("turns") or []]
        return pd.DataFrame(rows, columns=columns)

    def tensors(self) -> dict[str, torch.Tensor]:
        """`Rollouts.tensors()` plus `roles` [N, R] int64 (`ROLE_CODES`)."""
        import torch

        out = super().tensors()
        lm, rm = out["loss_mask"], out["response_mask"]
        out["roles"] = torch.where(lm, ROLE_CODES["assistant"], torch.where(rm, ROLE_CODES["env"], ROLE_CODES["pad"]))
        return out

    # -- per-turn rewards ------------------------------------------------------------------------
    @takes_options(RewardOptions)
    def add_turn_rewards(self, funcs: RewardFunctions, /, **options: Unpack[RewardOptions]) -> Episodes:
        """Score every assistant turn on its own; returns a copy with `turn_rewards` (per episode,
        a list with each assistant turn's combined reward, NaN where it failed) and a `reward`
        column in `.turns` (on assistant turns). Each function sees a turn as a row: `completion` is
        the turn's text, `completion_ids` its sampled ids, `turn` its index, `prompt` the episode's
        prompt, TRL-style `prompts` the messages before the turn, plus the episode's `status` and
        data columns. Functions and options as `add_rewards` (per-turn statuses are not kept: the
        episode-level `add_rewards` is where failures are read)."""
        from ..core._options import resolve
        from ..rewards._scoring import rewards_columns
        from ..rewards._styles import RowBatch

        opts = resolve(RewardOptions, options)
        df = self._checked_df()
        rows: list[dict[str, Any]] = []
        ids: list[list[int]] = []
        chats: list[Any] = []
        where: list[tuple[int, int]] = []
        for i in range(len(self)):
            record = self.episode(i)
            turn_ids = np.asarray(record.turn_ids)
            mask = np.asarray(record.loss_mask, dtype=bool)
            spoken = [k for k, m in enumerate(record.messages) if m["role"] == "assistant"
                      and k >= record.n_prompt_messages]
            for j, turn in enumerate(t for t in record.turns if t["role"] == "assistant"):
                k = int(turn["turn"])
                rows.append({"prompt": df["prompt"][i], "completion": turn.get("text") or "", "turn": k,
                             "status": record.status, **{c: df[c][i] for c in self.data_columns}})
                ids.append([record.ids[p] for p in np.flatnonzero(mask & (turn_ids == k))])
                chats.append(record.messages[:spoken[j]] if j < len(spoken) else record.messages)
                where.append((i, j))
        columns = {c: [r.get(c) for r in rows] for c in (rows[0] if rows else {"completion": None})}
        batch = RowBatch(columns=columns, completion_ids=ids, prompt_ids=[[] for _ in ids],
                         data_columns=list(self.data_columns), chats=chats)
        out_cols, _ = rewards_columns(batch, np.array([i for i, _ in where], dtype=np.int64), funcs, opts)
        values = np.asarray(out_cols["reward"], dtype=np.float64)
        per_episode: list[list[float]] = [[] for _ in range(len(self))]
        meta = [{**m, "turns": [dict(t) for t in (m.get("turns") or [])]} for m in self.meta_info]
        assistant = [[t for t in m["turns"] if t.get("role") == "assistant"] for m in meta]
        for (i, j), value in zip(where, values):
            per_episode[i].append(float(value))
            assistant[i][j]["reward"] = float(value)
        out = self._shallow_copy()
        out.meta_info = meta
        out._df = self._df.assign(turn_rewards=per_episode)
        return out

    # -- the drift inspector ---------------------------------------------------------------------
    def _tokenizer(self, tokenizer: Any) -> Any:
        if tokenizer is not None:
            return tokenizer
        if isinstance(self.decode, TokenText):
            return self.decode.tokenizer()
        raise ValueError("these episodes carry no tokenizer; pass check_drift(tokenizer=...), the one they ran with")

    def drift(self, i: int, *, tokenizer: Any = None) -> Drift:
        """Row i's token-in/token-out ids against a trainer's re-render of its messages through
        the chat template: the first divergence (turn, position, tokens either side) and its cause.
        `tokenizer`: the one the episodes ran with (default) or another template to check."""
        record = self.episode(i)
        tools = self.meta_info[int(self._index(i)[0])].get("tools")
        return drift(self._tokenizer(tokenizer), record.messages, record.ids, roles=record.roles, tools=tools)

    def check_drift(self, *, tokenizer: Any = None) -> Episodes:
        """A copy with the drift inspector's columns: `drift` (the first divergence's cause: "same",
        "boundary", "rewritten history", "retokenized", "other"; None for an episode the model
        never answered), `drift_turn` and `drift_position` (None when the same). The view marks
        each drifted row; `drift_summary()` counts causes."""
        drifts = self._drifts(tokenizer)
        out = self._shallow_copy()
        import pandas as pd

        causes = pd.Series([d.cause if d is not None else None for d in drifts], dtype=object, index=self._df.index)
        out._df = self._df.assign(drift=causes,
                                  drift_turn=pd_int([d.turn if d is not None else None for d in drifts]),
                                  drift_position=pd_int([d.position if d is not None else None for d in drifts]))
        return out

    def _drifts(self, tokenizer: Any) -> list[Drift | None]:
        """Each row's drift; None for an episode the model never answered (nothing sampled to compare)."""
        sampled = self._df["sampled_tokens"].to_numpy()
        return [self.drift(i, tokenizer=tokenizer) if sampled[i] > 0 else None for i in range(len(self))]

    def drift_summary(self, *, tokenizer: Any = None) -> pd.DataFrame:
        """Episodes counted by the cause of their first divergence (see `rlgen.episodes.drift_summary`);
        episodes without a sampled token are left out."""
        return drift_summary(d for d in self._drifts(tokenizer) if d is not None)


def pd_int(values: Sequence[int | None]) -> Any:
    """A nullable integer column."""
    import pandas as pd

    return pd.array(values, dtype="Int64")
