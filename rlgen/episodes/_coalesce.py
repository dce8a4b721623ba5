"""Turn requests of many episodes, sent together: one batched `/generate` for the turns that are ready.

Owns: `TurnBatcher`, which takes one episode turn's request at a time (`input_ids`, its sampling
parameters, its rid) and sends the requests that arrive close together as one batched
`/generate` (lists of `input_ids`, `sampling_params` and `rid`, as SGLang takes a batch), then
hands each episode its own answer. A batch leaves when every requester that can still join has
joined (`members`, when the caller says how many there are: the others wait for an answer already
sent, or have left), when no request has joined it for `linger_s`, when it has lasted
`max_wait_s`, or when it holds `max_batch` requests. Requests that share one
sampling-parameters object are sent with it once (SGLang applies a single dict to every prompt
of a batch), not as a list of copies. A `read` hook, when given, turns the batch's answers into
what each waiter gets, in one call (the episodes decode every turn's text at once there). A
requester may hand over work for later (`once_sent`): it runs once the batch's request has left
(its body written: aiohttp writes it from a task of its own), while the server works on it, in
chunks that let an answer through.

Why: every request costs its HTTP round trip and the server's per-request handling, so SGLang
serves one batched request of many prompts much faster than as many requests of one prompt each.
Episodes that run in step (every episode's turn k answered by the same batch, then its environment
step) reach the batcher within milliseconds of each other, so their next turns leave together; the
last of them sends the batch at once, not `linger_s` later, when the batcher knows the members;
what each of them hands over for later (its last turn's bookkeeping) then runs off that path. A
batch's answer comes back when its longest sample finishes, as a `generate()` request's does; on
episodes, batching was still the faster of the two, most with turns ending at EOS (the
measurements: docs/benchmarks.md, "Multi-turn episodes").

Knows nothing about episodes, environments or templates: it posts payloads with a client and
returns answers. Aborting is the caller's (every rid it sends is the caller's to abort).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..client._http import Client
from ..core._errors import RequestError

__all__ = ["TurnBatcher"]

# How many pieces of work handed over for later run between two turns of the loop (each a turn's
# bookkeeping, some tens of microseconds): an answer or a request body waits for one chunk at most.
_LATER_CHUNK = 32


@dataclass
class _Pending:
    items: list[tuple[list[int], Mapping[str, Any], str, asyncio.Future[Any]]] = field(default_factory=list)
    last_joined: float = 0.0  # the loop's time when the last request joined
    later: list[Callable[[], None]] = field(default_factory=list)  # each requester's `once_sent`
    launched: bool = False


class TurnBatcher:
    """Sends turn requests that arrive together as one batched `/generate`; `await generate(...)`
    returns this request's answer (a dict; what `read` made of it, when given), or raises what
    the batch raised. `read(answers)` gets the batch's answers (dicts, checked) and returns one
    item per answer; it must not raise."""

    def __init__(self, client: Client, *, linger_s: float = 0.005, max_wait_s: float = 0.05,
                 max_batch: int = 256, read: Callable[[Sequence[dict[str, Any]]], Sequence[Any]] | None = None,
                 members: int | None = None) -> None:
        self.client, self.read = client, read
        self.linger_s, self.max_wait_s, self.max_batch = linger_s, max_wait_s, max_batch
        # The requesters that may still send (None: unknown, so a batch lingers); `leave()` counts down.
        self.members = members
        self._sent = 0  # requests in batches sent and not yet answered: their requesters cannot join
        self._pending: _Pending | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.batches: list[int] = []   # the size of each batch sent, in order

    async def generate(self, ids: list[int], sampling: Mapping[str, Any], rid: str, *,
                       once_sent: Callable[[], None] | None = None) -> Any:
        """This request's answer; `sampling` is sent as it is (not copied): leave it unchanged.
        `once_sent()` runs once the batch's request has left (or the batch was given up before it
        was sent), while its answer is awaited: work that the request does not need. It must not
        raise."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        pending = self._pending
        if pending is None:
            pending = self._pending = _Pending()
            self._track(self._send_when_ready(pending))
        pending.items.append((ids, sampling, rid, future))
        pending.last_joined = loop.time()
        if once_sent is not None:
            pending.later.append(once_sent)
        self._close_if_complete(pending)
        return await future

    def _track(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def leave(self) -> None:
        """A member will send no more requests (its episode ended): the batch that waits for the
        others leaves now if they have all joined."""
        if self.members is not None:
            self.members -= 1
            pending = self._pending
            if pending is not None:
                self._close_if_complete(pending)

    def _close_if_complete(self, pending: _Pending) -> None:
        """Send `pending` now (`_launch`) when it is full, or when every member that can still join
        has: the others wait for answers of batches already sent."""
        n = len(pending.items)
        if n >= self.max_batch or (self.members is not None and n + self._sent >= self.members):
            self._launch(pending)

    def _launch(self, pending: _Pending) -> None:
        """Close `pending` and send it now, once (its lingering task, at its next look, then finds
        nothing to do)."""
        if self._pending is pending:
            self._pending = None
        if not pending.launched:
            pending.launched = True
            self._track(self._send(pending))

    async def _send_when_ready(self, pending: _Pending) -> None:
        """Send `pending` once nothing has joined it for `linger_s`, or once it has lasted
        `max_wait_s`, unless it was complete (and sent) before. It sleeps to the next of those
        times and looks again (a request that joins only notes the time: hundreds join a batch)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.max_wait_s
        while self._pending is pending:
            wait = min(pending.last_joined + self.linger_s, deadline) - loop.time()
            if wait <= 0:
                break
            await asyncio.sleep(wait)
        self._launch(pending)

    @staticmethod
    async def _run_later(pending: _Pending) -> None:
        """The work handed over for later, run in chunks with a turn of the loop before each: the
        request's first step (queued before this task) makes the task that writes its body, and
        that one, queued before this task's second step, goes out before any of this work runs;
        an answer that comes meanwhile waits for one chunk at most."""
        later, pending.later = pending.later, []
        for start in range(0, len(later), _LATER_CHUNK):
            await asyncio.sleep(0)
            for work in later[start:start + _LATER_CHUNK]:
                work()

    async def _send(self, pending: _Pending) -> None:
        items = [item for item in pending.items if not item[3].done()]  # a cancelled waiter sends nothing
        if not items:
            await self._run_later(pending)
            return
        self.batches.append(len(items))
        shared = items[0][1]
        params: Any = shared if all(s is shared for _, s, _, _ in items) else [s for _, s, _, _ in items]
        payload = {"input_ids": [ids for ids, _, _, _ in items], "sampling_params": params,
                   "return_logprob": True, "rid": [rid for _, _, rid, _ in items]}
        self._sent += len(items)
        request = asyncio.ensure_future(self.client.generate(payload))
        if pending.later:  # after the request has left (see `_run_later`)
            self._track(self._run_later(pending))
        try:
            try:
                answer = await request
            finally:
                self._sent -= len(items)
                if not request.done():
                    request.cancel()
            if not isinstance(answer, list) or len(answer) != len(items):
                got = f"{len(answer)} answers" if isinstance(answer, list) else type(answer).__name__
                raise RequestError(f"/generate answered {got} for a batch of {len(items)} turns")
        except BaseException as err:  # every turn of the batch fails alike (its episodes end request_error)
            for _, _, _, future in items:
                if not future.done():
                    future.set_exception(err if isinstance(err, Exception) else asyncio.CancelledError())
            if not isinstance(err, Exception):
                raise
            return
        samples = [entry for entry in answer if isinstance(entry, dict)]
        made = iter(self.read(samples) if self.read is not None else samples)
        for (_, _, _, future), entry in zip(items, answer):
            if not isinstance(entry, dict):
                if not future.done():
                    future.set_exception(RequestError(f"/generate answered {type(entry).__name__}, not one sample"))
                continue
            item = next(made)
            if not future.done():
                future.set_result(item)

    async def close(self) -> None:
        """Wait for the batches still being sent (after their waiters were cancelled, say)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
