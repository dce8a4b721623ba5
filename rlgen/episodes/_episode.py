"""One multi-turn episode, turn by turn, token in and token out, and what the episodes of a call share.

Owns: `Episode`, one episode read as the loop it is. `start` makes and resets the environment
(contained, `_env`) and takes the first request's ids from the prompt's chat (`first_prompt_ids`);
then, per assistant turn, in this order and nowhere else:

1. `sample_turn`: send the turn's request (`input_ids`: the ids so far, so history is never
   re-tokenized and the server's prefix cache serves it) and take its answer; write the assistant
   turn: its sampled ids (loss mask 1, the server's logprobs, the version index that sampled
   each: `EpisodeCall.version_of` its answer's `weight_version`, or a continued sample's per-token
   labels), a closing EOS (mask 0, version -1) after a turn
   that did not end with one, its text as the assistant's message, its `Turn`;
2. `step`: run the environment's step on the messages, and write its reply: its messages' template
   delta appended (mask 0) when the next request, with it, fits the model's context (when it does
   not, the episode ends "context_limit" and keeps only what was sent: the reply stays in the
   turns frame, not in the ids or messages), and its `Turn`.

Every id is labelled as it is appended (`EpisodeRecord.extend`), so a record's per-token lists are
as long as its ids whenever another task can see it. `close` runs the environment's close once the
episode has ended (not after a cancellation).

The stops: "done", "max_turns", "context_limit", the environment's failure statuses,
"template_error", "request_error". Timing is not threaded through the steps: a benchmark passes a
`Tracer`, called at each step's edges.

A turn of a call given `TurnPauses` (a background call of the Engine's, which weight updates pause)
is one `client._continuation.Continued` sample: its requests wait at the pause gate, and a request
a pause's abort ended (finish "abort", or turned away: HTTP 499) goes on as the same sequence, the
turn's tokens so far sent back as ids with the rest of its budget (`_continued_answer`), so the
turn is never cut short nor a token of it sampled twice; its answer is the continued sample's entry,
and its tokens' versions are the sample's labels (each segment's, `client._continuation.segment_versions`).

Also owns what every episode of one call shares (`EpisodeCall`: the tokenizer, the environment, the
sender, the limits, one delta renderer, the sampling parameters of each turn). Requests go through
the one client-side sender (`client._sender.Sender`: rids, batching, aborts); SGLang's answer is
read through `client._answer`.

Knows nothing about launching servers, the Engine, rollouts or how results are shown: it takes a
sender, a tokenizer with a chat template, an `Environment` and one prompt's chat, and fills one
`EpisodeRecord`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..client._answer import read_answer, seeded_sampling
from ..client._continuation import Continued, StopRules
from ..client._sender import Sender, new_rid
from ..core._errors import RequestError
from ._env import Environment, EnvReply, EpisodeEnv
from ._result import EpisodeRecord, Turn
from ._template import DeltaRenderer, RenderMemo, closing_ids, eos_id, first_prompt_ids

__all__ = ["Episode", "EpisodeCall", "Kept", "SampledTurn", "Tracer", "TurnPauses", "sample_turn", "text_ids"]

# Called, when a benchmark gives one, with an event, the episode's record and the turn:
# "request" (the turn's request is about to be sent), "answer" (its answer was taken), "env" (the
# environment's step is about to run), "reply" (it returned).
Tracer = Callable[[str, EpisodeRecord, int], None]


class TurnPauses(Protocol):
    """The pauses a background call's turns live with (the Engine's, seen from here): the gate a
    request waits at, the pause epoch, the served version index, and what a failed request is."""

    eos_ids: Sequence[int]

    @property
    def epoch(self) -> int:
        """Pauses made so far."""

    @property
    def version(self) -> int:
        """The served weights' version index now."""

    async def ready(self) -> None:
        """Return once a request may be sent (no pause in force)."""

    async def resend(self, error: RequestError, epoch: int) -> bool:
        """Whether a request sent at pause epoch `epoch` that failed with `error` was turned away by
        a pause and goes again (after a short wait): else the failure is the turn's."""


def text_ids(sampled: list[int], eos: int) -> list[int]:
    """The ids of a sampled turn's text: all but a final EOS (the assistant's message does not hold it)."""
    return sampled[:-1] if sampled and sampled[-1] == eos else sampled


