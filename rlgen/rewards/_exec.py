"""Calling a user's function on many argument sets, safely: in worker processes, threads, or inline.

Owns: `run_calls(fn, calls, mode=...)`, which calls `fn(*call.args, **call.kwargs)` for each `Call`
and reports per call what happened (`Outcome`: ok with the value, an error with its traceback, a
timeout, or cancelled by Ctrl-C); the pool of worker processes behind mode="process", reused from
one `run_calls` to the next (`close_pools()` ends it); and `RunInterrupted`, the KeyboardInterrupt
that carries the outcomes of an interrupted run. Knows nothing about rewards, rollouts, DataFrames
or how the layer above maps rows to calls: the values come back uninspected.

Modes:

- **process** (the default). Worker processes are fresh interpreters (never a fork of the caller,
  which is a Jupyter kernel with threads), each in its own session so that "Interrupt kernel"
  (SIGINT to the kernel's process group) does not reach them. The function travels with
  cloudpickle, so functions, closures and lambdas defined in a notebook cell work. In a worker each
  call runs on the main thread: libraries that time themselves out with `signal.alarm` (math-verify)
  work there, and their alarms are left alone. Calls go out in batches (pipelined, so a worker never
  waits for its next batch) and each call's outcome comes back as soon as it finishes, so the parent
  always knows which call a worker is running and since when. A call that outlives `timeout` is
  stopped by SIGKILLing its worker's process group; that call is marked "timeout", the calls still
  queued on that worker go to another, and a replacement worker starts. A worker that dies (a
  segfault, `os._exit`, the OOM killer) marks the call it was running "error" (with the exit code or
  signal and, for a crash, the Python stack faulthandler wrote), and the run goes on. `async def`
  functions are awaited on a worker's own event loop, up to `concurrency` calls per worker at once.
  Workers never outlive the caller: they exit when its socket closes, are SIGKILLed by the kernel
  when the caller dies (PR_SET_PDEATHSIG on Linux; elsewhere a watcher thread polls the parent pid),
  and are killed at exit (`atexit`).
- **thread**: a pool of daemon threads (or, for `async def` functions, rlgen's background event
  loop). A timeout marks the call "timeout" and stops waiting for it, but cannot stop it: the call
  goes on in its thread (which is then replaced) until it returns on its own. Async calls that time
  out are cancelled, which stops a coroutine that awaits.
- **inline** (for debugging): calls run one by one in the calling thread, with no timeout, and
  exceptions propagate to the caller, where `%debug` can inspect them.

Ctrl-C while waiting (process and thread modes, and inline between or inside calls) stops the run
promptly: process workers that were running calls are killed, and `RunInterrupted` (a
KeyboardInterrupt) is raised with `.outcomes`: what finished, and "cancelled" for the rest.

A worker loads this file by its path, without importing the rlgen package (whose imports cost more
than the worker needs): the module-level imports are the standard library only; rlgen modules and
cloudpickle are imported inside the functions that need them.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import inspect
import linecache
import math
import os
import pickle
import selectors
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from queue import Empty, SimpleQueue
from typing import IO, TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import asyncio
    import concurrent.futures

__all__ = ["Call", "Outcome", "RunInterrupted", "close_pools", "run_calls"]

Mode = Literal["process", "thread", "inline"]
Status = Literal["ok", "error", "timeout", "cancelled"]

# Process mode: how long a worker may take to start and load the function (its imports included)
# before the run fails; an async call's grace after its timeout, for the worker's own cancellation
# to report before the parent kills the worker; how often the parent checks that busy workers are
# alive when their socket cannot tell (a process the function forked may hold it open).
LOAD_TIMEOUT_S = 120.0
ASYNC_GRACE_S = 1.0
LIVENESS_POLL_S = 1.0
# Batches: about this many seconds of calls each (from the calls measured so far), at most this
# many calls, and no more than a quarter of a worker's share of what is left (so the run ends with
# small batches and no worker idles while another has a queue).
BATCH_SECONDS = 0.05
MAX_BATCH = 256
FIRST_BATCH = 8
KILL_WAIT_S = 3.0
_PICKLE = pickle.HIGHEST_PROTOCOL
_HEADER = 8  # bytes of a frame's length prefix


@dataclass(frozen=True)
class Call:
    """One invocation of the function: `fn(*args, **kwargs)`."""

    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Outcome:
    """What one call did.

    Attributes:
        status: "ok", "error" (the function raised, its worker died, or its value or arguments could
            not travel), "timeout", or "cancelled" (Ctrl-C came before it finished).
        value: the return value when ok (not inspected), else None.
        error: "ExcType: message" (e.g. "ZeroDivisionError: division by zero", "WorkerDied: exit
            code -11 (SIGSEGV)"), None when ok.
        traceback: the full traceback text where there is one (for a crashed worker: the Python
            stack faulthandler wrote), else None.
        seconds: the call's own wall time, not counting time queued; for a timeout, the time until
            it was given up.
    """

    status: Status
    value: Any = None
    error: str | None = None
    traceback: str | None = None
    seconds: float = 0.0


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
    return _fill_cancelled(outcomes)


def close_pools() -> None:
    """Stop every idle worker process; the next process-mode run starts fresh ones.

    Workers keep the modules a function imported; a run starts fresh workers by itself when the
    environment, the working directory, `sys.path` or a loaded module's file (outside site-packages
    and the standard library) changed. Call this to free their memory, or after changing something
    that check cannot see.
    """
    with _pool_lock:
        _forget_inherited()
        idle = list(_idle)
        _idle.clear()
    for worker in idle:
        _kill(worker)


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


def _cpu_count() -> int:
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def _no_progress(_: int) -> None:
    pass


def _fill_cancelled(outcomes: list[Outcome | None]) -> list[Outcome]:
    return [o if o is not None else Outcome("cancelled") for o in outcomes]


# ---------------------------------------------------------------------------------------------
# One call, caught (shared by threads and worker processes)


def _is_async(fn: Callable[..., Any]) -> bool:
    # type(fn).__call__: a callable object whose class defines `async def __call__`
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)


def _error_text(exc: BaseException) -> str:
    message = str(exc)
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def _dump_function(fn: Callable[..., Any]) -> bytes:
    """`fn` for a worker: cloudpickle's payload, with each code object's file name kept, plus the
    source lines of files the worker cannot read (a notebook cell's), so that a traceback in the
    worker shows the function's own lines. (cloudpickle >= 3.1.3 renames every code object's file
    to "<dynamic-code>", which leaves tracebacks without source.)"""
    import io
    import marshal
    import types

    import cloudpickle

    files: set[str] = set()

    def note(code: types.CodeType) -> None:
        files.add(code.co_filename)
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                note(const)

    class Pickler(cloudpickle.Pickler):  # type: ignore[misc]
        def reducer_override(self, obj: Any) -> Any:
            if isinstance(obj, types.CodeType):  # marshal keeps co_filename (same interpreter both sides)
                note(obj)
                return marshal.loads, (marshal.dumps(obj),)
            return super().reducer_override(obj)

    buffer = io.BytesIO()
    Pickler(buffer, protocol=_PICKLE).dump(fn)
    sources = {name: lines for name in files if not os.path.exists(name) and (lines := linecache.getlines(name))}
    return pickle.dumps((buffer.getvalue(), sources), protocol=_PICKLE)


def _load_function(payload: bytes) -> Any:
    """The function `_dump_function` sent, its files' source lines registered with linecache first."""
    function, sources = pickle.loads(payload)
    for name, lines in sources.items():
        linecache.cache[name] = (sum(map(len, lines)), None, lines, name)
    return pickle.loads(function)


