"""SGLang's answer for one sample, read once: `Answer`, `read_answer`, and the entries rlgen makes.

Owns: where each field of a `/generate` entry lives and how it is spelt (`text`, `output_ids`, and
in `meta_info`: `finish_reason` as a dict or a bare string, its `matched` stop and abort message,
`prompt_tokens`, `completion_tokens`, `cached_tokens`, `e2e_latency`, `weight_version`, `id`, and
the per-token logprob lists), what counts as a finished sample, the entry that stands in for a
failed or aborted sample, and per-sample seeding (sample j of a prompt draws with seed + j).
Generation (`rollouts._response_arrays`, `client._generate`, the engine) and episodes
(`episodes._runner`) read answers through this module and nowhere else.

Knows nothing about HTTP, batching, numpy, results or episodes: it reads one decoded entry at a
time and keeps references to its per-token lists (never copies of them), so reading many
thousands of answers costs one small object each.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["FINISHED", "Answer", "completion_tokens", "failed_entry", "finish_kind", "read_answer", "sampled_ids",
           "seeded_sampling"]

# The finish kinds of a whole sample (it stopped, or reached its length limit); "abort" and
# "error" are samples that did not finish; rlgen's own scored completions say "score".
FINISHED = ("stop", "length")


@dataclass(frozen=True, slots=True)
class Answer:
    """One sample as SGLang answered it.

    `output_ids` is None when the entry has none (its ids are then the logprob entries' ids:
    `ids()`); the per-token lists are SGLang's own (`[logprob, token_id, text?]` entries), shared
    with the entry, not copied. `meta` is the entry's `meta_info` as sent.
    """

    text: str
    output_ids: list[int] | None
    finish: str                         # "stop", "length", "abort", "error", "score" or "unknown"
    matched_stop: Any                   # the stop string or token id that ended it, else None
    message: str | None                 # why, for "abort" and "error"
    prompt_tokens: int | None
    completion_tokens: int | None
    cached_tokens: int
    latency_s: float                    # SGLang's e2e_latency (the whole request's); NaN if absent
    weight_version: str | None
    rid: str | None
    output_logprobs: list[Any] | None
    output_top_logprobs: list[Any] | None
    input_logprobs: list[Any] | None
    meta: Mapping[str, Any]

    @property
    def finished(self) -> bool:
        """A whole sample: it stopped or reached its length limit (not aborted, not failed)."""
        return self.finish in FINISHED

    def ids(self) -> list[int]:
        """The sampled ids: `output_ids`, else the ids named by the output logprob entries."""
        if self.output_ids is not None:
            return self.output_ids
        return [t[1] for t in self.output_logprobs] if self.output_logprobs else []

    def token_logprobs(self) -> list[float]:
        """One float per sampled id (0.0 where the server gave None or no entry)."""
        n = len(self.ids())
        entries = self.output_logprobs or ()
        try:  # the usual answer: every entry a [logprob, id, text] list whose logprob is a JSON number
            values = [t[0] for t in entries]
            plain = None not in values
        except (TypeError, IndexError, KeyError):
            plain = False
        if not plain:
            values = [float(t[0]) if t and t[0] is not None else 0.0 for t in entries]
        return values[:n] + [0.0] * (n - len(values)) if len(values) != n else values


def read_answer(entry: Any, index: int = 0) -> Answer:
    """Read one decoded `/generate` entry. None (no answer) and an error object in place of an
    entry (`{"error": ...}`) read as a failed sample.

    Raises:
        TypeError: `entry` is neither a dict nor None (`index` names it in the message).
    """
    if entry is None:
        entry = failed_entry("no response for this sample")
    elif not isinstance(entry, dict):
        raise TypeError(f"response {index} must be a dict (an SGLang /generate entry) or None, "
                        f"got {type(entry).__name__}")
    elif "meta_info" not in entry and "error" in entry:
        err = entry["error"]
        entry = failed_entry(err.get("message", str(err)) if isinstance(err, dict) else str(err))
    meta = entry.get("meta_info") or {}
    finish = meta.get("finish_reason")
    finish = finish if isinstance(finish, dict) else ({"type": finish} if isinstance(finish, str) else {})
    kind = str(finish.get("type") or "unknown")
    latency = meta.get("e2e_latency")
    return Answer(
        text=entry.get("text") or "",
        output_ids=entry.get("output_ids"),
        finish=kind,
        matched_stop=finish.get("matched"),
        message=(finish.get("message") or None) if kind in ("abort", "error") else None,
        prompt_tokens=meta.get("prompt_tokens"),
        completion_tokens=meta.get("completion_tokens"),
        cached_tokens=int(meta.get("cached_tokens") or 0),
        latency_s=float(latency) if isinstance(latency, (int, float)) else math.nan,
        weight_version=meta.get("weight_version"),
        rid=meta.get("id"),
        output_logprobs=meta.get("output_token_logprobs"),
        output_top_logprobs=meta.get("output_top_logprobs"),
        input_logprobs=meta.get("input_token_logprobs"),
        meta=meta,
    )


def finish_kind(entry: Mapping[str, Any]) -> str:
    """`read_answer(entry).finish` of a decoded entry (a dict), without building an `Answer`: what
    an episode's turn must know before its next request (the rest is read after it is sent)."""
    meta = entry.get("meta_info") or {}
    finish = meta.get("finish_reason")
    if isinstance(finish, dict):
        return str(finish.get("type") or "unknown")
    if isinstance(finish, str):
        return finish or "unknown"
    return "error" if "meta_info" not in entry and "error" in entry else "unknown"


def sampled_ids(entry: Mapping[str, Any]) -> list[int]:
    """`read_answer(entry).ids()` of a decoded entry (a dict), without building an `Answer`."""
    ids = entry.get("output_ids")
    if ids is not None:
        return ids  # type: ignore[no-any-return]
    entries = (entry.get("meta_info") or {}).get("output_token_logprobs")
    return [t[1] for t in entries] if entries else []


def completion_tokens(entry: Any) -> int:
    """How many tokens a sample generated, 0 when the entry does not say: the one field a progress
    line reads from every answer, without building an `Answer`."""
    meta = entry.get("meta_info") if isinstance(entry, dict) else None
    value = meta.get("completion_tokens") if isinstance(meta, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def failed_entry(message: str, *, reason: str = "error", rid: str | None = None) -> dict[str, Any]:
    """An entry that stands in for a failed or aborted sample: empty output, `reason`, `message`."""
    if reason not in ("error", "abort"):
        raise ValueError(f"reason must be 'error' or 'abort', got {reason!r}")
    finish = {"type": reason, "message": str(message)}
    return {"text": "", "output_ids": [], "meta_info": {"id": rid, "finish_reason": finish, "completion_tokens": 0}}


def seeded_sampling(sampling: Mapping[str, Any], sample_index: int) -> dict[str, Any]:
    """The sampling parameters of sample `sample_index` of a prompt: a seeded call's sample j draws
    with seed + j, so that n samples (or n episodes) of one prompt are not n identical draws.
    Unseeded parameters come back as a copy, unchanged."""
    seed = sampling.get("sampling_seed")
    if seed is None:
        return dict(sampling)
    return {**sampling, "sampling_seed": int(seed) + sample_index}
