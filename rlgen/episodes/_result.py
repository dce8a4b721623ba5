"""The result of multi-turn episodes: one record per episode, DataFrames, padded tensors.

Owns: `EpisodeRecord` (one episode's conversation, its token-in/token-out ids with a per-token loss
mask, logprob, turn index and role, its status and per-turn details), `episodes_frame` (a row per
episode), `turns_frame` (a row per turn) and `EpisodesResult` (the records with `.df`, `.turns`
and `.tensors()`, right-padded torch tensors for a trainer). pandas and torch are imported inside
the functions that use them.

Knows nothing about servers, HTTP, sampling, environments or the Engine: it reads records.

Statuses: "done" (the environment ended it), "max_turns", "context_limit" (the next request would not
fit the model's context), "env_error", "env_timeout", "bad_env_return", "bad_tool_call", a tool's
status ("tool_error", "tool_timeout", "bad_arguments", "not_serialisable"), "template_error" (the chat
template could not render the new messages token-faithfully), "request_error" (the server refused or
failed a request), "cancelled" (Ctrl-C before it finished), "running" (not finished yet).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd
    import torch

__all__ = ["EpisodeRecord", "EpisodesResult", "episodes_frame", "turns_frame"]


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
        status / error / traceback: how it ended (see the module docstring), and why.
        turns: one dict per turn (assistant turns and environment replies, in order): role, text,
            tokens, logprob_mean, tool_calls, tool_calls_failed, finish_reason, cached_tokens,
            prompt_tokens, latency_s.
        env_seconds: the time spent in the environment (reset, steps, tools).
        data: the prompt's data as given to the environment.
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
    status: str = "running"
    error: str | None = None
    traceback: str | None = None
    turns: list[dict[str, Any]] = field(default_factory=list)
    env_seconds: float = 0.0
    data: Any = None

    def extend(self, ids: Sequence[int], *, role: str, turn: int, mask: int = 0,
               logprobs: Sequence[float] | None = None) -> None:
        """Append `ids` with their per-token labels (logprobs 0.0 unless given)."""
        self.ids.extend(int(i) for i in ids)
        self.loss_mask.extend([mask] * len(ids))
        self.logprobs.extend([float(x) for x in logprobs] if logprobs is not None else [0.0] * len(ids))
        self.turn_ids.extend([turn] * len(ids))
        self.roles.extend([role] * len(ids))

    @property
    def assistant_turns(self) -> list[dict[str, Any]]:
        return [t for t in self.turns if t["role"] == "assistant"]

    @property
    def sampled_tokens(self) -> int:
        return sum(self.loss_mask)

    def __repr__(self) -> str:
        return (f"EpisodeRecord(prompt={self.prompt_index}, sample={self.sample_index}, status={self.status!r}, "
                f"turns={len(self.assistant_turns)}, tokens={len(self.ids)}, sampled={self.sampled_tokens}"
                + (f", error={self.error!r}" if self.error else "") + ")")


def _cached_share(record: EpisodeRecord) -> float | None:
    """Cached tokens over prompt tokens sent, for the requests after the first (None: no such request)."""
    later = record.assistant_turns[1:]
    sent = sum(int(t.get("prompt_tokens") or 0) for t in later)
    if not later or sent == 0:
        return None
    return sum(int(t.get("cached_tokens") or 0) for t in later) / sent


def episodes_frame(records: Sequence[EpisodeRecord]) -> pd.DataFrame:
    """A row per episode: prompt_index, sample_index, status, turns (assistant turns), tokens,
    sampled_tokens, tool_calls, tool_calls_failed, finish_reason (of the last assistant turn),
    env_seconds, cached_share (cached tokens / prompt tokens sent after turn 1), error."""
    import pandas as pd

    rows = []
    for r in records:
        assistant = r.assistant_turns
        rows.append({
            "prompt_index": r.prompt_index, "sample_index": r.sample_index, "status": r.status,
            "turns": len(assistant), "tokens": len(r.ids), "sampled_tokens": r.sampled_tokens,
            "tool_calls": sum(int(t.get("tool_calls") or 0) for t in r.turns),
            "tool_calls_failed": sum(int(t.get("tool_calls_failed") or 0) for t in r.turns),
            "finish_reason": assistant[-1].get("finish_reason") if assistant else None,
            "env_seconds": r.env_seconds, "cached_share": _cached_share(r), "error": r.error,
        })
    columns = ["prompt_index", "sample_index", "status", "turns", "tokens", "sampled_tokens", "tool_calls",
               "tool_calls_failed", "finish_reason", "env_seconds", "cached_share", "error"]
    return pd.DataFrame(rows, columns=columns)


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


@dataclass
class EpisodesResult:
    """What `Engine.episodes` returns: `records` (one `EpisodeRecord` per episode, prompt-major),
    `.df` (a row per episode), `.turns` (a row per turn), `.tensors()` (padded tensors)."""

    records: list[EpisodeRecord]
    pad_id: int = 0
    tokenizer: Any = None
    interrupted: bool = False

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> EpisodeRecord:
        return self.records[i]

    def __repr__(self) -> str:
        counts: dict[str, int] = {}
        for r in self.records:
            counts[r.status] = counts.get(r.status, 0) + 1
        return f"EpisodesResult({len(self.records)} episodes: {', '.join(f'{k}={v}' for k, v in counts.items())})"

    @property
    def df(self) -> pd.DataFrame:
        return episodes_frame(self.records)

    @property
    def turns(self) -> pd.DataFrame:
        return turns_frame(self.records)

    def tensors(self) -> dict[str, torch.Tensor]:
        """Right-padded tensors, a row per episode: `input_ids` (padded with the pad id),
        `attention_mask`, `loss_mask`, `logprobs`, `turn_ids` (padded with 0)."""
        import torch

        n = len(self.records)
        width = max((len(r.ids) for r in self.records), default=0)
        out = {
            "input_ids": torch.full((n, width), int(self.pad_id), dtype=torch.long),
            "attention_mask": torch.zeros((n, width), dtype=torch.long),
            "loss_mask": torch.zeros((n, width), dtype=torch.long),
            "logprobs": torch.zeros((n, width), dtype=torch.float32),
            "turn_ids": torch.zeros((n, width), dtype=torch.long),
        }
        for i, r in enumerate(self.records):
            k = len(r.ids)
            if not k:
                continue
            out["input_ids"][i, :k] = torch.tensor(r.ids, dtype=torch.long)
            out["attention_mask"][i, :k] = 1
            out["loss_mask"][i, :k] = torch.tensor(r.loss_mask, dtype=torch.long)
            out["logprobs"][i, :k] = torch.tensor(r.logprobs, dtype=torch.float32)
            out["turn_ids"][i, :k] = torch.tensor(r.turn_ids, dtype=torch.long)
        return out
