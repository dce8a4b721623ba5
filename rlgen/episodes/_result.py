"""One episode as the runner fills it: `EpisodeRecord`, its `Turn`s, and a turns frame of records.

Owns: `EpisodeRecord` (one episode's conversation, its token-in/token-out ids with a per-token loss
mask, logprob, turn index, role and weight version index, its status and per-turn details), `Turn` (one assistant turn or
environment reply: the turns frame's columns, `TURN_COLUMNS`, and what only one role has; kept in a
record as its dict), `turns_frame` (a row per turn of some records) and the episodes' data as
columns (`data_columns`: a dict's keys, refused where they name one of rlgen's own columns). The
result users get is `Episodes` (`_episodes`), built from these records. pandas is imported inside
the function that uses it.

Knows nothing about servers, HTTP, sampling, environments, the Engine or `Rollouts`: it holds records.

Statuses: "done" (the environment ended it), "max_turns", "context_limit" (the next request would not
fit the model's context), "env_error", "env_timeout", "bad_env_return", "bad_tool_call", a tool's
status ("tool_error", "tool_timeout", "bad_arguments", "not_serialisable"), "template_error" (the chat
template could not render the new messages token-faithfully), "request_error" (the server refused or
failed a request), "cancelled" (Ctrl-C before it finished), "running" (not finished yet).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from ..core._columns import RESERVED_DATA_NAMES

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["TURN_COLUMNS", "EpisodeRecord", "Turn", "data_columns", "turns_frame"]


@dataclass
class EpisodeRecord:
    """One episode.

    Attributes:
        prompt_index / sample_index: which prompt, and which of its n episodes.
        messages: the whole conversation: the prompt's chat (plus what the environment's reset
            added), each assistant turn's text decoded from its sampled ids, the environment's messages.
        ids: the whole trajectory as sent and sampled (never re-tokenized).
        prompt_len: the length of the first request's ids.
        loss_mask: 1 on the tokens the model sampled (its EOS included), 0 elsewhere (prompt, a
            closing EOS the environment appended, the environment's messages).
        logprobs: the sampled tokens' logprobs as the server returned them, 0.0 elsewhere.
        turn_ids: per token, the index of the assistant turn it belongs to or follows (0 for the
            prompt and the first turn's tokens, k for turn k and the environment messages after it).
        roles: per token, "prompt", "assistant" or "env" (a closing EOS counts as "env").
        versions: per token, the weight version index that sampled it (an assistant turn continued
            across a pause: each segment's own, `client._continuation.segment_versions`); -1 on
            the tokens the model did not sample, and where the version is not known.
        status / error / traceback: how it ended (see the module docstring), and why.
        turns: one dict per turn (assistant turns and environment replies, in order): role, text,
            tokens, logprob_mean, tool_calls, tool_calls_failed, finish_reason, cached_tokens,
            prompt_tokens, latency_s.
        env_seconds: the time spent in the environment (reset, steps, tools).
        data: the prompt's data as given to the environment.
        n_prompt_messages: how many of `messages` are the prompt's (its chat and what the
            environment's reset added); -1 until the runner knows.
        env: the framework's own environment object behind the episode's (`EpisodeEnv.obj`), kept
            in memory for reward functions that take `environments`; None for rlgen's own.
    """

    prompt_index: int
    sample_index: int
    messages: list[dict[str, Any]] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    prompt_len: int = 0
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turn_ids: list[int] = field(default_factory=list)
    roles: list[str] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    status: str = "running"
    error: str | None = None
    traceback: str | None = None
    turns: list[dict[str, Any]] = field(default_factory=list)
    env_seconds: float = 0.0
    data: Any = None
    n_prompt_messages: int = -1
    env: Any = None

    def extend(self, ids: Sequence[int], *, role: str, turn: int, mask: int = 0,
               logprobs: Sequence[float] | None = None, versions: int | Sequence[int] = -1) -> None:
        """Append `ids` with their per-token labels (logprobs 0.0 unless given; `versions` one
        version index for them all or one per id, -1: not sampled / not known), as given: Python
        ints and floats, which is what the server's decoded answers and the tokenizer give (this
        runs for every turn of every episode, so it converts nothing).

        Raises:
            ValueError: `logprobs` or `versions` of another length than `ids`.
        """
        # labelled first: `label` checks before it appends, so a refused call appends nothing
        self.label(len(ids), role=role, turn=turn, mask=mask, logprobs=logprobs, versions=versions)
        self.ids.extend(ids)

    def label(self, n: int, *, role: str, turn: int, mask: int = 0, logprobs: Sequence[float] | None = None,
              versions: int | Sequence[int] = -1) -> None:
        """The per-token labels of `n` ids already appended to `ids` (`extend` is both): the runner
        appends a turn's ids before its next request and labels them while the server works on it,
        so that between the two the per-token lists are shorter than `ids`.

        Raises:
            ValueError: `logprobs` or `versions` of another length than `n`.
        """
        if logprobs is not None and len(logprobs) != n:
            raise ValueError(f"{len(logprobs)} logprobs for {n} ids")
        if not isinstance(versions, int) and len(versions) != n:
            raise ValueError(f"{len(versions)} versions for {n} ids")
        # a record made by hand without versions keeps none (its lists would not line up with ids)
        if len(self.versions) == len(self.loss_mask):
            self.versions.extend([versions] * n if isinstance(versions, int) else versions)
        self.loss_mask.extend([mask] * n)
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * n)
        self.turn_ids.extend([turn] * n)
        self.roles.extend([role] * n)

    @property
    def assistant_turns(self) -> list[dict[str, Any]]:
        return [t for t in self.turns if t["role"] == "assistant"]

    @property
    def sampled_tokens(self) -> int:
        return sum(self.loss_mask)

    @property
    def step_rewards(self) -> list[float] | None:
        """The environment's reward of each step that gave one, in order (None: no step gave one)."""
        rewards = [t["reward"] for t in self.turns if t["role"] == "env" and t.get("reward") is not None]
        return [float(r) for r in rewards] if rewards else None

    def __repr__(self) -> str:
        return (f"EpisodeRecord(prompt={self.prompt_index}, sample={self.sample_index}, status={self.status!r}, "
                f"turns={len(self.assistant_turns)}, tokens={len(self.ids)}, sampled={self.sampled_tokens}"
                + (f", error={self.error!r}" if self.error else "") + ")")


@dataclass
class Turn:
    """One turn of an episode: an assistant turn (`role` "assistant": sampled, one request) or the
    environment's reply after it (`role` "env"). Its fields are `TURN_COLUMNS` (after the episode's
    prompt_index and sample_index), then what only one role has: an assistant turn's `rid`,
    `weight_version`, `matched_stop` and, as a `GenerationJob`'s rows have them, `n_segments` (its
    requests: more than one when a weight update's pause cut it and it went on), `kv_staleness` and
    `num_retractions`; an environment reply's `status`, `done`, `calls` (per tool
    call: name, arguments, status, error, result; a malformed call's parser), `roles` (of its
    messages), `reward` (the step's, when the environment gives one) and `info` (what else it said). `as_dict()` is the
    form a record keeps (and a parquet file stores): each role's own keys, in a fixed order."""

    turn: int
    role: str
    text: str | None = None
    tokens: int = 0
    logprob_mean: float | None = None
    tool_calls: int | None = None
    tool_calls_failed: int | None = None
    finish_reason: str | None = None
    cached_tokens: int | None = None
    prompt_tokens: int | None = None
    latency_s: float | None = None
    rid: str | None = None
    weight_version: Any = None
    matched_stop: Any = None
    n_segments: int = 1
    kv_staleness: str = "fresh"
    num_retractions: int = 0
    status: str | None = None
    done: bool = False
    calls: list[dict[str, Any]] = field(default_factory=list)
    roles: list[Any] = field(default_factory=list)
    reward: float | None = None
    info: dict[str, Any] = field(default_factory=dict)

    # Each role's keys, in order: the common ones, then the role's own.
    _KEYS: ClassVar[dict[str, tuple[str, ...]]] = {
        role: ("turn", "role", "text", "tokens", "logprob_mean", "tool_calls", "tool_calls_failed", "finish_reason",
               "cached_tokens", "prompt_tokens", "latency_s", *own)
        for role, own in (("assistant", ("rid", "weight_version", "matched_stop", "n_segments", "kv_staleness",
                                         "num_retractions")),
                          ("env", ("status", "done", "calls", "roles", "reward", "info")))}

    def as_dict(self) -> dict[str, Any]:
        fields = self.__dict__
        return {k: fields[k] for k in self._KEYS[self.role]}


def data_columns(items: Sequence[Any]) -> dict[str, list[Any]]:
    """The episodes' data (one item per episode) as columns: a dict's keys when every item is a
    dict, else one column `data`; none when every item is None.

    Raises:
        ValueError: a dict's key names one of rlgen's own columns (`reward`, `status`, ...).
    """
    if all(x is None for x in items):
        return {}
    if all(isinstance(x, Mapping) for x in items):
        keys = list(dict.fromkeys(k for x in items for k in x))
        clash = sorted(set(keys) & set(RESERVED_DATA_NAMES), key=str)
        if clash:
            raise ValueError(f"data's names {clash} would replace rlgen's own columns; rename them (e.g. "
                             f"'gold_{clash[0]}'). Names rlgen writes itself: {', '.join(RESERVED_DATA_NAMES)}")
        return {k: [x.get(k) for x in items] for k in keys}
    return {"data": list(items)}


TURN_COLUMNS = ["prompt_index", "sample_index", "turn", "role", "text", "tokens", "logprob_mean", "tool_calls",
                "tool_calls_failed", "finish_reason", "cached_tokens", "prompt_tokens", "latency_s"]


def turns_frame(records: Sequence[EpisodeRecord]) -> pd.DataFrame:
    """A row per turn (assistant turns and environment replies): prompt_index, sample_index, turn,
    role, text, tokens, logprob_mean, tool_calls, tool_calls_failed, finish_reason, cached_tokens,
    prompt_tokens, latency_s."""
    import pandas as pd

    rows = [{"prompt_index": r.prompt_index, "sample_index": r.sample_index,
             **{k: t.get(k) for k in TURN_COLUMNS[2:]}} for r in records for t in r.turns]
    return pd.DataFrame(rows, columns=TURN_COLUMNS)
