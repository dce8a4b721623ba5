"""One sample continued across requests: what a background job keeps of it, and its next request.

Owns: `Continued`, one sample as the segments it took (a segment is one `/generate` request; a
weight update under pause 'abort' ends every running request, and the sample goes on in a new
one): its prompt, every token sampled so far with its logprob entries and the version index that
sampled it, each segment's request id, version, and what its keys/values came from; `StopRules`,
the sampling parameters that decide when a sample is finished; the next request of an unfinished
sample (`Continued.next_request`: token ids, never text, with `max_new_tokens` and
`min_new_tokens` reduced by what was sampled); the finish of an answered segment
(`Continued.close`, through `settle`): SGLang reports `abort` before length and stop checks, so an
aborted segment that reached the budget is finished `length`, one whose last token is an EOS or
stop token is finished `stop`, and a stop string that straddles two segments (SGLang matches stop
strings against a request's own output only) is found here, on the tokens on both sides; the
version labels of a segment's tokens (`segment_versions`, the exact rule in its docstring); and
the sample as one SGLang `/generate` entry (`Continued.entry`), which the result builder reads like
any other answer.

Knows nothing about HTTP, the engine, pauses or weight updates: it is handed answers (read by
`client._answer`), version indices and a `decode(ids, skip_special_tokens)` function.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core._columns import KV_STALENESS
from ._answer import Answer

__all__ = ["Boundary", "Continued", "Segment", "StopRules", "eos_token_ids", "kv_staleness", "segment_versions",
           "settle", "straddling_stop"]

Decode = Callable[[list[int], bool], str]

# A sample whose requests keep being aborted before they sample anything (another client aborting
# everything, a server that refuses it as an abort) ends as an error after this many in a row,
# rather than being sent again forever.
MAX_EMPTY_ABORTS = 16


@dataclass(frozen=True)
class StopRules:
    """What ends a sample: the sampling parameters that say it, and the model's EOS ids."""

    max_new_tokens: int
    min_new_tokens: int = 0
    eos_ids: frozenset[int] = frozenset()
    stop_token_ids: frozenset[int] = frozenset()
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    no_stop_trim: bool = False
    skip_special_tokens: bool = True
    context_length: int | None = None

    @classmethod
    def of(cls, sampling: Mapping[str, Any], *, eos_ids: Iterable[int] = (), context_length: int | None = None
           ) -> StopRules:
        """The rules of SGLang `sampling_params` (as rlgen sends them: `core._options.to_sglang`)."""
        stop = sampling.get("stop") or ()
        return cls(max_new_tokens=int(sampling.get("max_new_tokens", 128)),
                   min_new_tokens=int(sampling.get("min_new_tokens") or 0), eos_ids=frozenset(eos_ids),
                   stop_token_ids=frozenset(sampling.get("stop_token_ids") or ()),
                   stop=(stop,) if isinstance(stop, str) else tuple(stop),
                   ignore_eos=bool(sampling.get("ignore_eos", False)),
                   no_stop_trim=bool(sampling.get("no_stop_trim", False)),
                   skip_special_tokens=bool(sampling.get("skip_special_tokens", True)), context_length=context_length)

    def stops_on(self, token: int) -> bool:
        """Whether a sampled `token` ends the sample (SGLang: stop token ids and EOS ids, unless ignore_eos)."""
        return not self.ignore_eos and (token in self.stop_token_ids or token in self.eos_ids)


@dataclass(frozen=True)
class Boundary:
    """A weight update a segment was in flight across: `received` of its tokens had reached the
    client when the update was done (and `/continue_generation` not yet sent), `version` is the
    index the update made, `mode` the pause it was made under ("unsent": the request had not left
    the client yet, so no token of it saw the old weights or their KV)."""

    received: int
    version: int
    mode: str


@dataclass
class Segment:
    """One request of a sample: its tokens are `ids[start:stop]` of the sample once answered."""

    rid: str
    start: int
    sent_version: int                # the engine's version index when it was sent
    kv: str = "fresh"                # "old_prefix" when the prefix cache held old-weight prefixes then
    boundaries: list[Boundary] = field(default_factory=list)
    stop: int | None = None          # None while it is in flight
    weight_version: str | None = None  # what the server's answer named
    retractions: int = 0