def _traceback_text(exc: BaseException) -> str:
    """The traceback without this module's and asyncio's frames above the function's own."""
    tb = exc.__traceback__
    asyncio_dir = os.path.join(os.path.dirname(os.__file__), "asyncio")
    while tb is not None and tb.tb_next is not None and (
            tb.tb_frame.f_code.co_filename == __file__ or tb.tb_frame.f_code.co_filename.startswith(asyncio_dir)):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def _call_caught(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any],
                 run_coroutine: Callable[[Any], Any]) -> Outcome:
    """Call `fn`, catching everything it raises; a coroutine it returns is run by `run_coroutine`."""
    t0 = time.perf_counter()
    try:
        value = fn(*args, **kwargs)
        if inspect.isawaitable(value):
            value = run_coroutine(value)
    except BaseException as exc:  # SystemExit and the like too: one call must not end the worker
        return Outcome("error", error=_error_text(exc), traceback=_traceback_text(exc),
                       seconds=time.perf_counter() - t0)
    return Outcome("ok", value, seconds=time.perf_counter() - t0)


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


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


# ---------------------------------------------------------------------------------------------
# Threads


def _thread_timeout_error(timeout: float, coroutine: bool) -> str:
    if coroutine:
        return f"TimeoutError: did not finish within {timeout:g} s; the coroutine was cancelled"
    return (f"TimeoutError: did not finish within {timeout:g} s; thread mode cannot stop a running call, it goes on "
            "in its thread until it returns (mode='process' stops it)")