class EpisodeCall:
    """What the episodes of one call share: the tokenizer (and its EOS), the environment, the
    sender, the limits, the sampling parameters (`sampling`), one delta renderer (made at the first
    delta: a template that refuses the base conversation is that episode's "template_error", as any
    other delta's refusal), the tracer, if any, and `version_of`: the version index an answer's
    `weight_version` names (the Engine's; None: not known, -1), for the turns of a call without
    `pauses` (a continued turn's tokens carry their sample's own labels)."""

    def __init__(self, tokenizer: Any, environment: Environment, sender: Sender, *, max_turns: int,
                 max_new_tokens: int, context_length: int | None, sampling: Mapping[str, Any] | None = None,
                 tracer: Tracer | None = None, pauses: TurnPauses | None = None,
                 version_of: Callable[[Any], int] | None = None) -> None:
        self.tokenizer, self.environment, self.sender = tokenizer, environment, sender
        self.pauses = pauses  # a background call's: its turns wait out pauses and go on across them
        self.version_of = version_of
        self.max_turns, self.max_new_tokens, self.context_length = max_turns, max_new_tokens, context_length
        self.params, self.tracer = dict(sampling or {}), tracer
        self.eos = eos_id(tokenizer)
        self._renderer: DeltaRenderer | None = None
        self._first = RenderMemo()
        # One parameters object per (budget, seed offset), shared by the requests that use it: a
        # batch of turns with the same one sends it once.
        self._sampling: dict[tuple[int, int], dict[str, Any]] = {}

    def sampling(self, budget: int, sample_index: int) -> dict[str, Any]:
        """The sampling parameters of a turn of at most `budget` new tokens (n episodes of a seeded
        prompt: episode j draws with seed + j, as generate()'s samples do); the same object for
        every turn that has them."""
        key = (budget, sample_index if self.params.get("sampling_seed") is not None else 0)
        params = self._sampling.get(key)
        if params is None:
            seeded = seeded_sampling({**self.params, "max_new_tokens": budget}, sample_index)
            params = self._sampling[key] = self.sender.stream_params(seeded)
        return params

    def trace(self, event: str, record: EpisodeRecord, turn: int) -> None:
        if self.tracer is not None:
            self.tracer(event, record, turn)

    def fits(self, n_ids: int) -> bool:
        """Whether a request of `n_ids` ids, plus `max_new_tokens`, fits the model's context."""
        return self.context_length is None or n_ids + self.max_new_tokens <= self.context_length

    def too_long(self, n_ids: int) -> str:
        return (f"{n_ids} ids + max_new_tokens {self.max_new_tokens} would not fit the model's context of "
                f"{self.context_length} tokens")

    def first_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        """The first request's ids of a chat; rendered once per distinct chat of plain values with
        the call's tools (the n episodes of a prompt share one render), a fresh list each time."""
        def render() -> list[int]:
            return first_prompt_ids(self.tokenizer, messages, tools=tools)

        return self._first(messages, render) if tools is self.environment.tools else render()

    def delta_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        if self._renderer is None:
            self._renderer = DeltaRenderer(self.tokenizer, tools=self.environment.tools)
        return self._renderer(messages)


@dataclass
class SampledTurn:
    """One assistant turn written into its record (`sample_turn`): its `Turn`, the ids and
    logprobs sampled, SGLang's finish reason and rid, and how many ids the request sent."""

    turn: Turn
    ids: list[int]
    logprobs: list[float]
    finish: str
    rid: str | None
    sent: int


