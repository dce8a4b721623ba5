"""The background event loop, and sync-over-async that works inside Jupyter.

Owns: one long-lived asyncio loop running in a daemon thread (per process, shared by every
Engine); `run_sync(coro)`, which runs a coroutine there and blocks the calling thread until it
is done; and `iterate(agen)`, which drives an async iterator there and yields its items to the
calling thread one by one; and `is_async(fn)`, whether calling a function makes a coroutine to
await (the rewards' and the environments' runners ask it). Knows nothing about SGLang.

Why: a notebook cell already runs inside the kernel's event loop, so `asyncio.run()` and
`loop.run_until_complete()` fail there ("This event loop is already running"), and patching asyncio
globally (`nest_asyncio`) breaks other libraries. A private loop in its own thread never touches
the caller's loop, works the same from scripts, notebooks, pytest and several threads at once, and
still works where the user has applied `nest_asyncio` (SGLang's docs tell them to). This is the
pattern of jupyter_core's `run_sync`.

Ctrl-C: the calling thread waits on a concurrent future, which SIGINT interrupts at once. The task
on the loop is then cancelled, so that its `finally` blocks (e.g. aborting requests on the server)
run, and `run_sync` waits briefly for them before re-raising KeyboardInterrupt.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import inspect
import queue
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from typing import Any, TypeVar

__all__ = ["get_loop", "is_async", "iterate", "run_sync"]


def is_async(fn: Any) -> bool:
    """Whether calling `fn` makes a coroutine to await: an `async def` function, or an object whose
    class defines `async def __call__`."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)

T = TypeVar("T")

# How long an interrupted call waits for its task's cleanup (e.g. /abort_request) before re-raising.
CANCEL_GRACE_S = 10.0

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None


def get_loop() -> asyncio.AbstractEventLoop:
    """The background loop, started on first use."""
    global _loop, _thread
    with _lock:
        if _loop is None or _loop.is_closed() or _thread is None or not _thread.is_alive():
            loop = asyncio.new_event_loop()
            ready = threading.Event()
            thread = threading.Thread(target=_run_loop, args=(loop, ready), name="rlgen-loop", daemon=True)
            thread.start()
            ready.wait()
            _loop, _thread = loop, thread
        return _loop


def _run_loop(loop: asyncio.AbstractEventLoop, ready: threading.Event) -> None:
    asyncio.set_event_loop(loop)
    loop.call_soon(ready.set)
    loop.run_forever()


def in_loop_thread() -> bool:
    return _thread is not None and threading.current_thread() is _thread


def run_sync(coro: Coroutine[Any, Any, T], *, timeout: float | None = None,
             on_wait: Callable[[], object] | None = None, wait_interval_s: float = 0.25) -> T:
    """Run `coro` on the background loop and return its result, from any non-loop thread.

    While it waits, the calling thread calls `on_wait()` every `wait_interval_s` seconds (e.g. to
    redraw a progress line from the thread that owns the notebook output).

    Raises whatever the coroutine raises; KeyboardInterrupt cancels the coroutine (its cleanup runs
    for up to CANCEL_GRACE_S seconds) and is re-raised; `timeout` raises TimeoutError after
    cancelling likewise.
    """
    if in_loop_thread():
        coro.close()
        raise RuntimeError("run_sync() was called from rlgen's own loop thread; await the coroutine instead")
    loop = get_loop()
    cleaned_up = threading.Event()
    future = asyncio.run_coroutine_threadsafe(_tracked(coro, cleaned_up), loop)
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        while True:
            wait = None if on_wait is None else wait_interval_s
            if deadline is not None:
                left = max(0.0, deadline - time.monotonic())
                wait = left if wait is None else min(wait, left)
            try:
                return future.result(timeout=wait)
            except concurrent.futures.TimeoutError:
                if deadline is not None and time.monotonic() >= deadline:
                    raise
                if on_wait is not None:
                    on_wait()
    except concurrent.futures.TimeoutError:
        future.cancel()
        cleaned_up.wait(CANCEL_GRACE_S)
        raise TimeoutError(f"operation did not finish within {timeout} s") from None
    except BaseException:  # KeyboardInterrupt (and SystemExit) while waiting
        if not future.done():
            future.cancel()
            cleaned_up.wait(CANCEL_GRACE_S)
        raise


def iterate(items: AsyncIterator[T]) -> Iterator[T]:
    """Yield the items of `items` (driven on the background loop) in the calling thread, as they come.

    Leaving the loop early (break, an exception, Ctrl-C, garbage collection of the generator)
    cancels the async iterator on the loop, so that its cleanup runs (e.g. aborting a request on
    the server); an exception it raises is re-raised here.
    """
    pipe: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()

    async def pump() -> None:
        try:
            async for item in items:
                pipe.put(("item", item))
        except BaseException as err:
            pipe.put(("error", err))
            raise
        finally:
            pipe.put(("done", None))

    future = asyncio.run_coroutine_threadsafe(pump(), get_loop())
    try:
        while True:
            kind, value = pipe.get()
            if kind == "done":
                break
            if kind == "error":
                raise value
            yield value
    finally:
        if not future.done():
            future.cancel()
            with contextlib.suppress(BaseException):
                future.exception(timeout=CANCEL_GRACE_S)


async def _tracked(coro: Awaitable[T], done: threading.Event) -> T:
    try:
        return await coro
    finally:
        done.set()


def _shutdown() -> None:
    global _loop
    with _lock:
        loop, _loop = _loop, None
    if loop is not None and not loop.is_closed():
        loop.call_soon_threadsafe(loop.stop)


atexit.register(_shutdown)
