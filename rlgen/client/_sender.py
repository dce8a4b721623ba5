"""One client-side sender: what `generate()` and the episodes both send `/generate` requests through.

Owns: the request ids (`new_rid`), the request body (`generate_body`), the rids in flight and their
abort (`Sender.in_flight`, `abort_quietly`, `gather_or_abort`), the bound on sequences in flight,
and batching of single sequences (`Sender.sample`):

- `Sender.send(payload, rids)`: one request as the caller made it (generate()'s chunks), its rids
  in flight until it is answered or fails; a cancelled request's rids stay for the caller's abort.
- `Sender.sample(ids, sampling)`: one sequence (an episode's turn). The sequences that are ready
  together leave as one batched `/generate`: when every member that can still join has joined
  (`members`: the others are waiting for their answers or have left), when nothing has joined for
  `linger_s`, after `max_wait_s`, or at `max_batch`. The batch is streamed (SGLang streams a
  batched request per item, each chunk tagged with the item's `index`), so each sequence's answer
  is handed back the moment its own last chunk arrives, not when the batch's longest sample ends:
  no sequence waits for another. `stream_params` sets `stream_interval` above the token budget, so
  an item sends two chunks (its first token and its end), not one per token.

Why batched: every request costs its HTTP round trip and the server's per-request handling, so
SGLang serves one batched request of many prompts much faster than as many single requests
(docs/benchmarks.md). Why streamed: a non-streamed batch is answered when its longest sample ends,
so a turn that ended early would wait for the longest turn of its batch (a barrier).

Behind a router (`one_prompt_per_request`), `sample` sends one request per sequence.

Knows nothing about episodes, prompts, templates or results: it posts payloads with a client and
hands back SGLang's answers (dicts), read through `client._answer`.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ..core._errors import RequestError
from ._answer import finish_kind
from ._http import Client

__all__ = ["Sender", "abort_quietly", "gather_or_abort", "generate_body", "new_rid"]

# rids are this process's random prefix and a counter: unique on a server that several processes
# (or machines) share, and cheap enough for every turn of every episode (uuid4 per rid cost more).
# The counter has a fixed width: SGLang's `/abort_request` aborts every rid that *starts with* the
# one given, so no rid may be a prefix of another ("...-1" would also abort "...-10").
_RID_PREFIX = f"rlgen-{uuid.uuid4().hex[:16]}-"
_rid_numbers = itertools.count()


def new_rid() -> str:
    """A request id for one sample: rlgen's own, so that it can abort exactly what it sent."""
    return f"{_RID_PREFIX}{next(_rid_numbers):012d}"


