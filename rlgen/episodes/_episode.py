"""One multi-turn episode, turn by turn, token in and token out, and what the episodes of a call share.

Owns: `Episode`, one episode's named state and its steps:

- `start`: the environment made and reset (contained, `_env`), the first request's ids from the
  prompt's chat (`first_prompt_ids`);
- `sample`: one `/generate` request for an assistant turn, sent as `input_ids` (the previous ids,
  so history is never re-tokenized and the server's prefix cache serves it); the sampled ids
  appended as sampled (loss mask 1, the server's logprobs), then a closing EOS (mask 0) after a
  turn that did not end with one;
- `step`: the environment asked, and its messages' template delta appended (mask 0) when the next
  request, with it, fits the model's context (when it does not, the episode ends "context_limit"
  and keeps only what was sent: the reply stays in the turns frame, not in the ids or messages);
- `settle`: the rest of a turn's reading (its ids' labels and logprobs, its `Turn`s written to the
  record), done once the next request has been sent, while the server works on it;
- `close`: the environment's close, once the episode has ended (not after a cancellation);
- `finish`: the last turn settled (on every way out, Ctrl-C included).

The stops: "done", "max_turns", "context_limit", the environment's failure statuses,
"template_error", "request_error". Each assistant `Turn` records `latency_s` (its request) and
`rlgen_s`, the runner's own time for it (the synchronous work outside the server and the
environment: the request's ids (the first prompt, or the template delta of the messages before
it), its payload, reading the answer into the record, its settling, and after the environment's
step, its bookkeeping when the episode ends there), for the overhead benchmark.

Also owns what every episode of one call shares (`EpisodeCall`: the tokenizer, the environment, the
limits, one delta renderer) and `TurnSender`: one turn's request with its own rid (tracked while in
flight, for an abort), per-episode seeding (`seeded_sampling`), the bound on requests in flight,
and batching through `_coalesce.TurnBatcher`. SGLang's answer is read through `client._answer`.

Knows nothing about launching servers, the Engine, rollouts or how results are shown: it takes a
client (`client._http.Client`: `generate(payload)`), a tokenizer with a chat template, an
`Environment` and one prompt's chat, and fills one `EpisodeRecord`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..client._answer import finish_kind, read_answer, sampled_ids, seeded_sampling
from ..client._generate import abort_quietly, new_rid
from ..client._http import Client
from ..core._errors import RequestError
from ._coalesce import TurnBatcher
from ._env import Environment, EnvReply, EpisodeEnv
from ._result import EpisodeRecord, Turn
from ._template import DeltaRenderer, RenderMemo, closing_ids, eos_id, first_prompt_ids

__all__ = ["Episode", "EpisodeCall", "Received", "SampledTurn", "TurnSender", "receive_turn", "sample_turn",
           "settle_turn", "text_ids", "turn_texts"]


class TurnSender:
    """Sends one assistant turn's request at a time (at most `max_in_flight` at once), batched with
    the turns that are ready together when `batch_turns`; `in_flight` holds the rids sent and not
    yet answered (what an abort needs). `texts(answers)` gives each answer's text (None where it
    could not: the caller decodes that one itself); a batch's are made in one call. `episodes`: how
    many episodes send through it, each calling `leave()` when it ends (so that a batch that holds
    every episode still running leaves at once); None: not known (an environment's own loop)."""

    def __init__(self, client: Client, sampling: Mapping[str, Any], *, max_in_flight: int, batch_turns: bool,
                 texts: Callable[[Sequence[dict[str, Any]]], list[str | None]], episodes: int | None = None) -> None:
        self.client = client
        self.params = dict(sampling)
        self.texts = texts
        self.limiter = asyncio.Semaphore(max_in_flight)
        self.batcher = (TurnBatcher(client, max_batch=max_in_flight, read=self._read, members=episodes)
                        if batch_turns else None)
        self.in_flight: dict[str, None] = {}
        self.given_up: list[str] = []  # rids whose waiter was cancelled (`abort_given_up`)
        # One parameters object per (budget, seed offset), shared by the requests that use it: a
        # batch of turns with the same one sends it once.
        self._sampling: dict[tuple[int, int], dict[str, Any]] = {}

    def sampling(self, budget: int, sample_index: int) -> dict[str, Any]:
        """The sampling parameters of a turn (n episodes of a seeded prompt: episode j draws with
        seed + j, as generate()'s samples do); the same object for every turn that has them."""
        key = (budget, sample_index if self.params.get("sampling_seed") is not None else 0)
        params = self._sampling.get(key)
        if params is None:
            params = self._sampling[key] = seeded_sampling({**self.params, "max_new_tokens": budget}, sample_index)
        return params

    def _read(self, answers: Sequence[dict[str, Any]]) -> list[tuple[dict[str, Any], str | None]]:
        return list(zip(answers, self.texts(answers)))

    async def generate(self, ids: list[int], budget: int, sample_index: int, *,
                       once_sent: Callable[[], None] | None = None) -> tuple[dict[str, Any], str | None, float, float]:
        """(the answer, its text or None, its latency, the runner's own seconds building the payload).
        `once_sent()` runs once a batched request has left, before its answer comes (`TurnBatcher`);
        without batching it is not called: the caller does that work itself."""
        t = time.perf_counter()
        params = self.sampling(budget, sample_index)
        own = time.perf_counter() - t
        async with self.limiter:
            t = time.perf_counter()
            rid = new_rid()
            self.in_flight[rid] = None
            t0 = time.perf_counter()
            own += t0 - t
            cancelled = False
            try:
                if self.batcher is not None:
                    answer, text = await self.batcher.generate(ids, params, rid, once_sent=once_sent)
                else:
                    answer = await self.client.generate({"input_ids": ids, "sampling_params": params,
                                                         "return_logprob": True, "rid": rid})
                    text = None
            except asyncio.CancelledError:
                cancelled = True  # still running on the server: left for the caller's abort
                self.given_up.append(rid)
                raise
            finally:
                if not cancelled:
                    self.in_flight.pop(rid, None)
            latency = time.perf_counter() - t0
        if isinstance(answer, list):
            answer = answer[0] if len(answer) == 1 else answer
        if not isinstance(answer, dict):
            raise RequestError(f"/generate answered {type(answer).__name__}, not one sample")
        return answer, text, latency, own

    async def abort_given_up(self) -> None:
        """Abort on the server the turns whose waiter was cancelled since the last call (an
        environment that owns its loop and gave one rollout up at its timeout, say): nobody will
        read their answers, and each would otherwise run to its token budget."""
        rids, self.given_up = self.given_up, []
        for rid in rids:
            self.in_flight.pop(rid, None)
        await abort_quietly(self.client, rids)

    def leave(self) -> None:
        """An episode ended: it sends no more turns."""
        if self.batcher is not None:
            self.batcher.leave()

    async def close(self) -> None:
        """Wait for the batches still being sent (after their waiters were cancelled, say)."""
        if self.batcher is not None:
            await self.batcher.close()


def text_ids(sampled: list[int], eos: int) -> list[int]:
    """The ids of a sampled turn's text: all but a final EOS (the assistant's message does not hold it)."""
    return sampled[:-1] if sampled and sampled[-1] == eos else sampled


def turn_texts(tokenizer: Any, eos: int) -> Callable[[Sequence[dict[str, Any]]], list[str | None]]:
    """What `TurnSender` decodes answers with: each answer's `output_ids` without a final EOS, as
    the assistant's message, one `batch_decode` for a batch (None for every answer of a batch the
    tokenizer refuses: each is then decoded alone, where its own error shows)."""
    def texts(answers: Sequence[dict[str, Any]]) -> list[str | None]:
        seqs = []
        for answer in answers:
            ids = answer.get("output_ids")
            if not isinstance(ids, list):
                return [None] * len(answers)
            seqs.append(text_ids(ids, eos))
        try:
            return list(tokenizer.batch_decode(seqs))
        except Exception:
            return [None] * len(answers)

    return texts


class EpisodeCall:
    """What the episodes of one call share: the tokenizer (and its EOS), the environment, the
    sender, the limits, and one delta renderer (made at the first delta: a template that refuses
    the base conversation is that episode's "template_error", as any other delta's refusal)."""

    def __init__(self, tokenizer: Any, environment: Environment, sender: TurnSender, *, max_turns: int,
                 max_new_tokens: int, context_length: int | None) -> None:
        self.tokenizer, self.environment, self.sender = tokenizer, environment, sender
        self.max_turns, self.max_new_tokens, self.context_length = max_turns, max_new_tokens, context_length
        self.eos = eos_id(tokenizer)
        self._renderer: DeltaRenderer | None = None
        self._first = RenderMemo()

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
    """One assistant turn sampled into its record (`sample_turn`): its `Turn`, the ids and logprobs
    sampled, SGLang's finish reason and rid, how many ids the request sent, and the runner's own
    seconds for it (the payload, reading the answer into the record)."""

    turn: Turn
    ids: list[int]
    logprobs: list[float]
    finish: str
    rid: str | None
    sent: int
    own_s: float


@dataclass
class Received:
    """An assistant turn's answer with its ids (and closing EOS) already in the record's `ids` and
    its text in its `messages` (`receive_turn`), before the rest of its reading (`settle_turn`):
    what the next request needs first, the rest after."""

    turn: int
    answer: dict[str, Any]
    text: str
    sampled: list[int]
    closing: list[int]
    latency: float
    sent: int
    own_s: float


async def receive_turn(call: EpisodeCall, record: EpisodeRecord, turn: int, budget: int, *,
                       once_sent: Callable[[], None] | None = None) -> Received | tuple[str, str]:
    """Assistant turn `turn` of `record`, its first half: one request through the call's sender (at
    most `budget` new tokens; `once_sent` as `TurnSender.generate`), the sampled ids appended to the
    record's ids, then a closing EOS if the turn ended without one, and the text decoded from them
    as the assistant's message. Their labels, logprobs and `Turn` are `settle_turn`'s. What ends
    the episode instead is returned as (status, error): "context_limit" (the request would not
    fit), "request_error" (refused, failed or aborted)."""
    if not call.fits(len(record.ids)):
        return "context_limit", f"turn {turn}: {call.too_long(len(record.ids))}"
    sent = len(record.ids)
    try:  # the request's own copy of the ids: whatever keeps the payload never sees the record grow
        answer, text, latency, payload_s = await call.sender.generate(list(record.ids), budget, record.sample_index,
                                                                      once_sent=once_sent)
    except RequestError as e:
        return "request_error", f"turn {turn}: {e}"
    t = time.perf_counter()
    if finish_kind(answer) == "abort":
        why = read_answer(answer).meta.get("finish_reason")
        return "request_error", f"turn {turn}: the server aborted the request: {why}"
    sampled = sampled_ids(answer)  # decoded JSON: Python ints
    if text is None:
        text = call.tokenizer.decode(text_ids(sampled, call.eos))
    closing = closing_ids(call.eos, sampled)
    record.ids.extend(sampled)
    record.ids.extend(closing)
    record.messages.append({"role": "assistant", "content": text})
    return Received(turn, answer, text, sampled, closing, latency, sent, payload_s + time.perf_counter() - t)


def settle_turn(record: EpisodeRecord, got: Received) -> SampledTurn:
    """Assistant turn `got`, its second half: the sampled ids labelled (loss mask 1, the server's
    logprobs) and the closing EOS (mask 0), its `Turn` made. Call it before anything else is
    appended to the record."""
    t = time.perf_counter()
    read = read_answer(got.answer)
    lps = read.token_logprobs()
    record.label(len(got.sampled), role="assistant", turn=got.turn, mask=1, logprobs=lps)
    record.label(len(got.closing), role="env", turn=got.turn)
    said = Turn(got.turn, "assistant", text=got.text, tokens=len(got.sampled),
                logprob_mean=sum(lps) / len(lps) if lps else None,
                finish_reason=read.finish if read.finish != "unknown" else None, cached_tokens=read.cached_tokens,
                prompt_tokens=int(read.prompt_tokens or got.sent), latency_s=got.latency, rid=read.rid,
                weight_version=read.weight_version, matched_stop=read.matched_stop)
    return SampledTurn(said, got.sampled, lps, read.finish, read.rid, got.sent,
                       got.own_s + time.perf_counter() - t)


async def sample_turn(call: EpisodeCall, record: EpisodeRecord, turn: int, budget: int) -> SampledTurn | tuple[str, str]:
    """Assistant turn `turn` of `record` whole (`receive_turn`, then `settle_turn`): its request,
    its sampled ids appended as sampled (loss mask 1, the server's logprobs), the text decoded from
    them as the assistant's message, then a closing EOS (mask 0) if the turn ended without one.
    What ends the episode instead is returned as (status, error), as `receive_turn` says. An
    environment that owns its loop (verifiers) samples through this one piece."""
    got = await receive_turn(call, record, turn, budget)
    return got if isinstance(got, tuple) else settle_turn(record, got)


@dataclass
class _Unsettled:
    """The last turn as far as the next request needed it: its answer (`Received`), then the
    environment's reply and the delta sent after it (None: not sent), and the runner's own seconds
    so far; `Episode.settle` makes the rest (labels, logprobs, the two `Turn`s)."""

    got: Received
    own: float
    reply: EnvReply | None = None
    delta: list[int] | None = None


class Episode:
    """One episode: `run()` is `start`, then `sample` and `step` per assistant turn until one of them
    ends it, then `finish`. Each step returns whether the episode goes on; one that ends it has set
    the record's status and error.

    A turn's bookkeeping that the next request does not need (its ids' labels and logprobs, its
    answer's reading, its two `Turn`s) is left `unsettled` until that request has been sent
    (`settle`, handed to the batch as `once_sent`), so that it runs while the server works, not
    between an answer and the next request; it is settled before the next turn's is, and on every
    way out."""

    def __init__(self, call: EpisodeCall, record: EpisodeRecord, prompt: Sequence[Mapping[str, Any]]) -> None:
        self.call, self.record, self.prompt = call, record, prompt
        self.session: EpisodeEnv | None = None
        self.unsettled: _Unsettled | None = None
        self.unsettled_error: Exception | None = None  # what settling raised off this episode's task
        self.own = 0.0  # the runner's own seconds towards the next request (its ids)

    async def run(self) -> None:
        try:
            if await self.start():
                for turn in range(self.call.max_turns):
                    if not await self.sample(turn) or not await self.step(turn):
                        break
            self.settle()
            await self.close()
        finally:
            self.finish()

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
        t = time.perf_counter()
        try:
            tools = made.tool_schemas if made.tool_schemas is not None else call.environment.tools
            first = call.first_ids(record.messages, tools)
        except Exception as e:  # a chat the template refuses (raise_exception, a TemplateError)
            return self.end("template_error", f"{type(e).__name__}: {e}")
        record.prompt_len = len(first)
        record.extend(first, role="prompt", turn=0)
        self.own = time.perf_counter() - t  # the ids of the first request
        return True

    async def sample(self, turn: int) -> bool:
        """Assistant turn `turn`: its request (the last turn settled once it has left), its sampled
        ids and text, a closing EOS if needed."""
        got = await receive_turn(self.call, self.record, turn, self.call.max_new_tokens,
                                 once_sent=self.settle_quietly if self.unsettled is not None else None)
        self.settle()  # the last turn, if its request's batch did not (one request per turn; a batch given up)
        if isinstance(got, tuple):
            return self.end(*got)
        self.unsettled = _Unsettled(got, self.own)
        return True

    async def step(self, turn: int) -> bool:
        """The environment's reply to assistant turn `turn`, and the next request's ids."""
        session, last = self.session, self.unsettled
        if session is None or last is None:
            raise RuntimeError("Episode.step() before start() and sample()")
        t = time.perf_counter()
        messages = [dict(m) for m in self.record.messages]
        last.own += time.perf_counter() - t
        reply = await session.step(messages)
        t = time.perf_counter()
        last.reply = reply
        going = self._take(turn, reply, last)
        if going:
            self.own = time.perf_counter() - t  # the next request's ids: the next turn's
        else:
            last.own += time.perf_counter() - t
        return going

    def _take(self, turn: int, reply: EnvReply, last: _Unsettled) -> bool:
        """The environment's reply into the record as far as the next request needs it: the end it
        says, or its delta appended (its turn is made by `settle`)."""
        call, record = self.call, self.record
        record.env_seconds += reply.seconds
        if reply.status is not None:
            return self.fail(reply)
        if reply.done or turn == call.max_turns - 1:
            return self.end("done" if reply.done else "max_turns")
        try:
            delta = call.delta_ids(reply.messages)
        except Exception as e:  # TemplateError, or a template that refuses the messages
            return self.end("template_error", f"{type(e).__name__}: {e}")
        if not call.fits(len(record.ids) + len(delta)):  # never sent: kept in the turns frame only
            return self.end("context_limit", f"turn {turn + 1}: the environment's reply ({len(delta)} tokens) was "
                                             f"not sent: {call.too_long(len(record.ids) + len(delta))}")
        record.messages.extend(reply.messages)
        record.ids.extend(delta)
        last.delta = delta
        return True

    def settle(self) -> None:
        """The last turn's bookkeeping, if it is still to do: its ids labelled, its assistant turn
        and the environment's reply after it (if any) made into `Turn`s and written to the record's
        `turns` (as the dicts a record keeps). Raises what settling
        raised off this episode's task (`settle_quietly`), or raises now."""
        error, self.unsettled_error = self.unsettled_error, None
        if error is not None:
            raise error
        last, self.unsettled = self.unsettled, None
        if last is None:
            return
        t = time.perf_counter()
        got = settle_turn(self.record, last.got)
        turns = [got.turn]
        reply = last.reply
        if reply is not None:
            said = Turn(got.turn.turn, "env", text="\n".join(m["content"] for m in reply.messages) or None,
                        tool_calls=reply.tool_calls, tool_calls_failed=reply.tool_calls_failed,
                        latency_s=reply.seconds, status=reply.status, done=reply.done, calls=reply.calls,
                        roles=[m.get("role") for m in reply.messages], reward=reply.reward, info=reply.info)
            if last.delta is not None:
                self.record.label(len(last.delta), role="env", turn=got.turn.turn)
                said.tokens = len(last.delta)
            turns.append(said)
        got.turn.rlgen_s = last.own + got.own_s + time.perf_counter() - t
        self.record.turns.extend(turn.as_dict() for turn in turns)

    def settle_quietly(self) -> None:
        """`settle`, keeping what it raises for the next `settle` (run from the batch that sent this
        episode's next request, or on a way out that must not raise)."""
        try:
            self.settle()
        except Exception as e:
            self.unsettled_error = e

    async def close(self) -> None:
        """The environment's close, once the episode has ended: a failure there is the episode's
        status only when it had ended well (a first failure is the one to read)."""
        if self.session is None:
            return
        reply = await self.session.close()
        self.record.env_seconds += reply.seconds
        if reply.status is not None and self.record.status in ("done", "max_turns", "context_limit"):
            self.fail(reply)

    def finish(self) -> None:
        """The last turn into the record (each turn's dicts are written as it is settled)."""
        self.settle_quietly()