async def sample_turn(call: EpisodeCall, record: EpisodeRecord, turn: int, budget: int) -> SampledTurn | tuple[str, str]:
    """Assistant turn `turn` of `record`: its request (at most `budget` new tokens) through the
    call's sender, its answer written into the record: the sampled ids (loss mask 1, the server's
    logprobs, the version index that sampled each), a closing EOS (mask 0) if the turn ended without one, the text decoded from them as
    the assistant's message. What ends the episode instead is returned as (status, error):
    "context_limit" (the request would not fit), "request_error" (refused, failed or aborted).
    The `Turn` is returned, not written to `record.turns` (the caller orders the turns)."""
    if not call.fits(len(record.ids)):
        return "context_limit", f"turn {turn}: {call.too_long(len(record.ids))}"
    sent = len(record.ids)
    call.trace("request", record, turn)
    try:  # the request's own copy of the ids: whatever keeps the payload never sees the record grow
        params = call.sampling(budget, record.sample_index)
        labels: list[int] | None = None  # a continued sample's, one per token
        kept = Kept()
        if call.pauses is None:
            answer, latency = await call.sender.sample(list(record.ids), params)
        else:
            answer, latency, kept = await _continued_answer(call, call.pauses, list(record.ids), params)
            labels = kept.versions
    except RequestError as e:
        return "request_error", f"turn {turn}: {e}"
    call.trace("answer", record, turn)
    read = read_answer(answer)
    if read.finish == "abort":
        return "request_error", f"turn {turn}: the server aborted the request: {read.message or read.meta.get('finish_reason')}"
    sampled = read.ids()  # decoded JSON: Python ints
    lps = read.token_logprobs()
    closing = closing_ids(call.eos, sampled)
    text = call.tokenizer.decode(text_ids(sampled, call.eos))
    if labels is None or len(labels) != len(sampled):
        labels = [-1 if call.version_of is None else call.version_of(read.weight_version)] * len(sampled)
    record.extend(sampled, role="assistant", turn=turn, mask=1, logprobs=lps, versions=labels)
    record.extend(closing, role="env", turn=turn)
    record.messages.append({"role": "assistant", "content": text})
    said = Turn(turn, "assistant", text=text, tokens=len(sampled), logprob_mean=sum(lps) / len(lps) if lps else None,
                finish_reason=read.finish if read.finish != "unknown" else None, cached_tokens=read.cached_tokens,
                prompt_tokens=int(read.prompt_tokens or sent), latency_s=latency, rid=read.rid,
                weight_version=read.weight_version, matched_stop=read.matched_stop, n_segments=kept.segments,
                kv_staleness=kept.kv, num_retractions=kept.retractions)
    return SampledTurn(said, sampled, lps, read.finish, read.rid, sent)


@dataclass(frozen=True)
class Kept:
    """How a turn's tokens were sampled across pauses: the version index of each (None: one request
    and its answer's `weight_version`), its requests, `client._continuation.Continued.kv` and the
    server's retractions summed over its requests."""

    versions: list[int] | None = None
    segments: int = 1
    kv: str = "fresh"
    retractions: int = 0


async def _continued_answer(call: EpisodeCall, pauses: TurnPauses, ids: list[int], params: dict[str, Any]
                            ) -> tuple[dict[str, Any], float, Kept]:
    """A turn's answer across pauses: the turn as one `Continued` sample, its requests sent through
    the call's sender once the pause gate is open, each answer kept (an abort: the tokens so far,
    and the rest sent as the same sequence), a request a pause turned away sent again; the sample
    as one SGLang entry (the finish normalised: an aborted segment at the budget is "length", one
    ending on an EOS / stop token "stop"), the seconds it took, and how its tokens were sampled
    (`Kept`: each one's version index, `Continued.versions`; its requests; what they attended to).

    Raises:
        RequestError: a request failed other than by a pause."""
    import time

    rules = StopRules.of(params, eos_ids=pauses.eos_ids, context_length=call.context_length)
    sample = Continued(ids, params, rules)
    started = time.perf_counter()

    def decode(tokens: list[int], skip_special_tokens: bool) -> str:
        return str(call.tokenizer.decode(tokens, skip_special_tokens=skip_special_tokens))

    while not sample.done:
        request, sampling = sample.next_request()
        rid, epoch = new_rid(), pauses.epoch
        segment = sample.open(rid, pauses.version)

        async def ready(segment: Any = segment) -> None:
            # As a job's (`engine._job_run`): the version is the one in force when the request
            # leaves, after any pause it waited out at the gate (whose update then sampled none of it).
            await pauses.ready()
            segment.sent_version = pauses.version

        try:
            entry, _ = await call.sender.sample(request, sampling, rid=rid, ready=ready)
        except RequestError as err:
            sample.drop_open()
            if await pauses.resend(err, epoch):
                continue
            raise
        answer = read_answer(entry)
        if answer.finish == "error" and not answer.ids() and pauses.epoch != epoch:
            sample.drop_open()  # a pause turned it away inside a batch that went on
            continue
        named = None if call.version_of is None else call.version_of(answer.weight_version)
        sample.close(answer, answered_version=named, decode=decode)
    kept = Kept(list(sample.versions), len(sample.segments), sample.kv(), sum(s.retractions for s in sample.segments))
    return sample.entry(decode), time.perf_counter() - started, kept


def env_turn(turn: int, reply: EnvReply, tokens: int = 0) -> Turn:
    """The environment's reply after assistant turn `turn` as a `Turn` (`tokens`: its delta's, when sent)."""
    return Turn(turn, "env", text="\n".join(m["content"] for m in reply.messages) or None, tokens=tokens,
                tool_calls=reply.tool_calls, tool_calls_failed=reply.tool_calls_failed, latency_s=reply.seconds,
                status=reply.status, done=reply.done, calls=reply.calls,
                roles=[m.get("role") for m in reply.messages], reward=reply.reward, info=reply.info)