def generate_body(input_ids: list[int] | list[list[int]], sampling: Any, rid: str | list[str], *,
                  logprobs: bool = True, top_logprobs: int = 0,
                  per_prompt: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A `/generate` body: one prompt (`input_ids` a list of ints, one rid) or a batch (lists of
    each; `sampling` one dict for all, or one per prompt, as SGLang takes them)."""
    body: dict[str, Any] = {"input_ids": input_ids, "sampling_params": sampling, "rid": rid}
    if per_prompt:
        body.update(per_prompt)
    if logprobs or top_logprobs:
        body["return_logprob"] = True
        body["top_logprobs_num"] = top_logprobs
    return body


async def gather_or_abort(client: Client, tasks: Sequence[asyncio.Future[Any]], in_flight: Iterable[str]) -> None:
    """Wait for `tasks`; on Ctrl-C or the first failure, cancel the rest and abort on the server the
    rids still in `in_flight` (read then, so it is the live set), then re-raise."""
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await abort_quietly(client, list(in_flight))
        raise


async def abort_quietly(client: Client, rids: list[str]) -> None:
    """Abort `rids` on the server, best effort (at most 10 s; a failure is swallowed): the caller is
    already failing or giving the requests up, and a dead server must not mask the real error."""
    if not rids:
        return
    try:
        await asyncio.wait_for(client.abort(rids), timeout=10)
    except (RequestError, asyncio.TimeoutError, OSError):
        pass


def _merged(earlier: dict[str, Any] | None, chunk: dict[str, Any]) -> dict[str, Any]:
    """An item's answer so far, with `chunk`: SGLang's chunks are cumulative by default (the last
    holds every output id and logprob); with `--incremental-streaming-output` each holds only the
    new part, and is appended to what came before (told apart by `completion_tokens`)."""
    if earlier is None:
        return chunk
    meta = chunk.get("meta_info") or {}
    ids = chunk.get("output_ids")
    total = meta.get("completion_tokens")
    if not isinstance(ids, list) or not isinstance(total, int) or len(ids) >= total:
        return chunk  # cumulative (or nothing to join)
    chunk["output_ids"] = [*(earlier.get("output_ids") or []), *ids]
    lps = meta.get("output_token_logprobs")
    before = (earlier.get("meta_info") or {}).get("output_token_logprobs")
    if isinstance(lps, list) and isinstance(before, list):
        meta["output_token_logprobs"] = [*before, *lps]
    return chunk


@dataclass
class _Batch:
    """Sequences waiting to leave together: (ids, sampling, rid, future, extra body fields) each."""

    items: list[tuple[list[int], Mapping[str, Any], str, asyncio.Future[dict[str, Any]], Mapping[str, Any] | None]] = (
        field(default_factory=list))
    last_joined: float = 0.0  # the loop's time when the last sequence joined
    launched: bool = False


class Sender:
    """Sends `/generate` requests for one call and keeps their rids in flight (`in_flight`, what an
    abort needs). `sample` batches single sequences (see the module docstring); `send` sends a
    request as it is. `members`: how many requesters `sample` serves, each calling `leave()` when
    it sends no more (None: not known, so a batch lingers). `max_batch`: sequences per batch (default
    `max_in_flight`). `logprobs`, `top_logprobs`: what `sample`'s requests ask for. `on_chunk(rid,
    answer so far)`: called on the loop for every streamed chunk of a batched sequence (its tokens
    so far: a background job's count of what arrived before a weight update)."""

    def __init__(self, client: Client, *, max_in_flight: int = 64, batch: bool = True, stream: bool = True,
                 members: int | None = None, linger_s: float = 0.005, max_wait_s: float = 0.05,
                 max_batch: int | None = None, logprobs: bool = True, top_logprobs: int = 0,
                 on_chunk: Callable[[str, dict[str, Any]], object] | None = None) -> None:
        self.client = client
        self.batch = batch and not getattr(client, "one_prompt_per_request", False)
        self.stream = stream and self.batch
        self.members = members
        self.linger_s, self.max_wait_s = linger_s, max_wait_s
        self.max_batch = max_in_flight if max_batch is None else max_batch
        self.logprobs, self.top_logprobs = logprobs, top_logprobs
        self.on_chunk = on_chunk
        self.limiter = asyncio.Semaphore(max_in_flight)
        self.in_flight: dict[str, None] = {}  # rids sent and not yet answered (an ordered set)
        self.posted: set[str] = set()  # rids of `sample` whose request has left (not waiting to join a batch)
        self.given_up: list[str] = []  # rids whose waiter was cancelled (`abort_given_up`)
        self.batches: list[int] = []  # the size of each batch sent, in order
        self._waiting = 0  # sequences sent and not yet answered: their requesters cannot join
        self._open: _Batch | None = None
        self._tasks: set[asyncio.Future[None]] = set()

    def stream_params(self, sampling: Mapping[str, Any]) -> dict[str, Any]:
        """`sampling` as `sample` should get it: with a streamed batch, `stream_interval` above the
        token budget (each item then sends its first token's chunk and its last one only)."""
        params = dict(sampling)
        if self.stream:
            params["stream_interval"] = int(params.get("max_new_tokens") or 1 << 20) + 1
        return params

    @contextmanager
    def tracked(self, rids: Sequence[str]) -> Iterator[None]:
        """`rids` in flight while the block runs: dropped once it ends or fails (nothing of theirs
        is left to abort), kept when it is cancelled (still running on the server: for the
        caller's abort)."""
        self.in_flight.update(dict.fromkeys(rids))
        cancelled = False
        try:
            yield
        except asyncio.CancelledError:
            cancelled = True
            raise
        finally:
            if not cancelled:
                for rid in rids:
                    self.in_flight.pop(rid, None)

    async def send(self, payload: dict[str, Any], rids: Sequence[str], *, client: Client | None = None) -> Any:
        """POST `payload` (a body whose samples are `rids`) as it is, to `client` (default: the
        sender's), its rids `tracked`."""
        with self.tracked(rids):
            return await (client or self.client).generate(payload)

    async def sample(self, ids: list[int], sampling: Mapping[str, Any], *, rid: str | None = None,
                     extra: Mapping[str, Any] | None = None,
                     ready: Callable[[], Awaitable[object]] | None = None) -> tuple[dict[str, Any], float]:
        """One sequence's answer (SGLang's dict) and its latency in seconds. `sampling` is sent as
        it is, not copied (sequences that share one object send it once): leave it unchanged.
        `rid`: the request's id (default: a new one); `extra`: further body fields of this
        sequence (e.g. its `lora_path`); `ready()`: awaited once the sequence has its place among
        those in flight, before it joins a batch (a background job waits out a pause there; what
        it raises leaves `sample` with nothing sent). `posted` holds the rid once its request has left.

        Raises:
            RequestError: the server refused or failed the request, or answered something else than
                one sample for it.
        """
        async with self.limiter:
            if ready is not None:
                await ready()
            rid = rid or new_rid()
            self.in_flight[rid] = None
            started = time.perf_counter()
            cancelled = False
            try:
                if self.batch:
                    answer: Any = await self._join(ids, sampling, rid, extra)
                else:
                    self.posted.add(rid)
                    answer = await self.client.generate(generate_body(
                        ids, sampling, rid, logprobs=self.logprobs, top_logprobs=self.top_logprobs, per_prompt=extra))
            except asyncio.CancelledError:
                cancelled = True  # still running on the server: left for the caller's abort
                self.given_up.append(rid)
                raise
            finally:
                if not cancelled:
                    self.in_flight.pop(rid, None)
                self.posted.discard(rid)
            latency = time.perf_counter() - started
        if isinstance(answer, list) and len(answer) == 1:
            answer = answer[0]
        if not isinstance(answer, dict):
            raise RequestError(f"/generate answered {type(answer).__name__}, not one sample")
        return answer, latency

    # -- batching ---------------------------------------------------------------------------------
    async def _join(self, ids: list[int], sampling: Mapping[str, Any], rid: str,
                    extra: Mapping[str, Any] | None) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[dict[str, Any]] = loop.create_future()
        batch = self._open
        if batch is None:
            batch = self._open = _Batch()
            self._track(self._send_when_ready(batch))
        batch.items.append((ids, sampling, rid, future, extra))
        batch.last_joined = loop.time()
        self._launch_if_complete(batch)
        return await future

    def leave(self) -> None:
        """A member will send no more (its episode ended): a batch that waits for the others leaves
        now if they have all joined."""
        if self.members is not None:
            self.members -= 1
            if self._open is not None:
                self._launch_if_complete(self._open)

    def _launch_if_complete(self, batch: _Batch) -> None:
        n = len(batch.items)
        if n >= self.max_batch or (self.members is not None and n + self._waiting >= self.members):
            self._launch(batch)

    def _launch(self, batch: _Batch) -> None:
        if self._open is batch:
            self._open = None
        if not batch.launched:
            batch.launched = True
            self._track(self._send_batch(batch))

    async def _send_when_ready(self, batch: _Batch) -> None:
        """Launch `batch` once nothing has joined it for `linger_s`, or once it has lasted
        `max_wait_s`, unless it was launched before (complete)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.max_wait_s
        while self._open is batch:
            wait = min(batch.last_joined + self.linger_s, deadline) - loop.time()
            if wait <= 0:
                break
            await asyncio.sleep(wait)
        self._launch(batch)

    def _track(self, coroutine: Any) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send_batch(self, batch: _Batch) -> None:
        """Send the batch's live sequences as one `/generate` and hand each its answer as it comes;
        a failure of the request is every sequence's still waiting."""
        items = [item for item in batch.items if not item[3].done()]  # a cancelled waiter sends nothing
        if not items:
            return
        self.batches.append(len(items))
        shared = items[0][1]
        params: Any = shared if all(item[1] is shared for item in items) else [item[1] for item in items]
        names = sorted({name for item in items for name in item[4] or ()})
        per_prompt = {name: [(item[4] or {}).get(name) for item in items] for name in names}
        rids = [item[2] for item in items]
        body = generate_body([item[0] for item in items], params, rids, logprobs=self.logprobs,
                             top_logprobs=self.top_logprobs, per_prompt=per_prompt)
        waiting = {i: item[3] for i, item in enumerate(items)}  # not yet handed an answer
        self.posted.update(rids)
        self._waiting += len(waiting)
        try:
            if self.stream:
                await self._stream_answers(body, waiting, rids)
            else:
                self._hand_out(await self.client.generate(body), waiting)
        except BaseException as err:
            for future in waiting.values():
                if not future.done():
                    future.set_exception(err if isinstance(err, Exception) else asyncio.CancelledError())
            if not isinstance(err, Exception):
                raise
        finally:
            self._waiting -= len(waiting)

    def _answer(self, waiting: dict[int, asyncio.Future[dict[str, Any]]], index: int, answer: Any) -> None:
        """Hand item `index` its answer (or the error of an entry that is not one sample)."""
        future = waiting.pop(index)
        self._waiting -= 1
        if future.done():  # its waiter was cancelled
            return
        if isinstance(answer, dict):
            future.set_result(answer)
        else:
            future.set_exception(RequestError(f"/generate answered {type(answer).__name__}, not one sample"))

    def _hand_out(self, answers: Any, waiting: dict[int, asyncio.Future[dict[str, Any]]]) -> None:
        if not isinstance(answers, list) or len(answers) != len(waiting):
            got = f"{len(answers)} answers" if isinstance(answers, list) else type(answers).__name__
            raise RequestError(f"/generate answered {got} for a batch of {len(waiting)} sequences")
        for index, answer in enumerate(answers):
            self._answer(waiting, index, answer)

    async def _stream_answers(self, body: dict[str, Any], waiting: dict[int, asyncio.Future[dict[str, Any]]],
                              rids: Sequence[str]) -> None:
        """Stream the batch; each item's answer is handed out as its last chunk (the one with a
        finish reason) arrives. An item the stream ended without finishing fails with RequestError."""
        size = len(waiting)
        so_far: dict[int, dict[str, Any]] = {}
        async for chunk in self.client.generate_stream(body):
            index = chunk.pop("index", 0) if isinstance(chunk, dict) else None
            if not isinstance(index, int) or not 0 <= index < size:
                raise RequestError(f"/generate streamed a chunk for item {index!r} of a batch of {size}")
            so_far[index] = answer = _merged(so_far.get(index), chunk)
            if self.on_chunk is not None:
                self.on_chunk(rids[index], answer)
            if index in waiting and finish_kind(answer) != "unknown":
                self._answer(waiting, index, answer)
        if waiting:
            raise RequestError(f"the stream of a batch of {size} ended before {len(waiting)} of its items finished")

    # -- aborts and closing -----------------------------------------------------------------------
    async def abort_given_up(self) -> None:
        """Abort on the server the sequences whose waiter was cancelled since the last call (an
        environment that owns its loop and gave one rollout up at its timeout, say): nobody will
        read their answers, and each would otherwise run to its token budget."""
        rids, self.given_up = self.given_up, []
        for rid in rids:
            self.in_flight.pop(rid, None)
        await abort_quietly(self.client, rids)

    async def close(self) -> None:
        """Stop the batches still being sent (after their waiters were cancelled, say)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
