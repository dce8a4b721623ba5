"""Thread mode of `run_calls`: a pool of daemon threads, or rlgen's event loop for `async def` functions.

Owns: `_run_threads`, which fills a run's outcomes from daemon threads that take calls from one
queue, and `_run_on_loop`, which awaits an `async def` function's calls on rlgen's background loop,
`concurrency` at once. A timeout marks the call "timeout" and stops waiting for it, but cannot stop
it: the call goes on in its thread (which is then replaced) until it returns on its own. Async calls
that time out are cancelled, which stops a coroutine that awaits. On Ctrl-C they stop starting
calls, keep what finished, and let the KeyboardInterrupt through.
Knows nothing about worker processes (`_exec_pool.py`), argument checks or `RunInterrupted` (the
entry, `_exec.py`); one call is caught as a worker catches it (`_call_caught`, `_exec_worker.py`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from queue import Empty, SimpleQueue
from typing import TYPE_CHECKING, Any

from ..core import _loop
from ._exec_types import Call, Outcome
from ._exec_worker import _awaited, _call_caught, _error_text, _traceback_text

if TYPE_CHECKING:
    import concurrent.futures


def _thread_timeout_error(timeout: float, coroutine: bool) -> str:
    if coroutine:
        return f"TimeoutError: did not finish within {timeout:g} s; the coroutine was cancelled"
    return (f"TimeoutError: did not finish within {timeout:g} s; thread mode cannot stop a running call, it goes on "
            "in its thread until it returns (mode='process' stops it)")


def _run_threads(fn: Callable[..., Any], calls: list[Call], outcomes: list[Outcome | None], *, timeout: float | None,
                 workers: int, concurrency: int, progress: Callable[[int], None]) -> None:
    """Fill `outcomes`; on Ctrl-C, stop starting calls and let KeyboardInterrupt through."""
    if _loop.is_async(fn):
        _run_on_loop(fn, calls, outcomes, timeout=timeout, concurrency=concurrency, progress=progress)
        return
    todo: SimpleQueue[int] = SimpleQueue()
    for i in range(len(calls)):
        todo.put(i)
    done: SimpleQueue[tuple[int, Outcome]] = SimpleQueue()
    started: dict[int, float] = {}   # call -> monotonic start, written by the threads under `lock`
    abandoned: set[int] = set()      # timed-out calls: their threads exit when they return
    lock = threading.Lock()
    stop = threading.Event()

    def run_coroutine(awaitable: Any) -> Any:
        return _loop.run_sync(_awaited(awaitable))

    def work() -> None:
        while not stop.is_set():
            try:
                i = todo.get_nowait()
            except Empty:
                return
            with lock:
                started[i] = time.monotonic()
            outcome = Outcome(*_call_caught(fn, calls[i].args, calls[i].kwargs, run_coroutine))
            with lock:
                if i in abandoned or stop.is_set():
                    return  # given up on (a replacement took this thread's place) or cancelled
                started.pop(i, None)
            done.put((i, outcome))

    def start_thread() -> None:
        threading.Thread(target=work, name="rlgen-call", daemon=True).start()

    for _ in range(workers):
        start_thread()
    left = len(calls)
    try:
        while left:
            with lock:
                wait = _until_first_deadline(started, timeout)
            finished = 0
            try:
                i, outcome = done.get(timeout=wait)
                if outcomes[i] is None:
                    outcomes[i] = outcome
                    finished += 1
            except Empty:
                pass
            if timeout is not None:
                now = time.monotonic()
                with lock:
                    late = [(i, t0) for i, t0 in started.items() if now - t0 >= timeout]
                    for i, _ in late:
                        abandoned.add(i)
                        del started[i]
                for i, t0 in late:
                    outcomes[i] = Outcome("timeout", error=_thread_timeout_error(timeout, False), seconds=now - t0)
                    finished += 1
                    start_thread()  # the stuck thread no longer counts
            left -= finished
            if finished:
                progress(finished)
    except BaseException:
        stop.set()
        while True:  # keep what finished before the interrupt
            try:
                i, outcome = done.get_nowait()
            except Empty:
                break
            if outcomes[i] is None:
                outcomes[i] = outcome
        raise
    finally:
        with lock:
            stop.set()


def _until_first_deadline(started: Mapping[int, float], timeout: float | None) -> float | None:
    """How long to wait for the next outcome before a running call's deadline passes (a call that
    starts meanwhile has a later deadline than `timeout` from now)."""
    if timeout is None:
        return None
    if not started:
        return timeout
    return max(0.0, min(started.values()) + timeout - time.monotonic())


def _run_on_loop(fn: Callable[..., Any], calls: list[Call], outcomes: list[Outcome | None], *,
                 timeout: float | None, concurrency: int, progress: Callable[[int], None]) -> None:
    """Async functions in thread mode: awaited on rlgen's background loop, `concurrency` at once."""
    import asyncio

    if _loop.in_loop_thread():
        raise RuntimeError("run_calls(mode='thread') was called from rlgen's own loop thread")
    loop = _loop.get_loop()
    done: SimpleQueue[tuple[int, Outcome]] = SimpleQueue()
    started: dict[int, float] = {}  # written on the loop thread under `lock`
    lock = threading.Lock()
    active: dict[int, concurrent.futures.Future[None]] = {}

    async def one(i: int) -> None:
        with lock:
            started[i] = time.monotonic()
        t0 = time.perf_counter()
        try:
            value = await fn(*calls[i].args, **calls[i].kwargs)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            done.put((i, Outcome("error", error=_error_text(exc), traceback=_traceback_text(exc),
                                 seconds=time.perf_counter() - t0)))
            return
        done.put((i, Outcome("ok", value, seconds=time.perf_counter() - t0)))

    following = iter(range(len(calls)))
    left = len(calls)
    try:
        while left:
            while len(active) < concurrency and (i := next(following, None)) is not None:
                active[i] = asyncio.run_coroutine_threadsafe(one(i), loop)
            with lock:
                wait = _until_first_deadline(started, timeout)
            finished = 0
            try:
                i, outcome = done.get(timeout=wait)
                if outcomes[i] is None:
                    outcomes[i] = outcome
                    finished += 1
                with lock:
                    started.pop(i, None)
                active.pop(i, None)
            except Empty:
                pass
            if timeout is not None:
                now = time.monotonic()
                with lock:
                    late = [(i, t0) for i, t0 in started.items() if now - t0 >= timeout and outcomes[i] is None]
                    for i, _ in late:
                        del started[i]
                for i, t0 in late:
                    future = active.pop(i, None)
                    if future is not None:
                        future.cancel()
                    outcomes[i] = Outcome("timeout", error=_thread_timeout_error(timeout, True), seconds=now - t0)
                    finished += 1
            left -= finished
            if finished:
                progress(finished)
    except BaseException:
        while True:
            try:
                i, outcome = done.get_nowait()
            except Empty:
                break
            if outcomes[i] is None:
                outcomes[i] = outcome
        raise
    finally:
        for future in active.values():
            future.cancel()
