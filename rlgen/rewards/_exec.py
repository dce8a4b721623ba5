"""Calling a user's function on many argument sets, safely: in worker processes, threads, or inline.

Owns: `run_calls(fn, calls, mode=...)`, which calls `fn(*call.args, **call.kwargs)` for each `Call`
and reports per call what happened (`Outcome`: ok with the value, an error with its traceback, a
timeout, or cancelled by Ctrl-C); the checks of its arguments; the inline runner; and
`RunInterrupted`, the KeyboardInterrupt that carries the outcomes of an interrupted run. The pool of
worker processes behind mode="process" is reused from one `run_calls` to the next (`close_pools()`
ends it). Knows nothing about rewards, rollouts, DataFrames or how the layer above maps rows to
calls: the values come back uninspected.

Modes:

- **process** (the default; `_exec_pool.py` runs it, `_exec_worker.py` is the worker). Worker
  processes are fresh interpreters in their own sessions, out of reach of "Interrupt kernel". The
  function travels with cloudpickle, so functions, closures and lambdas defined in a notebook cell
  work. Each call runs on a worker's main thread (`signal.alarm` works); `async def` functions are
  awaited on a worker's own event loop, up to `concurrency` calls per worker at once. A call that
  outlives `timeout` is stopped by SIGKILLing its worker's process group and marked "timeout"; a
  worker that dies (a segfault, `os._exit`, the OOM killer) marks the call it was running "error";
  either way a replacement starts and the run goes on. Workers never outlive the caller.
- **thread** (`_exec_threads.py`): a pool of daemon threads (or, for `async def` functions, rlgen's
  background event loop). A timeout marks the call "timeout" and stops waiting for it, but cannot
  stop it: the call goes on in its thread (which is then replaced) until it returns on its own.
  Async calls that time out are cancelled, which stops a coroutine that awaits.
- **inline** (for debugging): calls run one by one in the calling thread, with no timeout, and
  exceptions propagate to the caller, where `%debug` can inspect them.

With `give_up_after=N`, a function that timed out on N calls in a row (none ok in between) is
called no more: the run stops as after Ctrl-C, and the calls not finished get status "skipped".

Ctrl-C while waiting (process and thread modes, and inline between or inside calls) stops the run
promptly: process workers that were running calls are killed, and `RunInterrupted` (a
KeyboardInterrupt) is raised with `.outcomes`: what finished, and "cancelled" for the rest.

The job's modules import one way: this entry -> `_exec_threads.py` and `_exec_pool.py` (the
runners) -> `_exec_worker.py` (one call caught, the wire, the worker) and `_exec_types.py` (`Call`,
`Outcome`). `_exec_worker.py` imports no rlgen module at run time: a worker loads it by its path.
"""

from __future__ import annotations

import inspect
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from ._exec_pool import _cpu_count, _ProcessRun, close_pools
from ._exec_threads import _run_threads
from ._exec_types import Call, Mode, Outcome, Status
from ._exec_worker import _awaited

