"""rlgen.core._loop: sync-over-async on a private loop thread, safe inside a running event loop."""

from __future__ import annotations

import asyncio
import signal
import threading
import time

import pytest

from rlgen.core import _loop


async def answer(x: int, delay: float = 0.0) -> int:
    await asyncio.sleep(delay)
    return x


def test_run_sync_returns_the_coroutine_result() -> None:
    assert _loop.run_sync(answer(42)) == 42


def test_run_sync_works_inside_a_running_event_loop_like_a_notebook_cell() -> None:
    async def cell() -> int:
        return _loop.run_sync(answer(7))  # what generate() does inside Jupyter's loop

    assert asyncio.run(cell()) == 7


def test_run_sync_works_after_nest_asyncio_patched_the_loop() -> None:
    nest_asyncio = pytest.importorskip("nest_asyncio")
    loop = asyncio.new_event_loop()
    try:
        nest_asyncio.apply(loop)

        async def cell() -> int:
            return _loop.run_sync(answer(9))

        assert loop.run_until_complete(cell()) == 9
    finally:
        loop.close()


def test_run_sync_from_several_threads_at_once() -> None:
    results: dict[int, int] = {}

    def worker(i: int) -> None:
        results[i] = _loop.run_sync(answer(i, 0.05))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert results == {i: i for i in range(8)}


def test_exceptions_propagate_to_the_caller() -> None:
    async def boom() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        _loop.run_sync(boom())


@pytest.mark.timeout(20)
def test_ctrl_c_cancels_the_task_and_waits_for_its_cleanup() -> None:
    cleaned = threading.Event()

    async def long() -> None:
        try:
            await asyncio.sleep(30)
        finally:
            await asyncio.sleep(0.2)  # e.g. an /abort_request round trip
            cleaned.set()

    timer = threading.Timer(0.3, lambda: signal.pthread_kill(threading.main_thread().ident, signal.SIGINT))
    timer.start()
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        _loop.run_sync(long())
    assert time.monotonic() - t0 < 5
    assert cleaned.is_set()
    assert _loop.run_sync(answer(1)) == 1  # still usable


def test_calling_run_sync_from_the_loop_thread_is_an_error_not_a_deadlock() -> None:
    async def inner() -> None:
        _loop.run_sync(answer(1))

    with pytest.raises(RuntimeError, match="await the coroutine instead"):
        _loop.run_sync(inner())


def test_is_async_knows_async_functions_and_objects_with_an_async_call() -> None:
    async def coroutine_function() -> None: ...

    def plain() -> None: ...

    class AsyncCall:
        async def __call__(self) -> None: ...

    class PlainCall:
        def __call__(self) -> None: ...

    assert _loop.is_async(coroutine_function) and _loop.is_async(AsyncCall())
    assert not _loop.is_async(plain) and not _loop.is_async(PlainCall()) and not _loop.is_async(lambda: None)