def segment_versions(count: int, sent: int, boundaries: Sequence[Boundary], answered: int | None) -> list[int]:
    """The version index of each of a segment's `count` tokens.

    The rule: token j (0-based within the segment) gets the version of the last boundary whose
    `received` is at most j, else `sent` (the version when the request was sent); then no label is
    newer than `answered` (the version the server's answer named, None when it named none it
    knows), since an answer is built after its last token.

    Why it holds: a token that reached the client before `/continue_generation` was sent was
    sampled before the pause, by the old weights, so a token labelled old is exact. Under pause
    'abort' a segment runs under one version (the pause ends it before the update), and its
    answer's version caps its labels, so every label is exact. Under 'in_place' / 'retract' a
    request runs across the update: `received` counts the tokens streamed by then, a lower bound
    on those sampled before the pause (tokens held back by `stream_interval`, in transit, or in
    SGLang's overlap scheduler's pending step are labelled new).
    """
    labels = [sent] * count
    for b in boundaries:
        for j in range(max(0, b.received), count):
            labels[j] = b.version
    if answered is not None and answered >= sent:
        labels = [min(v, answered) for v in labels]
    return labels


def kv_staleness(kinds: Iterable[str]) -> str:
    """The worst of several `kv_staleness` values (`core._columns.KV_STALENESS`, best first)."""
    return max(kinds, key=KV_STALENESS.index, default=KV_STALENESS[0])


def straddling_stop(ids: Sequence[int], start: int, stops: Sequence[str], decode: Decode
                    ) -> tuple[int, str] | None:
    """A stop string that begins before position `start` (a segment boundary) and ends after it:
    (the number of tokens up to the one that completes it, the string), else None.

    SGLang matches stop strings against a request's own output, so a match that begins in an
    earlier segment's tokens (the new request's prompt) is not seen there. A match must end
    within `longest` tokens after the boundary (a token is at least one character; 4 spare)."""
    if start <= 0 or not stops or start >= len(ids):
        return None
    longest = max(len(s) for s in stops) + 4
    lo = max(0, start - longest)
    head = len(decode(list(ids[lo:start]), False).rstrip("\ufffd"))
    for t in range(start, min(len(ids), start + longest)):
        text = decode(list(ids[lo:t + 1]), False)
        for stop in stops:
            pos = text.find(stop)
            if pos != -1 and pos < head < pos + len(stop):
                return t + 1, stop
    return None


def settle(seq: Continued, answer: Answer, decode: Decode) -> dict[str, Any] | None:
    """The sample's finish reason (SGLang's dict) after its last segment was answered, or None when
    it goes on in another request. May shorten `seq` (a stop string across a boundary)."""
    rules, seg = seq.rules, seq.segments[-1]
    cut = straddling_stop(seq.ids, seg.start, rules.stop, decode) if len(seq.segments) > 1 else None
    if cut is not None:
        seq.truncate(cut[0])
        return {"type": "stop", "matched": cut[1]}
    kind = answer.finish
    if kind == "stop":
        return dict(answer.meta.get("finish_reason") or {"type": "stop"})
    if kind == "length":
        return {"type": "length", "length": rules.max_new_tokens}
    if kind != "abort":
        return {"type": "error", "message": answer.message or f"the server answered finish_reason {kind!r}"}
    if seq.ids and len(seq.ids) >= rules.max_new_tokens:
        return {"type": "length", "length": rules.max_new_tokens}
    if seq.ids and seg.stop != seg.start and rules.stops_on(seq.ids[-1]) and len(seq.ids) >= rules.min_new_tokens:
        return {"type": "stop", "matched": seq.ids[-1]}
    if rules.context_length is not None and len(seq.prompt_ids) + len(seq.ids) >= rules.context_length:
        return {"type": "length", "length": len(seq.ids)}
    status = (answer.meta.get("finish_reason") or {}).get("status_code") if isinstance(
        answer.meta.get("finish_reason"), dict) else None
    if status is not None and seg.stop == seg.start:  # the server refused it (a limit, a bad input)
        return {"type": "error", "message": answer.message or f"aborted with status {status}"}
    if seq.empty_aborts >= MAX_EMPTY_ABORTS:
        return {"type": "error", "message": f"aborted {seq.empty_aborts} times in a row before sampling a token"}
    return None