__all__ = ["Call", "Mode", "Outcome", "RunInterrupted", "close_pools", "run_calls"]


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped `run_calls`; `.outcomes` has one Outcome per call, "cancelled" for those that
    did not finish. It is a KeyboardInterrupt, so code that does not look for it stops as usual."""

    def __init__(self, outcomes: list[Outcome]) -> None:
        self.outcomes = outcomes
        done = sum(o.status != "cancelled" for o in outcomes)
        super().__init__(f"interrupted: {done} of {len(outcomes)} calls finished; the rest are marked 'cancelled' "
                         "(see .outcomes)")


def run_calls(
    fn: Callable[..., Any],
    calls: Sequence[Call],
    *,
    mode: Mode = "process",
    timeout: float | None = 30.0,
    workers: int | None = None,
    batch_size: int | None = None,
    concurrency: int = 8,
    on_progress: Callable[[int], None] | None = None,
    give_up_after: int | None = None,
) -> list[Outcome]:
    """Call `fn` once per `Call` and return one `Outcome` per call, in order.

    Args:
        fn: any callable, or an `async def` function (awaited). In process mode it must survive
            cloudpickle (closures over locks, open files or clients do not: create those inside it).
        calls: the argument sets.
        mode: "process" (worker processes; timeouts really stop a call), "thread" (a timeout stops
            waiting, the call goes on in its thread), or "inline" (in this thread, exceptions
            propagate, no timeout). See the module docstring.
        timeout: seconds one call may take (None: no limit). Ignored by "inline".
        workers: processes or threads (default: the CPUs this process may use for "process", that
            plus 4 up to 32 for "thread"). Never more than there are calls.
        batch_size: calls sent to a worker at once in process mode (default: sized from the calls'
            measured time: small for slow calls, up to 256 for fast ones).
        concurrency: for async functions, calls awaited at once: per worker process in process mode,
            in all in thread mode.
        on_progress: called with the number of calls just finished, as they finish (in this thread).
        give_up_after: after this many timeouts in a row (no call ok in between), stop calling `fn`:
            the calls running are stopped as after Ctrl-C and every call not finished gets status
            "skipped" (error "Skipped: stopped after N timeouts in a row"). None: never give up.

    Raises:
        TypeError / ValueError: bad arguments, before anything runs; TypeError also when `fn` cannot
            be pickled for, or loaded in, a worker process.
        RunInterrupted: Ctrl-C; its `.outcomes` keep what finished.
        RuntimeError: a worker process could not start.
        In inline mode, whatever `fn` raises.
    """
    _check(fn, calls, mode=mode, timeout=timeout, workers=workers, batch_size=batch_size, concurrency=concurrency,
           on_progress=on_progress)
    calls = list(calls)
    if not calls:
        return []
    progress = on_progress if on_progress is not None else _no_progress
    if mode == "inline":
        return _run_inline(fn, calls, progress)
    outcomes: list[Outcome | None] = [None] * len(calls)
    if give_up_after is not None and timeout is not None:
        progress = _TimeoutStreak(outcomes, give_up_after, progress)
    try:
        if mode == "thread":
            n = min(len(calls), workers or min(32, _cpu_count() + 4))
            _run_threads(fn, calls, outcomes, timeout=timeout, workers=n, concurrency=concurrency, progress=progress)
        else:
            n = min(len(calls), workers or _cpu_count())
            _ProcessRun(fn, calls, outcomes, timeout=timeout, workers=n, batch_size=batch_size,
                        concurrency=concurrency, progress=progress).run()
    except KeyboardInterrupt:
        raise RunInterrupted(_fill_cancelled(outcomes)) from None
    except _GiveUp as stop:
        skipped = Outcome(cast("Status", "skipped"), error=f"Skipped: stopped after {stop.count} timeouts in a row")
        return [o if o is not None else skipped for o in outcomes]
    return _fill_cancelled(outcomes)


class _GiveUp(Exception):
    """Raised from the progress callback (in the runner's loop) to stop a run that keeps timing out."""

    def __init__(self, count: int) -> None:
        super().__init__(f"{count} timeouts in a row")
        self.count = count


class _TimeoutStreak:
    """Wraps a progress callback: counts timeouts in a row among the calls just finished (in call
    order within one report; an ok call resets the count) and raises _GiveUp at `limit`."""

    def __init__(self, outcomes: list[Outcome | None], limit: int, progress: Callable[[int], None]) -> None:
        self.outcomes, self.limit, self.progress = outcomes, limit, progress
        self.pending = list(range(len(outcomes)))
        self.streak = 0

    def __call__(self, k: int) -> None:
        self.progress(k)
        still = []
        for i in self.pending:
            outcome = self.outcomes[i]
            if outcome is None:
                still.append(i)
            elif outcome.status == "timeout":
                self.streak += 1
            elif outcome.status == "ok":
                self.streak = 0
        self.pending = still
        if self.streak >= self.limit and still:
            raise _GiveUp(self.streak)


# ---------------------------------------------------------------------------------------------
# Checking arguments


def _check(fn: object, calls: object, *, mode: object, timeout: object, workers: object, batch_size: object,
           concurrency: object, on_progress: object) -> None:
    if not callable(fn):
        raise TypeError(f"fn must be a function (or any callable), got {type(fn).__name__}")
    if mode not in ("process", "thread", "inline"):
        raise ValueError(f"mode must be 'process', 'thread' or 'inline', got {mode!r}")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or not timeout > 0 or math.isinf(timeout)):
        raise ValueError(f"timeout must be a finite number of seconds > 0, or None for no limit, got {timeout!r}")
    for name, value in (("workers", workers), ("batch_size", batch_size)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be an integer >= 1, or None for the default, got {value!r}")
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ValueError(f"concurrency must be an integer >= 1, got {concurrency!r}")
    if on_progress is not None and not callable(on_progress):
        raise TypeError(f"on_progress must be callable or None, got {type(on_progress).__name__}")
    if isinstance(calls, (str, bytes)) or not isinstance(calls, Sequence):
        raise TypeError(f"calls must be a sequence of Call, got {type(calls).__name__}")
    for i, call in enumerate(calls):
        if not isinstance(call, Call):
            raise TypeError(f"calls[{i}] is a {type(call).__name__}, not a Call: write Call(args=(...), kwargs={{...}})")
        if not isinstance(call.args, tuple) or not isinstance(call.kwargs, Mapping):
            raise TypeError(f"calls[{i}]: args must be a tuple and kwargs a mapping, got "
                            f"{type(call.args).__name__} and {type(call.kwargs).__name__}")


def _no_progress(_: int) -> None:
    pass


def _fill_cancelled(outcomes: list[Outcome | None]) -> list[Outcome]:
    return [o if o is not None else Outcome("cancelled") for o in outcomes]


# ---------------------------------------------------------------------------------------------
# Inline


def _run_inline(fn: Callable[..., Any], calls: list[Call], progress: Callable[[int], None]) -> list[Outcome]:
    from ..core import _loop

    outcomes: list[Outcome | None] = [None] * len(calls)
    for i, call in enumerate(calls):
        t0 = time.perf_counter()
        try:
            value = fn(*call.args, **call.kwargs)
            if inspect.isawaitable(value):
                value = _loop.run_sync(value if inspect.iscoroutine(value) else _awaited(value))
            outcomes[i] = Outcome("ok", value, seconds=time.perf_counter() - t0)
            progress(1)
        except KeyboardInterrupt as interrupt:
            raise RunInterrupted(_fill_cancelled(outcomes)) from interrupt
    return _fill_cancelled(outcomes)