def _run_threads(fn: Callable[..., Any], calls: list[Call], outcomes: list[Outcome | None], *, timeout: float | None,
                 workers: int, concurrency: int, progress: Callable[[int], None]) -> None:
    """Fill `outcomes`; on Ctrl-C, stop starting calls and let KeyboardInterrupt through."""
    if _is_async(fn):
        _run_on_loop(fn, calls, outcomes, timeout=timeout, concurrency=concurrency, progress=progress)
        return
    from ..core import _loop

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
            outcome = _call_caught(fn, calls[i].args, calls[i].kwargs, run_coroutine)
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

    from ..core import _loop

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


# ---------------------------------------------------------------------------------------------
# Frames: length-prefixed pickles on a stream socket (both sides)


class _Frames:
    """Reassembles frames from the bytes a socket delivers."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._start = 0

    def feed(self, data: bytes) -> None:
        if self._start and self._start >= len(self._buf) // 2:
            del self._buf[:self._start]
            self._start = 0
        self._buf += data

    def pop(self) -> tuple[Any, ...] | None:
        """The next whole message, or None until more bytes arrive."""
        buf, start = self._buf, self._start
        if len(buf) - start < _HEADER:
            return None
        end = start + _HEADER + int.from_bytes(buf[start:start + _HEADER], "big")
        if len(buf) < end:
            return None
        message: tuple[Any, ...] = pickle.loads(buf[start + _HEADER:end])
        self._start = end
        if end == len(buf):
            buf.clear()
            self._start = 0
        return message


def _frame(message: tuple[Any, ...]) -> bytes:
    data = pickle.dumps(message, protocol=_PICKLE)
    return len(data).to_bytes(_HEADER, "big") + data


# ---------------------------------------------------------------------------------------------
# The worker process (runs this file loaded by path: standard library only at module level)
#
# Parent -> worker: ("init", sys_path), ("fn", token, payload, is_async, timeout, concurrency),
#                   ("batch", indices, payload of [(args, kwargs), ...]).
# Worker -> parent: ("loaded", token, error, traceback), ("start", index) for async calls,
#                   ("done", index, status, value_payload, error, traceback, seconds).
# Sync calls run in the order sent, and each one's "done" is sent before the next starts: the parent
# knows that the first call it has not heard back about is the one running.

_BOOT = (
    "import importlib.util, sys\n"
    "spec = importlib.util.spec_from_file_location('_rlgen_reward_worker', sys.argv[1])\n"
    "module = importlib.util.module_from_spec(spec)\n"
    "sys.modules[spec.name] = module\n"
    "spec.loader.exec_module(module)\n"
    "module._worker_main(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))\n"
)


def _die_with_parent(parent_pid: int) -> None:
    """Exit when the parent dies, even by SIGKILL: the kernel's parent-death signal where there is
    one (it fires when the thread that started this process exits: rlgen starts workers from the
    main thread or a long-lived one), else a thread that polls the parent pid."""
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(1, signal.SIGKILL, 0, 0, 0) == 0:  # 1 = PR_SET_PDEATHSIG
            if os.getppid() != parent_pid:  # the parent died before prctl: nobody will signal us
                os._exit(1)
            return

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="rlgen-parent-watch", daemon=True).start()


class _WorkerState:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.frames = _Frames()
        self.fn: Callable[..., Any] | None = None
        self.load_error = "the function is not loaded"
        self.is_async = False
        self.timeout: float | None = None
        self.concurrency = 1
        self.loop: asyncio.AbstractEventLoop | None = None

    def send(self, message: tuple[Any, ...]) -> None:
        self.sock.sendall(_frame(message))

    def recv(self) -> tuple[Any, ...] | None:
        """The next message (blocking), None once the parent closed its end."""
        while (message := self.frames.pop()) is None:
            try:
                data = self.sock.recv(1 << 20)
            except OSError:
                return None
            if not data:
                return None
            self.frames.feed(data)
        return message

    def event_loop(self) -> asyncio.AbstractEventLoop:
        """One loop for the worker's life: clients a function caches stay bound to a live loop."""
        if self.loop is None:
            import asyncio

            self.loop = asyncio.new_event_loop()
        return self.loop

    def load(self, token: int, payload: bytes, is_async: bool, timeout: float | None, concurrency: int) -> None:
        self.fn, self.is_async, self.timeout, self.concurrency = None, is_async, timeout, concurrency
        try:
            self.fn = _load_function(payload)
        except BaseException as exc:
            self.load_error = f"the function could not be loaded: {_error_text(exc)}"
            self.send(("loaded", token, _error_text(exc), _traceback_text(exc)))
            return
        self.send(("loaded", token, None, None))

    def unpack(self, indices: list[int], payload: bytes) -> list[tuple[tuple[Any, ...], Mapping[str, Any]]] | None:
        """The batch's arguments; None (each call reported as an error) when they cannot be loaded."""
        error = self.load_error if self.fn is None else None
        tb = None
        if error is None:
            try:
                items: list[tuple[tuple[Any, ...], Mapping[str, Any]]] = pickle.loads(payload)
                return items
            except BaseException as exc:
                error = f"the arguments could not be loaded in the worker process: {_error_text(exc)}"
                tb = _traceback_text(exc)
        for i in indices:
            self.send(("done", i, "error", None, error, tb, 0.0))
        return None

    def report(self, i: int, outcome: Outcome) -> None:
        value = None
        status, error, tb = outcome.status, outcome.error, outcome.traceback
        if status == "ok":
            value, error = _dump_value(outcome.value)
            if error is not None:
                status = "error"
        self.send(("done", i, status, value, error, tb, outcome.seconds))

    def run_batch(self, indices: list[int], payload: bytes) -> None:
        items = self.unpack(indices, payload)
        if items is None or self.fn is None:
            return
        for i, (args, kwargs) in zip(indices, items):
            self.report(i, _call_caught(self.fn, args, kwargs, self.event_loop().run_until_complete))

    async def serve_async(self, first: tuple[Any, ...]) -> tuple[Any, ...] | None:
        """Await the calls of `first` and of every batch that follows, up to `concurrency` at once;
        return the first message that is not a batch (None at the end of input) once all are done."""
        import asyncio

        loop = asyncio.get_running_loop()
        limit = asyncio.Semaphore(self.concurrency)
        tasks: set[asyncio.Future[None]] = set()
        handoff: asyncio.Future[tuple[Any, ...] | None] = loop.create_future()
        fn = self.fn
        assert fn is not None

        async def one(i: int, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
            async with limit:
                self.send(("start", i))
                t0 = time.perf_counter()
                try:
                    task = asyncio.ensure_future(fn(*args, **kwargs))
                except BaseException as exc:
                    self.report(i, Outcome("error", error=_error_text(exc), traceback=_traceback_text(exc)))
                    return
                finished, _ = await asyncio.wait({task}, timeout=self.timeout)
                if not finished:
                    task.cancel()
                    await asyncio.wait({task})  # a coroutine that ignores cancellation: the parent kills us
                    self.report(i, Outcome("timeout", error=f"TimeoutError: did not finish within {self.timeout:g} s; "
                                           "the coroutine was cancelled", seconds=time.perf_counter() - t0))
                    return
                seconds = time.perf_counter() - t0
                if task.cancelled():
                    self.report(i, Outcome("error", error="CancelledError: the coroutine was cancelled", seconds=seconds))
                    return
                failure = task.exception()
                if failure is not None:
                    self.report(i, Outcome("error", error=_error_text(failure), traceback=_traceback_text(failure),
                                           seconds=seconds))
                else:
                    self.report(i, Outcome("ok", task.result(), seconds=seconds))

        def start(message: tuple[Any, ...]) -> None:
            _, indices, payload = message
            items = self.unpack(indices, payload)
            for i, (args, kwargs) in zip(indices, items or ()):
                task = asyncio.ensure_future(one(i, args, kwargs))
                tasks.add(task)
                task.add_done_callback(tasks.discard)

        def dispatch() -> None:
            while not handoff.done() and (message := self.frames.pop()) is not None:
                if message[0] == "batch":
                    start(message)
                else:
                    finish(message)

        def finish(message: tuple[Any, ...] | None) -> None:
            loop.remove_reader(self.sock.fileno())
            if not handoff.done():
                handoff.set_result(message)

        def on_readable() -> None:
            try:
                data = self.sock.recv(1 << 20)
            except OSError:
                data = b""
            if not data:
                finish(None)
                return
            self.frames.feed(data)
            dispatch()

        start(first)
        dispatch()
        if not handoff.done():
            loop.add_reader(self.sock.fileno(), on_readable)
        following = await handoff
        while tasks:
            await asyncio.wait(set(tasks))
        return following


def _dump_value(value: Any) -> tuple[bytes | None, str | None]:
    """The pickled return value, or (None, an error saying what to return instead)."""
    try:
        return pickle.dumps(value, protocol=_PICKLE), None
    except Exception:
        pass
    try:
        import cloudpickle

        return cloudpickle.dumps(value, protocol=_PICKLE), None
    except Exception as exc:
        return None, (f"PicklingError: the return value (a {type(value).__name__}) could not be sent back from the "
                      f"worker process ({_error_text(exc)}); return plain values (numbers, strings, lists, dicts), "
                      "or use mode='thread'")


def _worker_main(fd: int, parent_pid: int, crash_fd: int) -> None:
    """A worker process: serve the parent's messages until its socket closes. A fatal error (a
    segfault) writes the Python stack to `crash_fd`, an unnamed file the parent reads."""
    _die_with_parent(parent_pid)
    faulthandler.enable(crash_fd, all_threads=True)
    state = _WorkerState(socket.socket(fileno=fd))
    message = state.recv()
    while message is not None:
        kind = message[0]
        if kind == "init":
            sys.path[:] = message[1]
        elif kind == "fn":
            state.load(*message[1:])
        elif kind == "batch" and state.is_async and state.fn is not None:
            message = state.event_loop().run_until_complete(state.serve_async(message))
            continue
        elif kind == "batch":
            state.run_batch(message[1], message[2])
        message = state.recv()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(0)  # no interpreter teardown: a library's non-daemon thread must not keep the worker alive


# ---------------------------------------------------------------------------------------------
# The parent's side: workers and the pool


@dataclass(eq=False)
class _Worker:
    proc: subprocess.Popen[bytes]
    sock: socket.socket
    crash_log: IO[bytes]  # unnamed: it goes when the parent and the worker have both closed it
    key: tuple[Any, ...]
    owner_pid: int = field(default_factory=os.getpid)  # a forked copy of the owner must leave it alone
    frames: _Frames = field(default_factory=_Frames)
    out: bytearray = field(default_factory=bytearray)
    # per run
    loaded: bool = False
    load_deadline: float = 0.0
    sent: dict[int, None] = field(default_factory=dict)      # calls sent and not yet reported, in order
    running: dict[int, float] = field(default_factory=dict)  # calls running -> monotonic start, as seen here
    dead: bool = False

    def reset(self) -> None:
        self.loaded, self.dead = False, False
        self.sent.clear()
        self.running.clear()
        self.load_deadline = time.monotonic() + LOAD_TIMEOUT_S

    def queue(self, message: tuple[Any, ...]) -> None:
        self.out += _frame(message)

    def flush(self) -> None:
        """Send what the socket takes now (the parent never blocks on a worker); raises OSError if it is gone."""
        while self.out:
            try:
                sent = self.sock.send(self.out)
            except (BlockingIOError, InterruptedError):
                return
            del self.out[:sent]


_pool_lock = threading.Lock()
_idle: list[_Worker] = []
_live: set[_Worker] = set()  # every worker not yet reaped: atexit kills them


def _pool_key() -> tuple[Any, ...]:
    """What a worker inherited when it started: a worker is reused only while all of it still holds."""
    return (sys.executable, os.getcwd(), tuple(sys.path), hash(frozenset(os.environ.items())), _user_modules())


def _user_modules() -> frozenset[tuple[str, float]]:
    """(file, mtime) of loaded modules outside the standard library and site-packages: a worker that
    imported one of them before it was edited would run the old code."""
    paths = sysconfig.get_paths()
    installed = tuple({os.path.realpath(paths[k]) for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths})
    stamps = set()
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if not isinstance(path, str) or path.startswith(installed):
            continue
        with contextlib.suppress(OSError):
            stamps.add((path, os.stat(path).st_mtime))
    return frozenset(stamps)


def _checkout(key: tuple[Any, ...], count: int) -> list[_Worker]:
    """Up to `count` idle workers started with this key (the run starts the rest). Idle workers
    with another key are stopped."""
    with _pool_lock:
        _forget_inherited()
        stale = [w for w in _idle if w.key != key or w.proc.poll() is not None]
        mine = [w for w in _idle if w not in stale][:count]
        _idle[:] = [w for w in _idle if w not in stale and w not in mine]
    for worker in stale:
        _kill(worker)
    return mine


def _forget_inherited() -> None:
    """In a forked copy of the owner (multiprocessing's fork): drop the owner's workers unharmed."""
    if any(w.owner_pid != os.getpid() for w in _live):
        _idle[:] = [w for w in _idle if w.owner_pid == os.getpid()]
        for worker in [w for w in _live if w.owner_pid != os.getpid()]:
            _live.discard(worker)


def _checkin(workers: list[_Worker]) -> None:
    """Keep a run's healthy workers for the next run: as many as it had, or as there are CPUs,
    whichever is more (runs from several threads at once do not leave their sum behind)."""
    with _pool_lock:
        _idle.extend(w for w in workers if not w.dead and not w.sent and not w.out and w.proc.poll() is None)
        keep = max(_cpu_count(), len(workers))
        extra = _idle[:-keep] if len(_idle) > keep else []
        del _idle[:len(extra)]
    for worker in extra:
        _kill(worker)


def _spawn(key: tuple[Any, ...]) -> _Worker:
    from ..server._process_tree import _popen_from_long_lived_thread

    mine, theirs = socket.socketpair()
    crash_log = tempfile.TemporaryFile()  # noqa: SIM115 - open for the worker's life, closed by _kill
    try:
        cmd = [sys.executable, "-c", _BOOT, os.path.abspath(__file__), str(theirs.fileno()), str(os.getpid()),
               str(crash_log.fileno())]
        proc = _popen_from_long_lived_thread(cmd, dict(
            stdin=subprocess.DEVNULL,
            pass_fds=(theirs.fileno(), crash_log.fileno()),
            start_new_session=True,  # out of the kernel's process group: "Interrupt kernel" misses it
            close_fds=True,
        ))
    except BaseException as exc:
        mine.close()
        crash_log.close()
        if isinstance(exc, Exception):
            raise RuntimeError(f"could not start a worker process ({sys.executable}): {_error_text(exc)}") from exc
        raise
    finally:
        theirs.close()
    mine.setblocking(False)
    worker = _Worker(proc, mine, crash_log, key)
    worker.queue(("init", list(sys.path)))
    with _pool_lock:
        _live.add(worker)
    return worker


def _kill(worker: _Worker) -> None:
    """SIGKILL the worker's process group (it is its session's leader: what the function started
    without leaving the group goes too) and reap it."""
    worker.dead = True
    with contextlib.suppress(OSError):
        worker.sock.close()
    if worker.proc.poll() is None:  # not reaped yet: its pid, and so its group id, cannot be reused
        with contextlib.suppress(OSError):
            os.killpg(worker.proc.pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            worker.proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        worker.proc.wait(KILL_WAIT_S)
    worker.crash_log.close()
    with _pool_lock:
        _live.discard(worker)


def _kill_all() -> None:
    with _pool_lock:
        _forget_inherited()
        workers = list(_live)
        _idle.clear()
    for worker in workers:
        _kill(worker)


atexit.register(_kill_all)


def _exit_text(returncode: int | None) -> str:
    if returncode is None:
        return "exit code unknown"
    if returncode < 0:
        try:
            return f"exit code {returncode} ({signal.Signals(-returncode).name})"
        except ValueError:
            return f"exit code {returncode}"
    return f"exit code {returncode}"


def _crash_text(worker: _Worker) -> str | None:
    try:
        text = os.pread(worker.crash_log.fileno(), 1 << 20, 0).decode(errors="replace").strip()
    except (OSError, ValueError):
        return None
    return text or None


# ---------------------------------------------------------------------------------------------
# A process-mode run


class _ProcessRun:
    def __init__(self, fn: Callable[..., Any], calls: list[Call], outcomes: list[Outcome | None], *,
                 timeout: float | None, workers: int, batch_size: int | None, concurrency: int,
                 progress: Callable[[int], None]) -> None:
        try:
            payload = _dump_function(fn)
        except Exception as exc:
            raise TypeError(f"fn cannot be sent to a worker process ({_error_text(exc)}). Create locks, clients and "
                            "open files inside the function instead of capturing them, or use mode='thread'") from exc
        self.calls, self.outcomes, self.progress = calls, outcomes, progress
        self.timeout, self.workers, self.batch_size = timeout, workers, batch_size
        self.is_async = _is_async(fn)
        self.concurrency = concurrency
        self.token = time.monotonic_ns()
        self.fn_message = ("fn", self.token, payload, self.is_async, timeout, concurrency)
        self.pending: deque[int] = deque(range(len(calls)))
        self.left = len(calls)
        self.seconds_sum, self.seconds_n = 0.0, 0
        self.key = _pool_key()
        self.team: list[_Worker] = []
        self.selector = selectors.DefaultSelector()
        # async calls get a grace period for the worker's own cancellation to report first
        self.limit = None if timeout is None else timeout + (ASYNC_GRACE_S if self.is_async else 0.0)

    # -- the loop

    def run(self) -> None:
        try:
            for worker in _checkout(self.key, self.workers):
                self.enlist(worker)
            while len(self.team) < self.workers:
                self.enlist(_spawn(self.key))
            last_poll = time.monotonic()
            while self.left:
                self.refill()
                events = self.selector.select(self.wait())
                finished = 0
                for key, mask in events:
                    worker = key.data
                    if worker.dead:
                        continue
                    if mask & selectors.EVENT_WRITE:
                        self.flush(worker)
                    if mask & selectors.EVENT_READ and not worker.dead:
                        finished += self.read(worker)
                now = time.monotonic()
                finished += self.expire(now)
                if now - last_poll >= LIVENESS_POLL_S:
                    last_poll = now
                    for worker in list(self.team):
                        if worker.sent and worker.proc.poll() is not None:
                            finished += self.read(worker, exited=True)
                self.left -= finished
                if finished:
                    self.progress(finished)
        except KeyboardInterrupt:
            self.keep_what_arrived()
            raise
        finally:
            self.end()

    def wait(self) -> float | None:
        """Seconds until the next deadline (None: none), capped for the liveness poll while busy."""
        now = time.monotonic()
        deadlines = []
        for worker in self.team:
            if not worker.loaded:
                deadlines.append(worker.load_deadline)
            if self.limit is not None:
                deadlines.extend(t0 + self.limit for t0 in worker.running.values())
            if worker.sent:
                deadlines.append(now + LIVENESS_POLL_S)
        return max(0.0, min(deadlines) - now) if deadlines else None

    def enlist(self, worker: _Worker) -> None:
        worker.reset()
        worker.queue(self.fn_message)
        self.team.append(worker)
        self.selector.register(worker.sock, selectors.EVENT_READ, worker)
        self.flush(worker)

    def end(self) -> None:
        """Kill the workers still running calls (after an interrupt or an error); keep the others."""
        for worker in self.team:
            if worker.sent and not worker.dead:
                _kill(worker)
        with contextlib.suppress(Exception):
            self.selector.close()
        _checkin(self.team)

    # -- sending

    def next_batch_size(self) -> int:
        if self.batch_size is not None:
            return self.batch_size
        share = math.ceil(len(self.pending) / (4 * max(1, len(self.team))))
        by_time = FIRST_BATCH if not self.seconds_n else int(BATCH_SECONDS / max(self.seconds_sum / self.seconds_n, 1e-7))
        return max(1, min(MAX_BATCH, share, by_time))

    def refill(self) -> None:
        """Keep every worker's queue above half a batch (plus `concurrency` for async calls), so it
        never waits for its next batch."""
        for worker in self.team:
            while self.pending and not worker.dead:
                size = self.next_batch_size()
                if len(worker.sent) > size // 2 + (self.concurrency if self.is_async else 0):
                    break
                self.send_batch(worker, [self.pending.popleft() for _ in range(min(size, len(self.pending)))])

    def send_batch(self, worker: _Worker, indices: list[int]) -> None:
        items = [(self.calls[i].args, dict(self.calls[i].kwargs)) for i in indices]
        try:
            payload = pickle.dumps(items, protocol=_PICKLE)
        except Exception:
            payload, indices = self.dump_each(indices)
        if not indices:
            return
        for i in indices:
            worker.sent[i] = None
        if worker.loaded and not self.is_async and len(worker.running) == 0:
            worker.running[indices[0]] = time.monotonic()
        worker.queue(("batch", indices, payload))
        self.flush(worker)

    def dump_each(self, indices: list[int]) -> tuple[bytes, list[int]]:
        """cloudpickle, call by call: those that cannot be sent are errors, the rest go."""
        import cloudpickle

        kept, items = [], []
        for i in indices:
            item = (self.calls[i].args, dict(self.calls[i].kwargs))
            try:
                cloudpickle.dumps(item, protocol=_PICKLE)
            except Exception as exc:
                self.finish(i, Outcome("error", error=(
                    f"PicklingError: the arguments could not be sent to a worker process ({_error_text(exc)}); pass "
                    "plain values, or use mode='thread'")))
                self.left -= 1
                self.progress(1)
                continue
            kept.append(i)
            items.append(item)
        return cloudpickle.dumps(items, protocol=_PICKLE), kept

    def flush(self, worker: _Worker) -> None:
        try:
            worker.flush()
        except OSError:
            return  # the worker is gone: reading its socket reports that
        with contextlib.suppress(KeyError, ValueError):
            self.selector.modify(worker.sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if worker.out else 0),
                                 worker)

    # -- receiving

    def read(self, worker: _Worker, *, exited: bool = False) -> int:
        """Take what the worker sent; returns the number of calls that finished."""
        closed = exited
        while True:
            try:
                data = worker.sock.recv(1 << 20)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                data = b""
            if not data:
                closed = True
                break
            worker.frames.feed(data)
            if len(data) < 1 << 20:
                break
        finished = 0
        while (message := worker.frames.pop()) is not None:
            finished += self.on_message(worker, message)
        if closed:
            finished += self.on_death(worker)
        return finished

    def on_message(self, worker: _Worker, message: tuple[Any, ...]) -> int:
        kind = message[0]
        if kind == "loaded":
            _, token, error, tb = message
            if token != self.token:
                return 0  # from an earlier run that ended before the worker answered
            if error is not None:
                raise TypeError(f"fn could not be loaded in a worker process: {error}. Define it in a module the "
                                f"workers can import, or in the notebook; or use mode='thread'.\n{tb}")
            worker.loaded = True
            if worker.sent and not self.is_async:
                worker.running[next(iter(worker.sent))] = time.monotonic()
            return 0
        if kind == "start":
            if message[1] in worker.sent:
                worker.running[message[1]] = time.monotonic()
            return 0
        _, i, status, value_payload, error, tb, seconds = message
        if i not in worker.sent:
            return 0
        del worker.sent[i]
        worker.running.pop(i, None)
        if worker.sent and not self.is_async and not worker.running:
            worker.running[next(iter(worker.sent))] = time.monotonic()
        value = None
        if status == "ok" and value_payload is not None:
            try:
                value = pickle.loads(value_payload)
            except Exception as exc:
                status, error, tb = "error", (
                    f"UnpicklingError: the return value could not be read back in this process ({_error_text(exc)}); "
                    "return plain values (numbers, strings, lists, dicts)"), None
        self.seconds_sum += seconds
        self.seconds_n += 1
        return self.finish(i, Outcome(status, value, error, tb, seconds))

    def finish(self, i: int, outcome: Outcome) -> int:
        if self.outcomes[i] is not None:
            return 0
        self.outcomes[i] = outcome
        return 1

    # -- workers that die or time out

    def on_death(self, worker: _Worker) -> int:
        was_loaded = worker.loaded
        self.retire(worker)
        with contextlib.suppress(subprocess.TimeoutExpired):
            worker.proc.wait(KILL_WAIT_S)
        exit_text = _exit_text(worker.proc.returncode)
        crash = _crash_text(worker)
        if not was_loaded:
            _kill(worker)
            raise RuntimeError(f"a worker process exited ({exit_text}) before it had loaded the function"
                               + (f":\n{crash}" if crash else ""))
        now = time.monotonic()
        finished = 0
        for i, t0 in worker.running.items():
            finished += self.finish(i, Outcome("error", error=f"WorkerDied: {exit_text}", traceback=crash,
                                               seconds=now - t0))
        self.requeue(worker)
        _kill(worker)
        self.replace()
        return finished

    def expire(self, now: float) -> int:
        finished = 0
        for worker in list(self.team):
            if not worker.loaded and now >= worker.load_deadline:
                raise RuntimeError(f"a worker process did not start and load the function within {LOAD_TIMEOUT_S:g} s")
            if self.limit is None:
                continue
            late = {i: t0 for i, t0 in worker.running.items() if now >= t0 + self.limit}
            if not late:
                continue
            self.retire(worker)
            _kill(worker)
            for i, t0 in late.items():
                finished += self.finish(i, Outcome("timeout", error=(
                    f"TimeoutError: did not finish within {self.timeout:g} s; its worker process was killed"),
                    seconds=now - t0))
                worker.running.pop(i)
            self.requeue(worker)
            self.replace()
        return finished

    def retire(self, worker: _Worker) -> None:
        worker.dead = True
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(worker.sock)
        self.team.remove(worker)

    def requeue(self, worker: _Worker) -> None:
        """Put the calls a retired worker had not finished first in line for the others."""
        rest = [i for i in worker.sent if i not in worker.running and self.outcomes[i] is None]
        worker.sent.clear()
        worker.running.clear()
        self.pending.extendleft(reversed(rest))

    def replace(self) -> None:
        if self.pending and len(self.team) < self.workers:
            self.enlist(_spawn(self.key))

    def keep_what_arrived(self) -> None:
        """After Ctrl-C: the outcomes already in the sockets still count."""
        for worker in list(self.team):
            with contextlib.suppress(Exception):
                while True:
                    data = worker.sock.recv(1 << 20)
                    if not data:
                        break
                    worker.frames.feed(data)
            with contextlib.suppress(Exception):
                while (message := worker.frames.pop()) is not None:
                    if message[0] == "done":
                        self.on_message(worker, message)
