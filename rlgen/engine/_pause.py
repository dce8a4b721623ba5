"""Pausing the server's generation around a weight update: `Pauses`, one per Engine.

Owns: the Engine's pause gate (an asyncio.Event on rlgen's loop, open while generation may be
sent: a background job's requests wait at it while an update's pause lasts, so none of them meets
the pause and comes back with HTTP 499), the jobs that run (`register` / `unregister`, each told
of every update made while it ran), the pause epoch (counted at every pause: a request that fails
after one may be sent again), the `pausing` context a weight update runs in, and whether the
server's prefix cache may hold prefixes an older version computed (`old_prefixes`).

`pausing(mode)`: the gate closed, `POST /pause_generation {"mode": mode}`, the update (the
block), then, if the served weights changed, every job told (`updated(index, mode)`, on the loop,
before the server continues: what a job's requests had streamed by then was sampled by the old
weights), `POST /continue_generation`, and the gate opened. The pause, the continue and the gate
run to their end even under Ctrl-C (which is raised after them), so no server stays paused and the
Engine stays usable. Only 'abort' leaves the scheduler idle, so only then may the update flush the
prefix cache (`Ticket.flush_cache`): SGLang 0.5.17's scheduler asserts after a flush that found
requests queued or running, and dies (docs: research/off-policy.md §1.4).

Knows nothing about how weights reach the server (`_weights`), jobs' sequences (`_jobs`), or
results: it holds the gate, posts the control requests and counts.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from ..core import _loop
from ..core._errors import RequestError, ServerRequestError
from ._memory import ServerControl
from ._served import ServedWeights

__all__ = ["RESEND_WAIT_S", "Pauses", "Ticket", "UpdateListener", "shielded"]

T = TypeVar("T")
# Seconds a request turned away by a pause waits before it goes again (the gate holds rlgen's own
# requests; another client's pause is waited out this way).
RESEND_WAIT_S = 0.2


class UpdateListener(Protocol):
    """A running job, as the pause sees it: told of each update made while it runs."""

    def updated(self, version: int, mode: str) -> None:
        """The served weights are now version index `version`, updated under pause `mode`; called
        on rlgen's loop before the server continues."""

    async def close(self, reason: str) -> None:
        """The Engine closes: stop, the requests in flight aborted and what was sampled kept."""


@dataclass(frozen=True)
class Ticket:
    """What an update inside `pausing` must do: `mode` the pause (None: none was made) and
    whether it may flush the prefix cache."""

    mode: str | None
    flush_cache: bool


def shielded(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run `coroutine` on rlgen's loop to its end, even when Ctrl-C interrupts the wait (then
    KeyboardInterrupt is raised once it is done): for requests that must not be left half made."""
    future = asyncio.run_coroutine_threadsafe(coroutine, _loop.get_loop())
    interrupted = False
    while True:
        try:
            result = future.result()
            break
        except KeyboardInterrupt:
            interrupted = True
    if interrupted:
        raise KeyboardInterrupt
    return result


class Pauses:
    """The Engine's pauses (see the module docstring)."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.gate.set()
        self.jobs: dict[UpdateListener, None] = {}  # running jobs, in start order
        self.epoch = 0                  # pauses made so far
        self.old_prefixes = False       # the prefix cache may hold prefixes an older version computed
        self.mode: str | None = None    # the pause in force, None while generation runs

    @property
    def paused(self) -> bool:
        return not self.gate.is_set()

    def register(self, job: UpdateListener) -> None:
        self.jobs[job] = None

    def unregister(self, job: UpdateListener) -> None:
        self.jobs.pop(job, None)

    def close_jobs(self, reason: str) -> None:
        """Stop every job that runs (generation and episodes alike: the Engine closes), each to
        its end even under Ctrl-C, so no request is left running on the server."""
        for job in list(self.jobs):
            shielded(job.close(reason))

    async def wait_open(self) -> None:
        """Return once generation may be sent (at once when no pause is in force)."""
        await self.gate.wait()

    async def resend_after(self, err: RequestError, epoch: int) -> bool:
        """Whether a request sent at pause epoch `epoch` that failed with `err` was turned away by a
        pause, and so goes again (True, after `RESEND_WAIT_S`): HTTP 499 (SGLang's answer to a
        request still in its tokenizer when a pause aborts everything), or a stream that failed
        with an abort after a pause began. False: the failure is the request's own."""
        paused_since = self.epoch != epoch
        if not ((isinstance(err, ServerRequestError) and err.status == 499)
                or (paused_since and "abort" in str(err).lower())):
            return False
        await asyncio.sleep(RESEND_WAIT_S)
        return True

    @contextlib.contextmanager
    def pausing(self, mode: str | None, *, control: ServerControl, weights: ServedWeights) -> Iterator[Ticket]:
        """The block (a weight update) under pause `mode` (checked by `core._options.PauseOptions`;
        None: 'abort' while a job runs, else no pause). See the module docstring."""
        if mode is None and self.jobs:
            mode = "abort"
        before = weights.index
        if mode is None:
            yield Ticket(None, flush_cache=True)
            if weights.index != before:
                self.old_prefixes = False  # an unpaused update flushes the cache (when it can)
            return
        ticket = Ticket(mode, flush_cache=mode == "abort")
        shielded(self._close(mode))
        try:
            shielded(control.apost("/pause_generation", {"mode": mode}, what=f"pause_generation(mode={mode!r})"))
            yield ticket
        finally:
            self._resume(control, weights, before, ticket)

    def _resume(self, control: ServerControl, weights: ServedWeights, before: int, ticket: Ticket) -> None:
        """After the block, whatever happened in it: the jobs told of a change, the server
        continued, the gate opened."""
        changed = weights.index != before
        try:
            if changed:
                shielded(self._tell(weights.index, str(ticket.mode)))
                self.old_prefixes = not ticket.flush_cache  # an update under abort flushes the cache
            shielded(control.apost("/continue_generation", {}, what="continue_generation()"))
        finally:
            shielded(self._open())

    async def _close(self, mode: str) -> None:
        self.gate.clear()
        self.mode = mode
        self.epoch += 1

    async def _open(self) -> None:
        self.mode = None
        self.gate.set()

    async def _tell(self, version: int, mode: str) -> None:
        for job in list(self.jobs):
            job.updated(version, mode)

    def flushed(self) -> None:
        """The prefix cache was flushed: no old-weight prefix is left in it."""
        self.old_prefixes = False

    @staticmethod
    def continue_after_attach(control: ServerControl) -> None:
        """Continue a server this Engine reattached to, best effort: a kernel that died during a
        paused update left it paused, and it would hold every request. A server without the
        route (older than SGLang's pause) is left as it is."""
        with contextlib.suppress(RequestError):
            control.post("/continue_generation", {}, what="continue_generation()")
