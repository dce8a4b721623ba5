"""A worker process of process mode, and what the parent and its workers share on the wire.

Owns: the worker process (`_worker_main` serves the parent's messages until its socket closes,
`_WorkerState`), its tie to the parent's life (`_die_with_parent`), the frame format both sides
speak (`_Frames`, `_frame`, and the messages listed below), how the function travels
(`_dump_function` in the parent, `_load_function` in the worker) and how a value comes back
(`_dump_value`), `_BOOT` and `_worker_command` (the argv that starts a worker on this very file),
and one call caught (`_call_caught`, `_error_text`, `_traceback_text`), which thread mode shares.
Knows nothing about the pool, batches, deadlines or which worker runs which call (that is the
parent's side, `_exec_pool.py`), nor about `Outcome`: a call's result here is a `_Result`, a tuple
in `Outcome`'s field order.

A worker loads this file by its path (`_BOOT`), in a fresh interpreter, without importing the rlgen
package (whose imports cost more than the worker needs): the module-level imports are the standard
library only, and no rlgen module is imported at run time (loaded by path, this file is no
package's module: a relative import would fail there); cloudpickle is imported inside the
functions that need it. In a worker each call runs on the main thread: libraries that time
themselves out with `signal.alarm` (math-verify) work there, and their alarms are left alone.
`async def` functions are awaited on the worker's own event loop, up to `concurrency` calls at
once; one that outlives its timeout is cancelled there. Workers never outlive the caller: they exit
when its socket closes, and the kernel SIGKILLs them when the caller dies (PR_SET_PDEATHSIG on
Linux; elsewhere a watcher thread polls the parent pid).
"""

from __future__ import annotations

import contextlib
import faulthandler
import inspect
import linecache
import os
import pickle
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:  # never at run time: a worker imports no rlgen module
    import asyncio

    from ._exec_types import Status

_PICKLE = pickle.HIGHEST_PROTOCOL
_HEADER = 8  # bytes of a frame's length prefix
_HERE = os.path.dirname(__file__)


class _Result(NamedTuple):
    """One call's result, in `Outcome`'s field order (`Outcome(*result)`): a worker has no `Outcome`."""

    status: Status
    value: Any = None
    error: str | None = None
    traceback: str | None = None
    seconds: float = 0.0


# ---------------------------------------------------------------------------------------------
# One call, caught, and the function's travel (thread mode, the pool and the workers share them)


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
    """The traceback without run_calls' frames (this file's and its siblings', `_exec*.py`) and
    asyncio's above the function's own."""
    tb = exc.__traceback__
    asyncio_dir = os.path.join(os.path.dirname(os.__file__), "asyncio")
    while tb is not None and tb.tb_next is not None and (
            _is_ours(tb.tb_frame.f_code.co_filename) or tb.tb_frame.f_code.co_filename.startswith(asyncio_dir)):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def _is_ours(filename: str) -> bool:
    return os.path.dirname(filename) == _HERE and os.path.basename(filename).startswith("_exec")


def _call_caught(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any],
                 run_coroutine: Callable[[Any], Any]) -> _Result:
    """Call `fn`, catching everything it raises; a coroutine it returns is run by `run_coroutine`."""
    t0 = time.perf_counter()
    try:
        value = fn(*args, **kwargs)
        if inspect.isawaitable(value):
            value = run_coroutine(value)
    except BaseException as exc:  # SystemExit and the like too: one call must not end the worker
        return _Result("error", error=_error_text(exc), traceback=_traceback_text(exc),
                       seconds=time.perf_counter() - t0)
    return _Result("ok", value, seconds=time.perf_counter() - t0)


async def _awaited(awaitable: Any) -> Any:
    """`awaitable` as a coroutine, for the loops that take only coroutines."""
    return await awaitable


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


def _worker_command(fd: int, crash_fd: int) -> list[str]:
    """The argv that starts a worker: `_BOOT` loads this very file, whose `_worker_main` serves the
    socket `fd` for this process and writes a crash's stack to `crash_fd`."""
    return [sys.executable, "-c", _BOOT, os.path.abspath(__file__), str(fd), str(os.getpid()), str(crash_fd)]


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

    def report(self, i: int, outcome: _Result) -> None:
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
                    self.report(i, _Result("error", error=_error_text(exc), traceback=_traceback_text(exc)))
                    return
                finished, _ = await asyncio.wait({task}, timeout=self.timeout)
                if not finished:
                    task.cancel()
                    await asyncio.wait({task})  # a coroutine that ignores cancellation: the parent kills us
                    self.report(i, _Result("timeout", error=f"TimeoutError: did not finish within {self.timeout:g} s; "
                                           "the coroutine was cancelled", seconds=time.perf_counter() - t0))
                    return
                seconds = time.perf_counter() - t0
                if task.cancelled():
                    self.report(i, _Result("error", error="CancelledError: the coroutine was cancelled", seconds=seconds))
                    return
                failure = task.exception()
                if failure is not None:
                    self.report(i, _Result("error", error=_error_text(failure), traceback=_traceback_text(failure),
                                           seconds=seconds))
                else:
                    self.report(i, _Result("ok", task.result(), seconds=seconds))

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


