"""SGLang 0.5.17's pause and continue, on the HTTP side of the CPU backend: the gate that new
/generate requests wait at, and what an abort does to requests that have not reached the scheduler.

Owns: `PauseGate`: whether generation is paused and in which mode, and the lock that pause,
continue and weight updates take to change or read that (SGLang's `is_pause_cond`); the requests
held at the gate while paused (held, not refused: they go on after /continue_generation); a
`Ticket` for every /generate that has not yet handed its jobs to the scheduler, which an abort
marks (SGLang's `ReqState.abort_requested`: such a request ends with `RequestAborted`, HTTP 499,
when it passes the gate or just before it submits); the count of requests past the gate (SGLang's
`model_update_lock` readers), which a pause in "abort" mode waits to see reach zero (`drain`).
Knows nothing about the runner, jobs, tensors or response bodies: the routes (`_app`) abort the
scheduler's requests, pause and resume its stepping (`Runner.pause`), and answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

__all__ = ["PauseGate", "RequestAborted", "Ticket"]

# A pause in "abort" mode aborts everything again this often while requests are still in flight
# (TokenizerManager.pause_generation: abort_request(abort_all=True), then sleep 1 s, until no
# request holds the model_update_lock).
_ABORT_RETRY_S = 1.0


class RequestAborted(ValueError):
    """SGLang's RequestAbortedError: a request aborted before it reached the scheduler (HTTP 499)."""

    status_code = 499


@dataclass(eq=False)
class Ticket:
    """One /generate on its way to the scheduler, under the rids its body names."""

    rids: tuple[str, ...]
    aborted_rid: str | None = None

    def check(self) -> None:
        """Raise RequestAborted if an abort marked this request (SGLang's message)."""
        if self.aborted_rid is not None:
            raise RequestAborted(f"Request {self.aborted_rid} was aborted")


class PauseGate:
    """The pause state of the HTTP layer; every method runs on the event loop."""

    def __init__(self) -> None:
        # None, or the mode of the pause in effect: "abort", "retract" or "in_place".
        self.mode: str | None = None
        # Held by pause, continue, and a weight update while it reads `paused` (and, when paused,
        # while it runs: a continue does not race it).
        self.lock = asyncio.Lock()
        self._opened = asyncio.Event()
        self._opened.set()
        self._tickets: set[Ticket] = set()
        self._past = 0
        self._none_past = asyncio.Event()
        self._none_past.set()

    @property
    def paused(self) -> bool:
        return self.mode is not None

    def close(self, mode: str) -> None:
        """Pause: requests that arrive from now on wait at the gate."""
        self.mode = mode
        self._opened.clear()

    def open(self) -> None:
        """Continue: the requests held at the gate go on."""
        self.mode = None
        self._opened.set()

    async def wait_open(self, timeout: float) -> bool:
        """Whether the gate is open, waiting up to `timeout` seconds for it."""
        try:
            await asyncio.wait_for(self._wait_open(), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    async def _wait_open(self) -> None:
        while self.paused:  # re-checked: a pause may close it again before this wakes
            await self._opened.wait()

    @contextlib.asynccontextmanager
    async def passage(self, rids: tuple[str, ...]) -> AsyncIterator[Ticket]:
        """A /generate's way through: held while paused, then counted as past the gate until the
        block ends (its answer is written). Raises RequestAborted if an abort marked it while it
        was held; the ticket's `check` tells whether one marked it later, before it submitted."""
        ticket = Ticket(rids)
        self._tickets.add(ticket)
        try:
            await self._wait_open()
            ticket.check()
            self._past += 1
            self._none_past.clear()
            try:
                yield ticket
            finally:
                self._past -= 1
                if not self._past:
                    self._none_past.set()
        finally:
            self._tickets.discard(ticket)

    def mark_aborted(self, rid: str | None) -> None:
        """The requests with this rid (None: all) that have not reached the scheduler will end with
        RequestAborted. A request without a rid is named by a fresh one, as SGLang names it."""
        for ticket in self._tickets:
            if rid is None:
                ticket.aborted_rid = ticket.rids[0] if ticket.rids else uuid.uuid4().hex
            elif rid in ticket.rids:
                ticket.aborted_rid = rid

    async def drain(self, abort_all: Callable[[], None]) -> None:
        """A pause in "abort" mode: call `abort_all`, again every second, until no request is past
        the gate, so that every in-flight request has been answered. The last call also marks the
        requests held at the gate by then: they get 499 once it opens."""
        while True:
            abort_all()
            if not self._past:
                return
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._none_past.wait(), _ABORT_RETRY_S)
