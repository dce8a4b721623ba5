"""A background job as it runs on rlgen's loop: `JobRun`, its samples grouped by prompt (`Group`).

Owns: one task per unfinished sample, all through one `client._sender.Sender` (batched and
streamed: each sample is answered when its own request ends, never at its batch's end), at most
as many samples in flight as generate() would keep. A sample's request waits at the Engine's pause
gate (`_pause.Pauses`) while a weight update's pause lasts; an answer a pause ended (`abort`) is
continued as the same sequence (`client._continuation.Continued`: prompt + the tokens so far, as
ids); a request the pause turned away (HTTP 499, or a stream that failed with an abort after a
pause began) is sent again; the tokens each request has streamed (`on_chunk`) are what a weight
update made while it is in flight records as sampled by the old weights (`updated`). Stopping
samples (`stop`: a cancel, or `result(rest="recycle")`) aborts their requests on the server and
keeps what they had sampled. Progress counts (samples and groups done, tokens) are read from any
thread; `changed` is set at every change.

Knows nothing about the handle users hold (`_jobs.GenerationJob`), results, or how weights are
pushed: it hears of updates through `updated`, which `_pause` calls on the loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..client._answer import read_answer, sampled_ids
from ..client._continuation import Boundary, Continued, Segment
from ..client._http import Client
from ..client._sender import Sender, abort_quietly, new_rid
from ..core._errors import RequestError
from ._pause import Pauses
from ._served import ServedWeights

__all__ = ["Group", "JobRun"]

# How long `stop` keeps aborting requests that are still in flight before it gives up on them.
_STOP_LIMIT_S = 30.0


@dataclass
class Group:
    """A prompt's `n` samples, and what its rows show: the prompt (ids, text, chat messages), its
    per-prompt data, its LoRA adapter. `taken`: handed over by `result()`, or recycled."""

    prompt_ids: list[int]
    samples: list[Continued]
    text: str | None = None
    chat: list[dict[str, Any]] | None = None
    data: dict[str, Any] = field(default_factory=dict)
    adapter: str | None = None
    taken: bool = False

    @property
    def done(self) -> bool:
        return all(s.done for s in self.samples)


class JobRun:
    """The job on rlgen's loop (see the module docstring). `main()` runs it to its end."""

    def __init__(self, groups: list[Group], *, client: Client, pauses: Pauses, weights: ServedWeights,
                 decode: Callable[[list[int], bool], str], max_in_flight: int, max_batch: int, logprobs: bool,
                 top_logprobs: int) -> None:
        self.groups, self.client, self.pauses, self.weights, self.decode = groups, client, pauses, weights, decode
        self.samples = [s for g in groups for s in g.samples]
        self.sender = Sender(client, max_in_flight=max_in_flight, max_batch=max_batch, logprobs=logprobs,
                             top_logprobs=top_logprobs, members=sum(not s.done for s in self.samples),
                             on_chunk=self._chunk)
        self.live: dict[str, Continued] = {}   # rid -> the sample whose request it is, while in flight
        self.received: dict[str, int] = {}     # rid -> its tokens streamed so far
        self.stopping: set[int] = set()        # id() of the samples asked to stop
        self._stop_event: asyncio.Event | None = None
        self.changed = threading.Event()       # set at every change (waiters in other threads poll it)
        self.failure: BaseException | None = None
        self.finished = False
        self.cancelled = False
        self._tasks: dict[int, asyncio.Future[None]] = {}  # id() of a sample -> its task

    # -- progress (any thread) ------------------------------------------------------------------
    @property
    def done(self) -> int:
        return sum(s.done for s in self.samples)

    @property
    def groups_done(self) -> int:
        return sum(g.done for g in self.groups)

    @property
    def tokens(self) -> int:
        """Tokens sampled so far: the samples' finished segments, and what the requests in flight
        have streamed (a lower bound: a request streams its first token's chunk and its last, unless
        `stream_interval` asks for more). Read from other threads: `list()` copies the dict's values in
        one step under the GIL, where iterating it could meet the loop thread's change."""
        return sum(len(s.ids) for s in self.samples) + sum(list(self.received.values()))

    # -- the pause's side (on the loop) ---------------------------------------------------------
    def updated(self, version: int, mode: str) -> None:
        """A weight update made version index `version` under pause `mode` while this job ran:
        each request in flight records how many of its tokens had arrived (sampled before it)."""
        for rid, sample in self.live.items():
            segment = sample.in_flight
            if segment is not None and segment.rid == rid:
                sent = rid in self.sender.posted  # else it waits to join a batch: all its tokens are new
                segment.boundaries.append(Boundary(self.received.get(rid, 0), version, mode if sent else "unsent"))
        self.changed.set()

    def _chunk(self, rid: str, answer: dict[str, Any]) -> None:
        if rid in self.live:
            self.received[rid] = len(sampled_ids(answer))

    # -- running ------------------------------------------------------------------------------------
    async def main(self) -> None:
        """Run every unfinished sample to its end (or until it is stopped)."""
        self._stop_event = asyncio.Event()
        self.pauses.register(self)
        self._tasks = {id(s): asyncio.ensure_future(self._sample(s)) for s in self.samples if not s.done}
        try:
            await asyncio.gather(*self._tasks.values())
        except BaseException as err:
            self.failure = err
            for task in self._tasks.values():
                task.cancel()
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)
            await abort_quietly(self.client, list(self.live))
            if not isinstance(err, Exception):
                raise
        finally:
            self.pauses.unregister(self)
            await self.sender.close()
            self.finished = True
            self.changed.set()

    async def _sample(self, sample: Continued) -> None:
        try:
            while not sample.done and id(sample) not in self.stopping:
                await self._segment(sample)
        finally:
            self.sender.leave()
            self.changed.set()

    async def _wait_open(self) -> None:
        """Return once the pause gate is open, or this job was asked to stop samples."""
        if self.pauses.gate.is_set():
            return
        assert self._stop_event is not None
        waits = {asyncio.ensure_future(self.pauses.wait_open()), asyncio.ensure_future(self._stop_event.wait())}
        _, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for wait in pending:
            wait.cancel()

    def _ready(self, sample: Continued, segment: Segment) -> Callable[[], Awaitable[None]]:
        """What the sender awaits once `sample` has its place in flight: the pause gate; then the
        segment takes the version and the prefix cache's state of now (raises `_Stopped` instead
        when the sample was asked to stop)."""

        async def ready() -> None:
            await self._wait_open()
            if id(sample) in self.stopping:
                raise _Stopped
            segment.sent_version = self.weights.index
            segment.kv = "old_prefix" if self.pauses.old_prefixes else "fresh"
            segment.boundaries.clear()  # updates made while it waited here came before it
        return ready

    async def _segment(self, sample: Continued) -> None:
        """One request of `sample`: sent, answered, and its tokens kept (or sent again when a pause
        turned it away)."""
        ids, sampling = sample.next_request()
        rid, epoch = new_rid(), self.pauses.epoch
        segment = sample.open(rid, self.weights.index)
        self.live[rid] = sample
        try:
            entry, _ = await self.sender.sample(ids, sampling, rid=rid, extra=sample.extra or None,
                                                ready=self._ready(sample, segment))
        except _Stopped:
            sample.drop_open()
            return
        except RequestError as err:
            if await self.pauses.resend_after(err, epoch):
                sample.drop_open()
            else:
                sample.end({"type": "error", "message": str(err)})
            return
        finally:
            self.live.pop(rid, None)
            self.received.pop(rid, None)
        answer = read_answer(entry)
        if answer.finish == "error" and not answer.ids() and self.pauses.epoch != epoch:
            sample.drop_open()  # a pause turned it away inside a batch that went on
            return
        answered = self.weights.index_of(answer.weight_version, at_least=segment.sent_version)
        sample.close(answer, answered_version=answered, decode=self.decode)

    # -- stopping -------------------------------------------------------------------------------------
    async def close(self, reason: str) -> None:
        """The Engine closes: `cancel`."""
        await self.cancel(reason)

    async def cancel(self, message: str) -> None:
        """Stop every unfinished sample (`stop`), and end each as "abort" with what it sampled."""
        self.cancelled = True
        unfinished = [s for s in self.samples if not s.done]
        await self.stop(unfinished)
        for sample in unfinished:
            if not sample.done:
                sample.end({"type": "abort", "message": message})
        self.changed.set()

    async def stop(self, samples: Iterable[Continued]) -> None:
        """Stop `samples` where they are: their requests in flight aborted on the server (their
        answers, with every token sampled, are kept), none sent again. Returns once none of them
        has a request in flight (after `_STOP_LIMIT_S`, the rest's tasks are cancelled)."""
        asked = {id(s) for s in samples}
        self.stopping |= asked
        if self._stop_event is not None:
            self._stop_event.set()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _STOP_LIMIT_S
        while not self.finished:
            rids = [rid for rid, s in self.live.items() if id(s) in asked]
            if not rids:
                return
            if loop.time() > deadline:
                for key in asked:
                    if key in self._tasks:
                        self._tasks[key].cancel()
                return
            await abort_quietly(self.client, rids)  # again while a request is not at the server yet
            for _ in range(10):
                await asyncio.sleep(0.05)
                if not any(id(s) in asked for s in self.live.values()):
                    return
        self.changed.set()


class _Stopped(Exception):
    """A sample asked to stop before its request left."""