@dataclass
class Continued:
    """One sample, continued across requests until it finishes (see the module docstring).

    `sampling` is its first request's `sampling_params` (its seed included); `extra` further body
    fields (its `lora_path`). `logprobs`/`top_logprobs` hold SGLang's per-token entries, one per
    id (`[None, id, None]` for a token whose segment returned none), or None when not asked for."""

    prompt_ids: list[int]
    sampling: dict[str, Any]
    rules: StopRules
    extra: dict[str, Any] = field(default_factory=dict)
    logprobs_wanted: bool = True
    top_wanted: bool = False
    ids: list[int] = field(default_factory=list)
    logprobs: list[Any] = field(default_factory=list)
    top_logprobs: list[Any] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    finish: dict[str, Any] | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    cached_tokens: int = 0
    dropped: int = 0                 # tokens sampled past a stop string across a boundary, dropped
    empty_aborts: int = 0            # aborted segments in a row that sampled nothing
    started: float | None = None     # time.perf_counter() at its first request
    ended: float | None = None

    @property
    def done(self) -> bool:
        return self.finish is not None

    @property
    def in_flight(self) -> Segment | None:
        """Its segment in flight (sent, not answered), else None."""
        return self.segments[-1] if self.segments and self.segments[-1].stop is None else None

    def next_request(self) -> tuple[list[int], dict[str, Any]]:
        """The next request's `input_ids` (the prompt, then every token sampled so far) and
        `sampling_params` (the budget and `min_new_tokens` less what was sampled)."""
        if not self.ids:
            return list(self.prompt_ids), self.sampling
        sampling = dict(self.sampling)
        sampling["max_new_tokens"] = self.rules.max_new_tokens - len(self.ids)
        if self.rules.min_new_tokens:
            sampling["min_new_tokens"] = max(0, self.rules.min_new_tokens - len(self.ids))
        return [*self.prompt_ids, *self.ids], sampling

    def open(self, rid: str, version: int, *, kv: str = "fresh") -> Segment:
        """A request of it was sent as `rid` at version index `version`."""
        if self.in_flight is not None:
            raise RuntimeError(f"segment {self.in_flight.rid} is still in flight")
        if self.started is None:
            self.started = time.perf_counter()
        segment = Segment(rid=rid, start=len(self.ids), sent_version=version, kv=kv)
        self.segments.append(segment)
        return segment

    def drop_open(self) -> None:
        """Its request in flight came back without tokens to keep (HTTP 499 during a pause, a
        failed stream): forgotten, so that the next request starts where it did."""
        if self.in_flight is not None:
            self.segments.pop()

    def close(self, answer: Answer, *, answered_version: int | None, decode: Decode) -> None:
        """Its request in flight was answered: the tokens kept (labelled `segment_versions`), and
        the sample finished (`settle`) or left to go on."""
        seg = self.in_flight
        if seg is None:
            raise RuntimeError("no segment in flight to close")
        ids = answer.ids()
        labels = segment_versions(len(ids), seg.sent_version, seg.boundaries, answered_version)
        self.ids.extend(ids)
        self.versions.extend(labels)
        if self.logprobs_wanted:
            self.logprobs.extend(_entries(answer.output_logprobs, ids))
        if self.top_wanted:
            got = answer.output_top_logprobs
            self.top_logprobs.extend(got if got is not None and len(got) == len(ids) else [None] * len(ids))
        seg.stop, seg.weight_version = len(self.ids), answer.weight_version
        seg.retractions = int(answer.meta.get("num_retractions") or 0)
        self.texts.append(answer.text)
        self.cached_tokens += answer.cached_tokens
        self.meta = {k: v for k, v in answer.meta.items() if not k.startswith(("output_", "input_"))}
        self.empty_aborts = self.empty_aborts + 1 if answer.finish == "abort" and not ids else 0
        self.finish = settle(self, answer, decode)
        if self.finish is not None:
            self.ended = time.perf_counter()

    def end(self, finish: dict[str, Any]) -> None:
        """Finish it now as it is (an error, or a cancelled job's sample: `{"type": "abort"}`)."""
        self.drop_open()
        self.finish = finish
        self.ended = time.perf_counter()

    def truncate(self, count: int) -> None:
        """Keep its first `count` tokens (a stop string completed there)."""
        self.dropped += len(self.ids) - count
        del self.ids[count:], self.versions[count:]
        if self.logprobs_wanted:
            del self.logprobs[count:]
        if self.top_wanted:
            del self.top_logprobs[count:]
        for seg in self.segments:
            seg.start, seg.stop = min(seg.start, count), None if seg.stop is None else min(seg.stop, count)

    def kv(self) -> str:
        """What its tokens attended to (`core._columns.KV_STALENESS`), over its segments."""
        kinds = []
        for seg in self.segments:
            kinds.append(seg.kv)
            labels = self.versions[seg.start:seg.stop if seg.stop is not None else len(self.ids)]
            for b in seg.boundaries:
                if any(v >= b.version for v in labels[b.received:]):
                    kinds.append("old_kv" if b.mode == "in_place" else "old_prefix" if b.mode == "retract" else "fresh")
        return kv_staleness(kinds)

    def text(self, decode: Decode) -> str:
        """Its completion text: the server's for a sample of one request; else its tokens decoded
        as SGLang's detokenizer would (a matched stop token left out, cut at a matched stop string)."""
        if len(self.texts) == 1 and not self.dropped and len(self.segments) == 1:
            return self.texts[0]
        matched = (self.finish or {}).get("matched")
        trim = not self.rules.no_stop_trim and matched is not None
        ids = self.ids[:-1] if trim and isinstance(matched, int) and self.ids else self.ids
        text = decode(list(ids), self.rules.skip_special_tokens)
        if trim and isinstance(matched, str):
            cut = text.find(matched)
            text = text[:cut] if cut != -1 else text
        return text

    def entry(self, decode: Decode) -> dict[str, Any]:
        """The sample as one SGLang `/generate` entry: every token, the final finish reason, and
        `segments` in `meta_info` (each request's rid, token span, version, weight version, KV)."""
        meta = dict(self.meta)
        latency = (self.ended or time.perf_counter()) - self.started if self.started is not None else math.nan
        meta.update({
            "id": self.segments[0].rid if self.segments else None,
            "finish_reason": self.finish or {"type": "abort", "message": "not finished"},
            "prompt_tokens": len(self.prompt_ids), "completion_tokens": len(self.ids),
            "cached_tokens": self.cached_tokens, "e2e_latency": latency,
            "num_retractions": sum(s.retractions for s in self.segments),
            "segments": [{"rid": s.rid, "start": s.start, "stop": s.stop, "version": s.sent_version,
                          "weight_version": s.weight_version, "kv": s.kv} for s in self.segments],
        })
        if self.segments and self.segments[-1].weight_version is not None:
            meta["weight_version"] = self.segments[-1].weight_version
        if self.dropped:
            meta["dropped_after_stop"] = self.dropped
        if self.logprobs_wanted:
            meta["output_token_logprobs"] = list(self.logprobs)
        if self.top_wanted:
            meta["output_top_logprobs"] = list(self.top_logprobs)
        return {"text": self.text(decode), "output_ids": list(self.ids), "meta_info": meta}


def _entries(got: list[Any] | None, ids: Sequence[int]) -> list[Any]:
    """A segment's logprob entries, one per id (`[None, id, None]` where the server sent none)."""
    if got is not None and len(got) == len(ids):
        return got
    return [[None, t, None] for t in ids]


def eos_token_ids(tokenizer: Any, model_path: str | None = None) -> list[int]:
    """The model's EOS ids as SGLang reads them: the model config's, the generation config's (read
    from the checkout when it is on this machine) and the tokenizer's."""
    found: list[int] = []
    sources: list[Any] = []
    for name in ("config.json", "generation_config.json"):
        path = Path(model_path or "") / name
        if model_path and path.is_file():
            try:
                sources.append(json.loads(path.read_text()).get("eos_token_id"))
            except (OSError, ValueError, AttributeError):
                pass
    sources.append(getattr(tokenizer, "eos_token_id", None))
    for source in sources:
        for token in source if isinstance(source, (list, tuple)) else [source]:
            if isinstance(token, int) and not isinstance(token, bool) and token not in found:
                found.append(token)
    return found