class Episode:
    """One episode: `run()` is `start`, then `sample` and `step` per assistant turn until one of them
    ends it, then `close`. Each step returns whether the episode goes on; one that ends it has set
    the record's status and error."""

    def __init__(self, call: EpisodeCall, record: EpisodeRecord, prompt: Sequence[Mapping[str, Any]]) -> None:
        self.call, self.record, self.prompt = call, record, prompt
        self.session: EpisodeEnv | None = None

    async def run(self) -> None:
        if await self.start():
            for turn in range(self.call.max_turns):
                if not await self.sample(turn) or not await self.step(turn):
                    break
        await self.close()

    def end(self, status: str, error: str | None = None, traceback: str | None = None) -> bool:
        self.record.status, self.record.error, self.record.traceback = status, error, traceback
        return False

    def fail(self, reply: EnvReply) -> bool:
        return self.end(reply.status or "env_error", reply.error, reply.traceback)

    async def start(self) -> bool:
        """The episode's environment made and reset, the prompt's messages (with what the reset
        added) and the first request's ids."""
        call, record = self.call, self.record
        made = await call.environment.new()
        if isinstance(made, EnvReply):
            return self.fail(made)
        self.session = made
        bind = getattr(made, "bind_client", None)
        if callable(bind):  # a tool environment that parses with the server's own parser
            bind(call.sender.client)
        reply = await made.reset(record.data, prompt=[dict(m) for m in self.prompt])
        record.env_seconds += reply.seconds
        if reply.status is not None:  # no environment started: none is kept to be scored
            return self.fail(reply)
        record.env = made.obj  # a framework's own environment, made by now (some are made at reset)
        chat = self.prompt if reply.prompt is None else reply.prompt
        record.messages = [dict(m) for m in chat] + reply.messages
        record.n_prompt_messages = len(record.messages)
        try:
            tools = made.tool_schemas if made.tool_schemas is not None else call.environment.tools
            first = call.first_ids(record.messages, tools)
        except Exception as e:  # a chat the template refuses (raise_exception, a TemplateError)
            return self.end("template_error", f"{type(e).__name__}: {e}")
        record.prompt_len = len(first)
        record.extend(first, role="prompt", turn=0)
        return True

    async def sample(self, turn: int) -> bool:
        """Assistant turn `turn`: its request, its answer written into the record."""
        got = await sample_turn(self.call, self.record, turn, self.call.max_new_tokens)
        if isinstance(got, tuple):
            return self.end(*got)
        self.record.turns.append(got.turn.as_dict())
        return True

    async def step(self, turn: int) -> bool:
        """The environment's reply to assistant turn `turn`, written into the record: the end it
        says, or its messages and their delta (the next request's ids)."""
        call, record, session = self.call, self.record, self.session
        if session is None:
            raise RuntimeError("Episode.step() before start()")
        call.trace("env", record, turn)
        reply = await session.step([dict(m) for m in record.messages])
        call.trace("reply", record, turn)
        record.env_seconds += reply.seconds
        going, delta = self._take(turn, reply)
        if delta is not None:
            record.messages.extend(reply.messages)
            record.extend(delta, role="env", turn=turn)
        record.turns.append(env_turn(turn, reply, len(delta or ())).as_dict())
        return going

    def _take(self, turn: int, reply: EnvReply) -> tuple[bool, list[int] | None]:
        """(whether the episode goes on, the reply's delta ids to append: None when none is sent)."""
        call, record = self.call, self.record
        if reply.status is not None:
            return self.fail(reply), None
        if reply.done or turn == call.max_turns - 1:
            return self.end("done" if reply.done else "max_turns"), None
        try:
            delta = call.delta_ids(reply.messages)
        except Exception as e:  # TemplateError, or a template that refuses the messages
            return self.end("template_error", f"{type(e).__name__}: {e}"), None
        if not call.fits(len(record.ids) + len(delta)):  # never sent: kept in the turns frame only
            return self.end("context_limit", f"turn {turn + 1}: the environment's reply ({len(delta)} tokens) was "
                                             f"not sent: {call.too_long(len(record.ids) + len(delta))}"), None
        return True, delta

    async def close(self) -> None:
        """The environment's close, once the episode has ended: a failure there is the episode's
        status only when it had ended well (a first failure is the one to read)."""
        if self.session is None:
            return
        reply = await self.session.close()
        self.record.env_seconds += reply.seconds
        if reply.status is not None and self.record.status in ("done", "max_turns", "context_limit"):
            self.fail(reply)
